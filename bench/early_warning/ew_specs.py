"""The family benchmark's training recipe and sweep: optimizers, schedules, the arms and their specs.

The models are in :mod:`ew_families`; what each arm changes (an LR multiple, no warm-up, a fault injected
at ``onset``) and the specs of a sweep are here (see the arms' table in ``bench/early_warning/FAMILIES.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from ew_families import BEST_LR, DATA_SEED, FAMILIES, STEPS, VOCAB, Family
from torch import nn

# -- optimizers and schedules --


def optimizers(model: nn.Module, spec: Spec) -> list[torch.optim.Optimizer]:
    """AdamW on everything, or Muon on the blocks' 2-D matrices and AdamW on the rest."""
    named = list(model.named_parameters())  # a tied weight is listed once
    muon = [p for n, p in named if spec.optimizer == "muon" and n.startswith("blocks.") and p.ndim == 2]
    taken = {id(p) for p in muon}
    rest = [(n, p) for n, p in named if id(p) not in taken]
    groups = [
        {"params": [p for _, p in rest if p.ndim >= 2], "weight_decay": 0.1},
        {"params": [p for _, p in rest if p.ndim < 2], "weight_decay": 0.0},
    ]
    out: list[torch.optim.Optimizer] = [
        torch.optim.AdamW([g for g in groups if g["params"]], lr=spec.lr, betas=(0.9, spec.beta2), eps=spec.eps)
    ]
    if muon:
        out.append(torch.optim.Muon(muon, lr=spec.lr, weight_decay=0.1, adjust_lr_fn="match_rms_adamw"))
    return out


def prepare_step(spec: Spec, opts: list[torch.optim.Optimizer], step: int) -> float:
    """Before ``step``'s update: set its LR on every optimizer and, at ``opt_reset``'s onset, clear their
    state (Adam moments and step counts, Muon momentum: the checkpoint-resume bug, no re-warm-up).
    Returns the LR."""
    lr = spec.lr_at(step)
    for opt in opts:
        for g in opt.param_groups:
            g["lr"] = lr
        if spec.resets_at(step):
            opt.state.clear()
    return lr


def schedule(step: int, steps: int, warmup: int, kind: str) -> float:
    """The LR multiplier of ``step`` (0-based): linear warm-up over ``warmup`` steps to 1, then cosine
    to 0.1 or linear to 0 at ``steps``."""
    if step < warmup:
        return (step + 1) / warmup
    frac = (step - warmup) / max(1, steps - warmup)
    if kind == "cosine":
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * frac))
    if kind == "linear":
        return 1.0 - frac
    raise ValueError(f"schedule: {kind!r} is not cosine or linear")


# -- the sweep --


@dataclass(frozen=True)
class Spec:
    """One run. ``reference``: an arm that defines the family's best known setting (``best`` and the LR
    ladder); ``fault``: the injected or configured fault's name (None for a reference arm)."""

    family: str
    arm: str
    seed: int
    lr: float  # peak LR
    steps: int
    optimizer: str
    schedule: str
    warmup: int
    onset: int | None  # first step of a mid-run fault (None: none injected)
    reference: bool
    fault: str | None
    window: int = 0  # steps from the onset that lr_bump / bad_data last
    bump: float = 1.0  # lr_bump's LR multiplier inside its window
    beta2: float = 0.95
    eps: float = 1e-8
    aux_loss: float = 0.0
    dtype: str = "float32"  # bf16_params: bfloat16 (no fp32 master copy)
    clip: float | None = None  # max gradient norm; None: no clipping
    data_seed: int = DATA_SEED

    @property
    def name(self) -> str:
        return f"{self.family}-{self.arm}-s{self.seed}"

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def in_window(self, step: int) -> bool:
        return self.onset is not None and self.onset <= step < self.onset + self.window

    def lr_at(self, step: int) -> float:
        lr = self.lr * schedule(step, self.steps, self.warmup, self.schedule)
        return lr * self.bump if self.fault == "lr_bump" and self.in_window(step) else lr

    def resets_at(self, step: int) -> bool:
        """opt_reset: the optimizer state is cleared before this step's update."""
        return self.fault == "opt_reset" and step == self.onset

    def batch(self, clean: torch.Tensor, step: int) -> torch.Tensor:
        """bad_data: uniformly random bytes (drawn from the data seed and the step, the same for every
        init seed) in place of the batch inside the window; the clean batch elsewhere."""
        if self.fault != "bad_data" or not self.in_window(step):
            return clean
        g = torch.Generator().manual_seed(self.data_seed * 100_003 + step)
        return torch.randint(0, VOCAB, clean.shape, generator=g, dtype=clean.dtype)


