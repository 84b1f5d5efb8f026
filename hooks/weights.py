"""Optional per-layer hidden-matrix Frobenius norms and update/weight ratios.

Under MuonH every hidden matrix keeps its initial Frobenius norm exactly, so ``weight_norm``
is a live check that the optimizer is right. ``update_ratio`` is ||W_t - W_{t-1}||_F / ||W_{t-1}||_F
for the logged step t: the monitor snapshots the matrices right after the step before a logged
one (one copy of the hidden matrices, held only between those two steps).

Names: ``weight_norm.<branch>.<parameter path>`` with the trailing ``.weight`` dropped, e.g.
``weight_norm.attention.q_proj`` for layer 3; 3-D expert banks get one norm over all experts.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from hyperwatch.hooks.adapters import LayerSpec

_PART = re.compile(r"[^A-Za-z0-9_]")


def _qualifier(branch: str, name: str) -> str:
    parts = [p for p in name.split(".") if p]
    if len(parts) > 1 and parts[-1] == "weight":
        parts = parts[:-1]
    parts = [branch, *(_PART.sub("_", p)[:64] for p in parts)]
    if len(parts) > 6:
        parts = [*parts[:5], "_".join(parts[5:])[:64]]
    return ".".join(parts)


class WeightTracker:
    """Hidden matrices (ndim >= 2) of each layer's attention, MLP and router modules."""

    def __init__(self, layers: list[LayerSpec], update_ratio: bool = True) -> None:
        self.entries: list[tuple[int, str, nn.Parameter]] = []
        seen: set[int] = set()
        for spec in layers:
            for branch, module in (("attention", spec.attention), ("mlp", spec.mlp), ("router", spec.router)):
                if module is None:
                    continue
                for name, p in module.named_parameters():
                    if p.ndim >= 2 and id(p) not in seen:
                        seen.add(id(p))
                        self.entries.append((spec.index, _qualifier(branch, name), p))
        self.update_ratio = update_ratio
        self._previous: list[torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.entries)

    def snapshot(self) -> None:
        """Keep W_{t-1}: called after the step that precedes a logged step."""
        if self.update_ratio and self.entries:
            with torch.no_grad():
                self._previous = [p.detach().clone() for _, _, p in self.entries]

    def measure(self, device: torch.device) -> tuple[torch.Tensor, list[tuple[int, str]]]:
        """[norms..., ratios...] as one float64 device tensor, and the (layer, name) of each value.

        Ratios are there only when a snapshot of the previous step exists.
        """
        if not self.entries:
            return torch.zeros(0, dtype=torch.float64, device=device), []
        names = [(layer, f"weight_norm.{q}") for layer, q, _ in self.entries]
        with torch.no_grad():
            norms = torch.stack([p.detach().float().norm() for _, _, p in self.entries]).double()
            if self._previous is None:
                return norms.to(device), names
            ratios = torch.stack(
                [
                    (p.detach().float() - prev.float()).norm() / prev.float().norm()
                    for (_, _, p), prev in zip(self.entries, self._previous)
                ]
            ).double()
            self._previous = None
        names += [(layer, f"update_ratio.{q}") for layer, q, _ in self.entries]
        return torch.cat([norms, ratios]).to(device), names
