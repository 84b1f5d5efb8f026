"""A small GPT whose modules have names no heuristic knows: blocks in ``stack``, attention ``mix``,
MLP ``ffn``, SDPA attention. Branch discovery must find its branches by what the residual
stream receives; the compile-order tests (``tests/hooks/compile_orders.py``) and
``bench/hooks_overhead.py --models gpt`` train it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Mix(nn.Module):
    """Causal self-attention through SDPA, named like nothing a heuristic knows."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.o = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(B, T, D))  # type: ignore[no-any-return]


class Cell(nn.Module):
    def __init__(self, d: int, heads: int, parallel: bool) -> None:
        super().__init__()
        self.parallel = parallel
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.mix = Mix(d, heads)
        self.ffn = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.parallel:  # GPT-J / PaLM: one norm, both branches added to the stream in one expression
            h = self.n1(x)
            return x + self.mix(h) + self.ffn(h)  # type: ignore[no-any-return]
        x = x + self.mix(self.n1(x))
        return x + self.ffn(self.n2(x))  # type: ignore[no-any-return]


class PlainGPT(nn.Module):
    """A small GPT whose blocks sit in ``stack`` with children ``mix`` and ``ffn``."""

    def __init__(self, vocab: int = 64, d: int = 32, heads: int = 4, layers: int = 3, parallel: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.stack = nn.ModuleList([Cell(d, heads, parallel) for _ in range(layers)])
        self.fin = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for cell in self.stack:
            h = cell(h)
        return self.out(self.fin(h))  # type: ignore[no-any-return]
