"""A tiny model with every parameter role, for the optimizer tests (not trainer.model)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 32
WIDTH = 16
EXPERTS = 3


class TinyRolesModel(nn.Module):
    """Embedding, two Linear layers, a router, a 3-D expert stack ``(E, out, in)``, vectors, a head."""

    def __init__(self, seed: int = 0, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.embed = nn.Embedding(VOCAB, WIDTH)
            self.up = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
            self.down = nn.Linear(3 * WIDTH, WIDTH, bias=True)
            self.router = nn.Linear(WIDTH, EXPERTS, bias=False)
            self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.experts = nn.Parameter(torch.randn(EXPERTS, WIDTH, WIDTH, generator=gen) / WIDTH**0.5)
        self.gain = nn.Parameter(torch.ones(WIDTH))
        self.to(dtype)

    def parameter_roles(self) -> dict[str, str]:
        roles = {"embed.weight": "embedding", "head.weight": "head"}
        for name, p in self.named_parameters():
            roles.setdefault(name, "hidden" if p.ndim >= 2 else "vector")
        return roles

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)  # (B, T, W)
        x = x + self.down(F.gelu(self.up(x)))
        probs = torch.softmax(self.router(x), dim=-1)  # (B, T, E)
        expert_out = torch.einsum("btw,eow->bteo", x, self.experts)  # (B, T, E, W)
        x = x + torch.einsum("bte,bteo->bto", probs, expert_out)
        x = x * self.gain
        return self.head(x)  # (B, T, V)


def batch(seed: int, size: int = 4, length: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (size, length + 1), generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


def loss_fn(model: TinyRolesModel, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(inputs)
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def hidden_matrices(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every constrained matrix by name; each expert of a 3-D stack is its own entry."""
    out: dict[str, torch.Tensor] = {}
    roles = model.parameter_roles()  # type: ignore[operator]
    for name, p in model.named_parameters():
        if roles[name] not in ("hidden", "head"):
            continue
        if p.ndim == 3:
            for e in range(p.shape[0]):
                out[f"{name}[{e}]"] = p.detach()[e]
        else:
            out[name] = p.detach()
    return out
