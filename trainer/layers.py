"""Building blocks shared by the dense model and the MoE: RMSNorm, RoPE, SwiGLU."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learnable gain, computed in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps)
        return y.type_as(x)


def rope_tables(seq_len: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (T, D/2) for rotary position embedding."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x_BTHD: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (first half, second half) pairs of each head by position-dependent angles."""
    T = x_BTHD.shape[1]
    x1, x2 = x_BTHD.float().chunk(2, dim=-1)
    c, s = cos[:T, None, :], sin[:T, None, :]
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).type_as(x_BTHD)


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x), scaled by the residual multiplier (1 for a shared expert inside an MoE)."""

    def __init__(self, width: int, hidden: int, residual_multiplier: float = 1.0) -> None:
        super().__init__()
        self.w1 = nn.Linear(width, hidden, bias=False)
        self.w3 = nn.Linear(width, hidden, bias=False)
        self.w2 = nn.Linear(hidden, width, bias=False)
        self.residual_multiplier = residual_multiplier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x)) * self.residual_multiplier
