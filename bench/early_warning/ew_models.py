"""The models ``bench/early_warning/run.py`` trains: three sources, each built from a config, nothing downloaded.

- ``gpt``: a plain hand-written nanoGPT-style PyTorch model (pre-LayerNorm blocks, SDPA causal
  attention, optional LayerNorm on q and k per head: "QK-norm");
- ``hf``: a Hugging Face ``LlamaForCausalLM`` built from a ``LlamaConfig`` (no QK-norm);
- ``trainer``: the bundled trainer's Transformer-Next (``hyperwatch.trainer.model``), dense or MoE,
  with its own QK-norm, SqrtGate and aux-loss switches.

Every model is trained the same way by the benchmark: AdamW, no gradient clipping (a user's
defaults), cross-entropy on bytes plus an optional z-loss on the LM head's log-partition.
:func:`build` returns the model with a forward that gives (logits, loss without z-loss).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

VOCAB = 256  # raw bytes


@dataclass
class RunSpec:
    """One run of the sweep. ``cell`` groups a scenario's runs of one model source (twins share data)."""

    scenario: str
    source: str  # gpt, hf, trainer
    arm: str  # short label, unique within the cell
    lr: float
    steps: int
    depth: int = 3
    width: int = 64
    qk_norm: bool = True
    z_loss: float = 0.0
    moe: bool = False
    gates: bool = True  # trainer MoE: SqrtGate and the aux loss (gamma 0.1) on, else both off
    lr_bump: tuple[float, float, float] | None = None  # (from, to) as fractions of training, LR factor
    seed: int = 0
    warmup: int = 10
    healthy: bool = False  # the cell's healthy arm: its best seed is the cell's twin
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cell(self) -> str:
        return f"{self.scenario}/{self.source}"

    def key(self) -> tuple[Any, ...]:
        """What the training depends on: two specs with the same key are the same run (trained once)."""
        skip = ("scenario", "arm", "healthy", "extra")
        fields = [(k, repr(v)) for k, v in sorted(vars(self).items()) if k not in skip]
        return (*fields, ("extra", repr(sorted(self.extra.items()))))

    @property
    def name(self) -> str:
        return f"{self.scenario}-{self.source}-{self.arm}-s{self.seed}"

    @property
    def onset(self) -> int | None:
        """The first step of the LR bump (a fault injected mid-run); None without one."""
        return None if self.lr_bump is None else math.ceil(self.lr_bump[0] * self.steps)

    def lr_at(self, step: int) -> float:
        """Linear warmup to ``lr``, constant after; ``lr_bump`` multiplies it on its window."""
        lr = self.lr * min(1.0, (step + 1) / self.warmup)
        if self.lr_bump is not None:
            lo, hi, factor = self.lr_bump
            if lo * self.steps <= step < hi * self.steps:
                lr *= factor
        return lr


