"""Helpers for the hooks tests: tiny models built from configs, and a real local HTTP service."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from hyperwatch.monitor.processes.lifetime import die_with_parent

HERE = Path(__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeService:
    """tests/hooks/fake_service.py in a subprocess: start, SIGKILL, restart on the same port and file."""

    def __init__(self, db: Path, token: str | None = None, json_only: bool = False) -> None:
        self.port = free_port()
        self.db = db
        self.token = token
        self.json_only = json_only
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = [sys.executable, str(HERE / "fake_service.py"), str(self.port), str(self.db)]
        if self.token:
            cmd += ["--token", self.token]
        cmd += ["--json-only"] if self.json_only else []
        self.proc = subprocess.Popen(die_with_parent(cmd), stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def dump(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + "/dump", timeout=10) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[FakeService]:
    svc = FakeService(tmp_path / "service.sqlite")
    svc.start()
    yield svc
    svc.kill()


def wait_until(cond: Any, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


# -- tiny models --
def hf_model(family: str, attn: str = "sdpa", layers: int = 2) -> nn.Module:
    """A tiny Hugging Face causal LM built from a config (no download)."""
    transformers = pytest.importorskip("transformers")
    common: dict[str, Any] = dict(
        vocab_size=96,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        max_position_embeddings=64,
        attn_implementation=attn,
    )
    torch.manual_seed(0)
    if family == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=96,
            n_embd=32,
            n_layer=layers,
            n_head=4,
            n_positions=64,
            attn_implementation=attn,
            bos_token_id=0,
            eos_token_id=0,
        )
        return transformers.GPT2LMHeadModel(cfg)
    gqa = dict(num_key_value_heads=2, intermediate_size=64)
    if family == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, **gqa))
    if family == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common, **gqa))
    if family == "mixtral":
        cfg = transformers.MixtralConfig(**common, **gqa, num_local_experts=4, num_experts_per_tok=2)
        return transformers.MixtralForCausalLM(cfg)
    if family == "qwen2_moe":
        cfg = transformers.Qwen2MoeConfig(
            **common,
            **gqa,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
        )
        return transformers.Qwen2MoeForCausalLM(cfg)
    if family == "olmoe":
        cfg = transformers.OlmoeConfig(**common, **gqa, num_experts=4, num_experts_per_tok=2)
        return transformers.OlmoeForCausalLM(cfg)
    raise ValueError(family)


HF_FAMILIES = ["llama", "qwen2", "gpt2", "mixtral", "qwen2_moe", "olmoe"]
MOE_FAMILIES = {"mixtral", "qwen2_moe", "olmoe"}


def bundled_model(moe: bool = False, depth: int = 2, kernel: str = "auto") -> nn.Module:
    model_mod = pytest.importorskip("hyperwatch.trainer.model")
    cfg = model_mod.ModelConfig(
        depth=depth,
        alpha=16,
        head_dim=8,
        vocab_size=64,
        seq_len=32,
        base_depth=2,
        moe=moe,
        moe_sparsity=2,
        moe_granularity=4,
        attention_kernel=kernel,
    )
    torch.manual_seed(0)
    return model_mod.Transformer(cfg)  # type: ignore[no-any-return]
