"""Checks of the values a training loop hands the monitor: errors name the argument and what it must be."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

Scalar = float | int | torch.Tensor


def check_int(value: Any, field: str, lo: int = 0) -> int:
    """``value`` if it is an int >= ``lo`` (not a bool), else a ValueError naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{field}: must be an integer >= {lo}, got {value!r}")
    return value


def check_scalar(value: Scalar | None, field: str) -> None:
    """A number or a one-element tensor (None passes), else a ValueError naming ``field``."""
    if value is None:
        return
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{field}: must be a scalar; got a tensor of shape {tuple(value.shape)}")
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field}: must be a number or a scalar tensor, got {type(value).__name__}")


def scalar_tensor(value: Scalar | None, field: str, device: torch.device) -> torch.Tensor | None:
    """:func:`check_scalar`, then the value as a float64 0-d tensor on ``device`` (None stays None)."""
    check_scalar(value, field)
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value.detach().reshape(()).to(device=device, dtype=torch.float64)
    return torch.tensor(float(value), dtype=torch.float64, device=device)


def grad_norm_of(model: nn.Module, device: torch.device) -> torch.Tensor | None:
    """The 2-norm of every ``.grad`` of ``model`` as they are now (float64 on ``device``), None if none."""
    grads = [p.grad.detach() for p in model.parameters() if p.grad is not None]
    if not grads:
        return None
    norms = torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])
    return torch.linalg.vector_norm(norms).to(device, torch.float64)


def warn_no_grad(model: nn.Module, run: str, step: int) -> None:
    """Every ``.grad`` was None at ``mon.step()``: say why grad_norm is missing and the fix (once per monitor)."""
    if not any(p.requires_grad for p in model.parameters()):
        return
    log.warning(
        "hooks: run %r, step %d: every parameter's .grad is None at mon.step(), so grad_norm is not "
        "recorded. Call mon.step(...) after opt.step() and before opt.zero_grad() (which sets the "
        "gradients to None), or pass mon.step(..., grad_norm=clip_grad_norm_(...)); "
        "hooks.attach(..., grad_norm=False) silences this",
        run,
        step,
    )