Forward = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""tokens (B, T) -> (logits (B, T-1, V), mean cross-entropy of the next byte)."""


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, qk_norm: bool) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        hd = width // heads
        self.q_norm: nn.Module = nn.LayerNorm(hd) if qk_norm else nn.Identity()
        self.k_norm: nn.Module = nn.LayerNorm(hd) if qk_norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(self.q_norm(q), self.k_norm(k), v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, w))  # type: ignore[no-any-return]


class Block(nn.Module):
    def __init__(self, width: int, heads: int, qk_norm: bool) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads, qk_norm)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))  # type: ignore[no-any-return]


class TinyGPT(nn.Module):
    """A plain GPT: learned positions, pre-LN blocks, untied head."""

    def __init__(self, depth: int, width: int, seq: int, qk_norm: bool) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, width)
        self.pos = nn.Parameter(torch.zeros(seq, width))
        self.blocks = nn.ModuleList(Block(width, max(1, width // 16), qk_norm) for _ in range(depth))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos[: x.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h))  # type: ignore[no-any-return]


def _next_byte_loss(logits: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logits = logits[:, :-1]
    return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1))


def _gpt(spec: RunSpec, seq: int) -> tuple[nn.Module, Forward]:
    model = TinyGPT(spec.depth, spec.width, seq, spec.qk_norm)

    def forward(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _next_byte_loss(model(x), x)

    return model, forward


def _hf(spec: RunSpec, seq: int) -> tuple[nn.Module, Forward]:
    from transformers import LlamaConfig, LlamaForCausalLM

    heads = max(1, spec.width // 16)
    cfg = LlamaConfig(  # type: ignore[call-arg]
        vocab_size=VOCAB, hidden_size=spec.width, intermediate_size=4 * spec.width,
        num_hidden_layers=spec.depth, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=seq, attn_implementation="sdpa", tie_word_embeddings=False,
    )  # fmt: skip
    model: nn.Module = LlamaForCausalLM(cfg)  # type: ignore[arg-type]

    def forward(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _next_byte_loss(model(input_ids=x).logits, x)

    return model, forward


def _trainer(spec: RunSpec, seq: int) -> tuple[nn.Module, Forward]:
    from hyperwatch.trainer.config import build_config
    from hyperwatch.trainer.model import Transformer

    model_cfg: dict[str, Any] = {"depth": spec.depth, "vocab_size": VOCAB, "seq_len": seq, "qk_norm": spec.qk_norm}
    model_cfg["n_kv_heads"] = 2
    # the optimizer arm would set the parameterization and MoE switch: set them on the model section itself
    overrides: dict[str, Any] = {"parameterization": spec.extra.get("parameterization", "vanilla"), "moe": spec.moe}
    if spec.moe:
        overrides.update(sqrt_gate=spec.gates, aux_loss_gamma=0.1 if spec.gates else 0.0)
    base = build_config({"preset": "tiny", "model": model_cfg}).model  # type: ignore[dict-item]
    cfg = dataclasses.replace(base, **overrides)
    model = Transformer(cfg)

    def forward(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = model(x[:, :-1], x[:, 1:])
        # the model's loss already holds the MoE aux loss (gamma 0 when the gates are off)
        return out.logits, out.loss

    return model, forward


SOURCES: dict[str, Callable[[RunSpec, int], tuple[nn.Module, Forward]]] = {
    "gpt": _gpt,
    "hf": _hf,
    "trainer": _trainer,
}


def build(spec: RunSpec, seq: int) -> tuple[nn.Module, Forward]:
    """The run's model (seeded by ``spec.seed``) and its forward."""
    torch.manual_seed(spec.seed)
    return SOURCES[spec.source](spec, seq)


def z_loss(logits: torch.Tensor) -> torch.Tensor:
    """Mean squared log-partition of the LM head's logits (PaLM's z-loss, before its coefficient)."""
    return torch.logsumexp(logits.float(), dim=-1).pow(2).mean()


def stdlib_bytes(max_bytes: int) -> np.ndarray:
    """The first ``max_bytes`` bytes of the Python standard library's own sources (sorted paths)."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    out = bytearray()
    for path in sorted(root.glob("*.py")):
        out += path.read_bytes()
        if len(out) >= max_bytes:
            break
    if len(out) < 4096:
        raise RuntimeError(f"stdlib_bytes: found only {len(out)} bytes of .py files under {root}")
    return np.frombuffer(bytes(out[:max_bytes]), dtype=np.uint8)


def batches(data: np.ndarray, seed: int, steps: int, batch: int, seq: int) -> torch.Tensor:
    """(steps, batch, seq) byte windows at offsets drawn from ``seed``: twins see the same batches."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(data) - seq, size=(steps, batch))
    idx = starts[..., None] + np.arange(seq)
    return torch.from_numpy(data[idx].astype(np.int64))


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def finite(x: float) -> bool:
    return math.isfinite(x)
