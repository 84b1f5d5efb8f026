"""Optimisation for the bundled trainer, one concept per module.

* :mod:`.build` -- ``build_optimizers``: which parameter gets which optimizer, LR and decay per arm;
* :mod:`.optimizers` -- the optimizers themselves (Muon, MuonH, AdamH);
* :mod:`.newton_schulz` -- the Newton-Schulz orthogonalisation, per matrix and batched;
* :mod:`.schedule` -- HyperP's learning-rate transfer laws and the LR schedule.

The public names are re-exported here so ``from hyperwatch.trainer.optim import build_optimizers``
works.
"""

from hyperwatch.trainer.optim.build import ARMS, AdamH, Muon, MuonH, OptimizerSet, build_optimizers

__all__ = ["ARMS", "AdamH", "Muon", "MuonH", "OptimizerSet", "build_optimizers"]
