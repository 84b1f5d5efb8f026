"""What the hooks tell the service about a run's scale: parameters, budget, FLOPs.

A run the service knows only by name cannot be placed on a scale page or drawn against tokens,
FLOPs or the fraction of training. ``hooks.attach`` therefore sends, once with the run:

- ``total_params``: counted from the model (each parameter tensor once, shared ones once), unless
  given;
- ``total_steps`` and ``tokens`` (the token budget of the whole run), when given;
- ``flops``: the run's training FLOPs, ``flops_per_token * tokens``; ``flops_per_token`` defaults to
  6N (forward and backward, Kaplan et al. 2020) with N the active parameters when given, else the
  total parameters.

When only ``total_steps`` is given, the budget is learned from the run itself: :class:`BudgetFromSteps`
takes the tokens of two logged steps (``mon.step(s, tokens=...)``), extrapolates to the last step
and the monitor sends ``tokens`` (and ``flops``) once, as a run update, never per batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from hyperwatch.hooks.sinks.base import RunInfo, Sink


def count_parameters(model: nn.Module) -> int:
    """Elements of the model's parameters, each tensor counted once (tied weights are shared tensors).

    A DTensor (FSDP2, tensor parallel) counts its global shape; a flattened FSDP1 shard counts only
    this rank's part: give ``total_params=`` to ``hooks.attach`` there."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += math.prod(p.shape) if isinstance(p, torch.Tensor) else 0
    return int(total)


def check_positive_int(value: Any, field: str, fix: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field}: must be a positive integer ({fix}), got {value!r}")
    return value


def check_flops_per_token(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(
            "flops_per_token: must be a positive finite number (training FLOPs per token, e.g. "
            f"6 * parameters; leave it out for 6N), got {value!r}"
        )
    return float(value)


def describe(model: nn.Module, fields: dict[str, Any], flops_per_token: float | None) -> dict[str, Any]:
    """``fields`` (the run fields given to attach) completed with parameters and FLOPs; validated.

    Given values win; ``flops`` and ``flops_per_token`` together are refused (one would be ignored)."""
    out = dict(fields)
    check_positive_int(out.get("total_steps"), "total_steps", "the number of optimizer steps the run will take")
    check_positive_int(out.get("tokens"), "tokens", "the run's token budget: training tokens over all steps")
    check_positive_int(out.get("total_params"), "total_params", "leave it out to count the model's parameters")
    check_positive_int(out.get("active_params"), "active_params", "parameters used per token, for MoE")
    fpt = check_flops_per_token(flops_per_token)
    if fpt is not None and out.get("flops") is not None:
        raise ValueError(
            "flops and flops_per_token: give one of them (flops is the run's total, flops_per_token * tokens)"
        )
    if not out.get("total_params"):
        n = count_parameters(model)
        if n > 0:
            out["total_params"] = n
    if out.get("flops") is None and out.get("tokens"):
        per_token = fpt if fpt is not None else default_flops_per_token(out)
        if per_token is not None:
            out["flops"] = per_token * out["tokens"]
    return out


def default_flops_per_token(fields: dict[str, Any]) -> float | None:
    """6N: N the active parameters when known (MoE), else the total."""
    n = fields.get("active_params") or fields.get("total_params")
    return 6.0 * float(n) if n else None


class BudgetFromSteps:
    """The token budget of a run given ``total_steps`` but not ``tokens``, from two logged steps.

    ``observe(step, tokens)`` returns the run fields to send (``tokens``, and ``flops`` when it can
    be computed) once two logged steps with tokens are known, else None; it answers at most once.
    The rate is tokens per step between the two steps (so a run resumed mid-way, or one counting
    steps from 1, still gets its own budget); the last step is ``total_steps - 1`` (steps from 0)."""

    def __init__(self, fields: dict[str, Any], flops_per_token: float | None) -> None:
        self.total_steps: int | None = fields.get("total_steps")
        self.flops_per_token = flops_per_token
        self.fields = fields
        self.done = self.total_steps is None or bool(fields.get("tokens"))
        self._first: tuple[int, int] | None = None
        self._last: tuple[int, int] | None = None  # the last logged (step, tokens)

    def observe(self, step: int, tokens: int | None) -> dict[str, Any] | None:
        if tokens is not None:
            self._last = (step, tokens)
        if self.done or tokens is None:
            return None
        if self._first is None or step <= self._first[0]:
            self._first = (step, tokens)
            return None
        s0, t0 = self._first
        rate = (tokens - t0) / (step - s0)
        self.done = True
        assert self.total_steps is not None
        budget = round(tokens + rate * (self.total_steps - 1 - step))
        if rate <= 0 or budget <= 0:
            return None
        out: dict[str, Any] = {"tokens": budget}
        if self.fields.get("flops") is None:
            per_token = self.flops_per_token or default_flops_per_token(self.fields)
            if per_token is not None:
                out["flops"] = per_token * budget
        return out

    def at_finish(self) -> dict[str, Any] | None:
        """A run that finished with neither ``total_steps`` nor ``tokens`` known: what it did is its
        length (``total_steps`` = last logged step + 1, steps from 0; ``tokens`` = the tokens at that
        step), so its Tokens column, FLOPs and fraction axes fill in. None when already described."""
        if self.total_steps is not None or self.fields.get("tokens") or self._last is None:
            return None
        step, tokens = self._last
        if tokens <= 0:
            return None
        out: dict[str, Any] = {"total_steps": step + 1, "tokens": tokens}
        if self.fields.get("flops") is None:
            per_token = self.flops_per_token or default_flops_per_token(self.fields)
            if per_token is not None:
                out["flops"] = per_token * tokens
        return out

    def finish_job(self, run: RunInfo, sink: Sink) -> Callable[[], None]:
        """The emitter-thread job that sends :meth:`at_finish`'s fields before the final status."""

        def job() -> None:
            learned = self.at_finish()
            if learned:
                run.fields.update(learned)
                sink.update(learned)

        return job
