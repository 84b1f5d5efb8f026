"""The models the hooks-overhead benchmark trains, each with its optimizers and loss.

Built from configs (nothing downloaded): the bundled Transformer-Next dense and MoE, a Hugging
Face Llama from a ``LlamaConfig``, PyTorch's own ``nn.TransformerEncoderLayer`` stack and a plain
GPT whose branches only discovery finds (``bench/plain_gpt.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hyperwatch.trainer.config import build_config
from hyperwatch.trainer.optim import OptimizerSet, build_optimizers

VOCAB = 257  # the tiny preset's byte tokenizer


@dataclass
class Trainee:
    """One copy of a model with its optimizers and a forward that returns the loss."""

    model: nn.Module
    optim: OptimizerSet | FusedAdamW
    loss: Callable[[nn.Module, torch.Tensor], torch.Tensor]


@dataclass
class Sizes:
    """Shapes of one benchmark configuration."""

    preset: str  # "tiny" or "paper"
    depth: int
    seq: int
    device: str

    @property
    def vocab(self) -> int:
        return VOCAB if self.preset == "tiny" else 32000


def _optimizers(model: nn.Module, depth: int, width: int) -> OptimizerSet:
    return build_optimizers(model, "hyperp", lr=0.02, depth=depth, width=width, tokens=400_000.0, base_depth=2)


def bundled(z: Sizes, moe: bool) -> Trainee:
    from hyperwatch.trainer.model import Transformer

    sections: dict[str, Any] = {
        "preset": z.preset,
        "model": {"depth": z.depth, "vocab_size": z.vocab, "seq_len": z.seq},
        "optim": {"arm": "hyperp_moe" if moe else "hyperp"},
    }
    cfg = build_config(sections).model
    torch.manual_seed(0)
    model = Transformer(cfg).to(z.device)

    def loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(x, x).loss  # type: ignore[no-any-return]

    return Trainee(model, _optimizers(model, z.depth, cfg.width), loss)


class FusedAdamW:
    """``torch.optim.AdamW(fused=True)`` behind the bench's optimizer interface."""

    def __init__(self, model: nn.Module) -> None:
        self.opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)

    def step(self) -> None:
        self.opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.opt.zero_grad(set_to_none=set_to_none)


def hf_llama(z: Sizes) -> Trainee:
    """Paper: the issue's Llama (hidden 1024, 16 heads of 64, 4 KV heads, MLP 4096, ~200M
    parameters); tiny: the tiny preset's shape (width 32d, 2d heads of 16, 4 KV heads, MLP 4w)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if z.preset == "paper":
        width, heads, head_dim, mlp = 1024, 16, 64, 4096
    else:
        width, heads, head_dim, mlp = 32 * z.depth, 2 * z.depth, 16, 128 * z.depth
    cfg = LlamaConfig(  # type: ignore[call-arg]
        vocab_size=z.vocab, hidden_size=width, intermediate_size=mlp, num_hidden_layers=z.depth,
        num_attention_heads=heads, num_key_value_heads=min(4, heads), head_dim=head_dim,
        max_position_embeddings=z.seq, attn_implementation="sdpa", tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model: nn.Module = LlamaForCausalLM(cfg).to(z.device)  # type: ignore[arg-type]

    def loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(input_ids=x, labels=x).loss  # type: ignore[no-any-return]

    return Trainee(model, FusedAdamW(model), loss)


def torch_encoder(z: Sizes) -> Trainee:
    """The tiny preset's shape (width 32d, 2d heads, MLP 4w) from PyTorch's own nn.TransformerEncoderLayer
    (pre-norm, batch_first, causal mask): attention Z recomputed from nn.MultiheadAttention's projections."""
    width, seq, vocab = 32 * z.depth, z.seq, z.vocab

    class CausalLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, width)
            layer = nn.TransformerEncoderLayer(width, 2 * z.depth, 4 * width, 0.0, batch_first=True, norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, z.depth, enable_nested_tensor=False)
            self.head = nn.Linear(width, vocab, bias=False)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.encoder(self.embed(x), mask=self.mask[: x.shape[1], : x.shape[1]], is_causal=True)
            return nn.functional.cross_entropy(self.head(h)[:, :-1].flatten(0, 1), x[:, 1:].flatten())

        def parameter_roles(self) -> dict[str, str]:
            roles = {n: "hidden" if p.ndim >= 2 else "vector" for n, p in self.named_parameters()}
            return {**roles, "embed.weight": "embedding", "head.weight": "head"}

    torch.manual_seed(0)
    model = CausalLM().to(z.device)

    def loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(x)  # type: ignore[no-any-return]

    return Trainee(model, _optimizers(model, z.depth, width), loss)


def plain_gpt(z: Sizes) -> Trainee:
    """``bench.plain_gpt.PlainGPT`` (names no heuristic knows: found by discovery), the tiny
    preset's shape (width 32d, 2d heads), AdamW."""
    from bench.plain_gpt import PlainGPT

    torch.manual_seed(0)
    model = PlainGPT(vocab=z.vocab, d=32 * z.depth, heads=2 * z.depth, layers=z.depth).to(z.device)

    def loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(m(x)[:, :-1].flatten(0, 1), x[:, 1:].flatten())

    return Trainee(model, FusedAdamW(model), loss)
