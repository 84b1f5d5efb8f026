"""Optimizers for the bundled trainer: one builder per paper arm (spec: HYPERP.md sections 1-2).

``build_optimizers(model, arm, ...)`` splits the model's parameters by the role the model
declares (``model.parameter_roles()``: "embedding", "head", "hidden", "vector") and gives each
role its optimizer, peak LR and weight decay:

========== ================================ ============================== ==========================
arm        hidden matrices (2-D, experts)    LM head                        embedding, vectors
========== ================================ ============================== ==========================
muon       Muon, lr*sqrt(d_out/d_in)*         AdamW, lr*sqrt(d0/d), wd 0     AdamW, lr*sqrt(d0/d), wd 0
           sqrt(d0/d), wd lambda_0*w0/w
           (independent)
muonh      MuonH, lr                         AdamH, lr                      AdamW, lr, wd 0
hyperp     MuonH, eta(d, T)                  AdamH, eta(d, T)               AdamW, eta(d, T), wd 0
hyperp_moe same as hyperp (the MoE is the model's business)
========== ================================ ============================== ==========================

``eta(d, T) = lr * sqrt(d0/d) * (T0/T)^0.32`` (trainer.optim.schedule.hyperp_lr). Giving the AdamW
groups the token factor too is our choice where the spec's table lists only ``1/sqrt(d)``:
HyperP then has one global LR per run, as the paper's "one shared LR" for MuonH and AdamH.
Gradient clipping (1.0) is the training loop's job; the schedule calls ``set_lr_scale``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from hyperwatch.trainer.optim.newton_schulz import newton_schulz5
from hyperwatch.trainer.optim.optimizers import AdamH, Muon, MuonH
from hyperwatch.trainer.optim.schedule import (
    ARMS,
    BASE_DEPTH,
    BASE_TOKENS,
    ROLES,
    lr_multiplier,
    parameterization_for_arm,
    weight_decay_for,
)

__all__ = [
    "ARMS",
    "AdamH",
    "Muon",
    "MuonH",
    "OptimizerSet",
    "build_optimizers",
    "newton_schulz5",
]


class OptimizerSet:
    """The torch optimizers of one arm behind a single optimizer-like interface.

    ``param_groups`` lists every group of every optimizer (the live dicts); each has ``name``
    (e.g. ``"hidden"``, ``"hidden_64x256"``, ``"head"``, ``"embedding"``, ``"vector"``), ``role``,
    ``param_names`` and ``initial_lr`` (the group's peak LR). ``set_lr_scale(s)`` sets every
    group's ``lr`` to ``s * initial_lr``; the schedule (trainer.optim.schedule.linear_decay) calls it.
    """

    def __init__(self, arm: str, optimizers: Mapping[str, torch.optim.Optimizer]) -> None:
        self.arm = arm
        self.optimizers: dict[str, torch.optim.Optimizer] = dict(optimizers)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for opt in self.optimizers.values() for group in opt.param_groups]

    def step(self) -> None:
        for opt in self.optimizers.values():
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=set_to_none)

    def set_lr_scale(self, scale: float) -> None:
        """Set each group's LR to ``scale * initial_lr`` (scale in [0, 1] for the decay schedule)."""
        s = float(scale)
        if not math.isfinite(s) or s < 0:
            raise ValueError(f"scale must be a finite number >= 0, got {scale!r}")
        for group in self.param_groups:
            group["lr"] = group["initial_lr"] * s

    def lrs(self) -> dict[str, float]:
        """Current LR of each group by name (for logging)."""
        return {str(group["name"]): float(group["lr"]) for group in self.param_groups}

    def state_dict(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "optimizers": {key: opt.state_dict() for key, opt in self.optimizers.items()},
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        if state_dict.get("arm") != self.arm:
            raise ValueError(
                f"state_dict arm is {state_dict.get('arm')!r} but these optimizers are for arm "
                f"{self.arm!r}: resume with the same --arm the checkpoint was trained with"
            )
        saved = state_dict.get("optimizers")
        if not isinstance(saved, Mapping) or set(saved) != set(self.optimizers):
            found = sorted(saved) if isinstance(saved, Mapping) else saved
            raise ValueError(f"state_dict['optimizers'] must have the keys {sorted(self.optimizers)}, got {found!r}")
        for key, opt in self.optimizers.items():
            opt.load_state_dict(saved[key])


def _positive(name: str, value: float) -> float:
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return number


def _params_by_role(model: nn.Module) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """Trainable parameters grouped by the model's declared role, checked for completeness."""
    roles_fn = getattr(model, "parameter_roles", None)
    if not callable(roles_fn):
        raise TypeError(
            f"{type(model).__name__} has no parameter_roles() method: define parameter_roles() -> "
            f"dict[str, str] mapping every parameter name to one of {', '.join(ROLES)}"
        )
    roles = roles_fn()
    named = dict(model.named_parameters())
    unknown = sorted(set(roles) - set(named))
    if unknown:
        raise ValueError(f"parameter_roles() names parameters the model does not have: {unknown}")
    grouped: dict[str, list[tuple[str, nn.Parameter]]] = {role: [] for role in ROLES}
    for name, p in named.items():
        if not p.requires_grad:
            continue
        role = roles.get(name)
        if role is None:
            raise ValueError(
                f"parameter {name!r} has no role in parameter_roles(): add it as one of {', '.join(ROLES)}"
            )
        if role not in grouped:
            raise ValueError(f"parameter {name!r} has role {role!r}; valid roles are {', '.join(ROLES)}")
        if role in ("hidden", "head") and p.ndim < 2:
            raise ValueError(
                f"parameter {name!r} has role {role!r} but shape {tuple(p.shape)}: hidden and head "
                f"parameters must be matrices (out, in) or expert stacks (E, out, in); use 'vector'"
            )
        grouped[role].append((name, p))
    if not any(grouped.values()):
        raise ValueError(f"{type(model).__name__} has no trainable parameters to optimize")
    return grouped


def _group(name: str, role: str, params: list[tuple[str, nn.Parameter]], lr: float, **extra: Any) -> dict[str, Any]:
    return {"params": params, "name": name, "role": role, "lr": lr, "initial_lr": lr, **extra}


def build_optimizers(
    model: nn.Module,
    arm: str,
    *,
    lr: float,
    depth: int,
    width: int,
    tokens: float,
    base_depth: int = BASE_DEPTH,
    base_width: float | None = None,
    base_tokens: float = BASE_TOKENS,
    weight_decay: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.95),
) -> OptimizerSet:
    """Build the optimizers of one paper arm for ``model`` (see the module docstring's table).

    ``lr`` is the base LR eta_0 tuned at the base model (paper: 0.02 dense, 0.01 MoE) and
    ``weight_decay`` the base lambda_0 (paper: 1e-3, used only by the muon arm, scaled by w0/w).
    ``depth``, ``width`` and ``tokens`` describe this run; ``base_width`` defaults to
    ``base_depth * width / depth`` (same aspect ratio alpha = w/d as this model).
    """
    parameterization = parameterization_for_arm(arm)
    lr = _positive("lr", lr)
    depth_f = _positive("depth", depth)
    width_f = _positive("width", width)
    tokens = _positive("tokens", tokens)
    base_depth_f = _positive("base_depth", base_depth)
    base_tokens = _positive("base_tokens", base_tokens)
    w0 = base_depth_f * width_f / depth_f if base_width is None else _positive("base_width", base_width)
    if not math.isfinite(weight_decay) or weight_decay < 0:
        raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay!r}")
    for i, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"betas[{i}] must be in [0, 1), got {beta!r}")
    grouped = _params_by_role(model)
    scale = {"depth": depth_f, "tokens": tokens, "base_depth": base_depth_f, "base_tokens": base_tokens}
    decay = {"weight_decay": weight_decay, "width": width_f, "base_width": w0}

    def role_lr(role: str, shape: torch.Size | None = None) -> float:
        d_out, d_in = (int(shape[-2]), int(shape[-1])) if shape is not None else (None, None)
        return lr * lr_multiplier(parameterization, role, d_out=d_out, d_in=d_in, **scale)

    adamw_groups = [
        _group(
            role,
            role,
            grouped[role],
            role_lr(role),
            weight_decay=weight_decay_for(parameterization, role, **decay),
        )
        for role in ("embedding", "vector")
        if grouped[role]
    ]
    optimizers: dict[str, torch.optim.Optimizer] = {}
    if arm == "muon":
        by_shape: dict[tuple[int, int], list[tuple[str, nn.Parameter]]] = {}
        for name, p in grouped["hidden"]:
            by_shape.setdefault((p.shape[-2], p.shape[-1]), []).append((name, p))
        hidden_wd = weight_decay_for(parameterization, "hidden", **decay)
        muon_groups = [
            _group(f"hidden_{d_out}x{d_in}", "hidden", params, role_lr("hidden", params[0][1].shape))
            for (d_out, d_in), params in by_shape.items()
        ]
        if muon_groups:
            optimizers["muon"] = Muon(muon_groups, momentum=0.95, nesterov=True, weight_decay=hidden_wd)
        if grouped["head"]:
            head_wd = weight_decay_for(parameterization, "head", **decay)
            adamw_groups.append(_group("head", "head", grouped["head"], role_lr("head"), weight_decay=head_wd))
    else:
        if grouped["hidden"]:
            hidden = [_group("hidden", "hidden", grouped["hidden"], role_lr("hidden"))]
            optimizers["muonh"] = MuonH(hidden, momentum=0.95, nesterov=True, weight_decay=0.0)
        if grouped["head"]:
            head = [_group("head", "head", grouped["head"], role_lr("head"))]
            optimizers["adamh"] = AdamH(head, betas=betas, eps=1e-8, weight_decay=0.0)
    if adamw_groups:
        optimizers["adamw"] = torch.optim.AdamW(adamw_groups, betas=betas, eps=1e-8, weight_decay=0.0)
    return OptimizerSet(arm, optimizers)
