"""Optimisation for the bundled trainer, one concept per module.

* :mod:`.build` -- ``build_optimizers``: which parameter gets which optimizer, LR and decay per arm;
* :mod:`.optimizers` -- the optimizers themselves (Muon, MuonH, AdamH);
* :mod:`.newton_schulz` -- the Newton-Schulz orthogonalisation, per matrix and batched;
* :mod:`.schedule` -- HyperP's learning-rate transfer laws and the LR schedule.

The public names are re-exported here so ``from hyperwatch.trainer.optim import build_optimizers``
works (loaded on first use, so the trainer's config imports no torch).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hyperwatch.trainer.optim.build import ARMS, AdamH, Muon, MuonH, OptimizerSet, build_optimizers

__all__ = ["ARMS", "AdamH", "Muon", "MuonH", "OptimizerSet", "build_optimizers"]


def __getattr__(name: str) -> Any:
    """The public names load on first use (``build`` imports torch; ``.schedule`` alone does not)."""
    if name in __all__:
        return getattr(importlib.import_module("hyperwatch.trainer.optim.build"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
