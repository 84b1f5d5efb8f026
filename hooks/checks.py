"""Checks of the values a training loop hands the monitor: errors name the argument and what it must be."""

from __future__ import annotations

from typing import Any

import torch

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