ARMS = (
    "best",
    "lr_x0.5",
    "lr_x2",
    "lr_x4",
    "lr_x16",
    "lr_x64",
    "no_warmup",
    "lr_bump",
    "opt_reset",
    "bad_data",
    "bf16_params",
    "adam_beta2",
    "no_aux",
)
DEFAULT_ARMS = ARMS


def arm_overrides(fam: Family, arm: str, steps: int) -> dict[str, Any] | None:
    """The spec fields an arm sets beyond the family's defaults; None where it does not apply.

    - ``best``, ``lr_x0.5/2/4``: reference arms (the healthy twin and the LR ladder);
    - ``lr_x16``, ``lr_x64``: LRs that usually go wrong (x64 may diverge);
    - ``no_warmup``: x4 LR without warm-up (Wortsman et al. 2023; Xiong et al. 2020 for post-LN);
    - ``lr_bump``: LR x30 for 5% of the steps from mid-run; ``opt_reset``: the optimizers' state
      (Adam moments and step counts, Muon momentum) cleared at mid-run, no re-warm-up;
      ``bad_data``: 5% of the steps from mid-run train on uniformly random bytes;
    - ``bf16_params``: parameters (and so the optimizer state) in bfloat16, no fp32 master copy;
    - ``adam_beta2``: AdamW beta2 0.999 at x4 LR (slow second moment: Wortsman et al. 2023);
    - ``no_aux``: MoE only, the load-balancing loss off at x4 LR.
    """
    onset, window = steps // 2, max(1, round(0.05 * steps))
    ladder = {"best": 1.0, "lr_x0.5": 0.5, "lr_x2": 2.0, "lr_x4": 4.0}
    if arm in ladder:
        return {"lr_mult": ladder[arm], "reference": True}
    if arm in ("lr_x16", "lr_x64"):
        return {"lr_mult": float(arm[4:])}
    if arm == "no_warmup":
        return {"lr_mult": 4.0, "warmup": 0}
    if arm == "lr_bump":
        return {"onset": onset, "window": window, "bump": 30.0}
    if arm in ("opt_reset", "bad_data"):
        return {"onset": onset, "window": window if arm == "bad_data" else 0}
    if arm == "bf16_params":
        return {"dtype": "bfloat16"}
    if arm == "adam_beta2":
        return {"lr_mult": 4.0, "beta2": 0.999}
    if arm == "no_aux":
        return {"lr_mult": 4.0, "aux_loss": 0.0} if fam.aux_loss else None
    raise ValueError(f"arm: {arm!r} is not one of {', '.join(ARMS)}")


def make_spec(family: str, arm: str, seed: int, steps: int = STEPS, lr: float | None = None) -> Spec | None:
    """The spec of one run (``lr``: the family's peak LR, default :data:`BEST_LR`); None where the arm
    does not apply to the family."""
    fam = FAMILIES[family]
    over = arm_overrides(fam, arm, steps)
    if over is None:
        return None
    over = dict(over)
    mult = over.pop("lr_mult", 1.0)
    reference = over.pop("reference", False)
    base = Spec(
        family=family,
        arm=arm,
        seed=seed,
        lr=(BEST_LR[family] if lr is None else lr) * mult,
        steps=steps,
        optimizer=fam.optimizer,
        schedule=fam.schedule,
        warmup=max(1, round(0.1 * steps)),
        onset=None,
        reference=reference,
        fault=None if reference else arm,
        aux_loss=fam.aux_loss,
    )
    return replace(base, **over)


def sweep(families: list[str], arms: list[str], seeds: int, steps: int = STEPS, seed_offset: int = 0) -> list[Spec]:
    """Every applicable (family, arm, seed), seeds ``seed_offset`` .. ``seed_offset + seeds - 1``; the data
    seed moves with ``seed_offset`` (a held-out set: other inits and another batch order)."""
    out = []
    for family in families:
        for arm in arms:
            for seed in range(seed_offset, seed_offset + seeds):
                spec = make_spec(family, arm, seed, steps)
                if spec is not None:
                    out.append(replace(spec, data_seed=DATA_SEED + seed_offset))
    return out
