"""Learned thresholds in the family benchmark: each family a group that learns from its healthy siblings.

The service can raise a group's level thresholds (the growth floors and the logit ceiling) to
``learn_multiple`` x the highest peak of its finished healthy runs (:mod:`monitor.thresholds.learned`).
Here each family is such a group, and its ``best`` arm (the family's healthy twin, trained first in
a team's sweep) the finished runs it learns from: those the loss calls healthy (excess <= 0.05, as
the service's ``learn_loss_margin`` does) and that no rule reading the loss warned. Every other run of
the family is scored at the fold's thresholds raised by what the family learned, exactly as
:func:`monitor.thresholds.learned.effective_thresholds` raises a group's: a learned value counts only
above the threshold in force. The ``best`` runs themselves are scored without learning: they are the
group's first runs. Learning never sees another family's runs, and the thresholds it starts from
are the fold's, chosen without the left-out family.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
from ew_truth import BEST_ARM, Truth, run_row

from hyperwatch.hooks.columns import PointColumns
from hyperwatch.hooks.schema import base_name, head_of
from hyperwatch.monitor.thresholds.defaults import DEFAULT_THRESHOLDS
from hyperwatch.monitor.thresholds.learned import LEARNED_FROM, LOSS_RULES

Overrides = dict[str, float]


class LearnRun(Protocol):
    name: str
    family: str
    arm: str
    batches: list[PointColumns]


class Warnings(Protocol):
    def warnings(self, run: Any, over: Overrides) -> tuple[int | None, int | None]: ...


def run_peaks(batches: Sequence[PointColumns]) -> dict[str, float]:
    """Per learned threshold, the run's highest finite value of its metric (max over layers and steps;
    the logit ceiling's per-head series too), as the service reads them from the store."""
    peaks: dict[str, float] = {}
    for cols in batches:
        for i, name in enumerate(cols.names):
            for key, (metric, heads) in LEARNED_FROM.items():
                counts = name == metric or (heads and head_of(name) is not None and base_name(name) == metric)
                if not counts:
                    continue
                values = cols.value[cols.name_index == i]
                finite = values[np.isfinite(values)]
                if len(finite):
                    peaks[key] = max(peaks.get(key, -math.inf), float(finite.max()))
    return peaks


def family_peaks(
    runs: Sequence[LearnRun], truth: Mapping[str, Truth], loss_warned: Mapping[str, bool]
) -> dict[str, dict[str, float]]:
    """Per family: the highest peak of each learned threshold's metric over its ``best`` runs that the
    loss calls healthy and no loss rule warned (empty below ``learn_min_runs`` of them)."""
    need = int(DEFAULT_THRESHOLDS["learn_min_runs"])
    out: dict[str, dict[str, float]] = {}
    for family in sorted({r.family for r in runs}):
        teachers = [
            r
            for r in runs
            if r.family == family
            and r.arm == BEST_ARM
            and truth[r.name].verdict == "healthy"
            and not loss_warned.get(r.name, False)
        ]
        best: dict[str, float] = {}
        if len(teachers) >= need:
            for r in teachers:
                for key, value in run_peaks(r.batches).items():
                    best[key] = max(best.get(key, -math.inf), value)
        out[family] = best
    return out


def learned_over(over: Overrides, peaks: Mapping[str, float], multiple: float) -> Overrides:
    """The fold's overrides raised where ``multiple`` x a learned peak is above the value in force."""
    raised = dict(over)
    for key, peak in peaks.items():
        now = over.get(key, DEFAULT_THRESHOLDS[key])
        if multiple * peak > now:
            raised[key] = multiple * peak
    return raised


def learning_scorer(
    ev: Warnings, truth: Mapping[str, Truth], peaks: Mapping[str, Mapping[str, float]], multiple: float
) -> Any:
    """A scorer (runs, overrides) -> rows in which every run but a family's ``best`` is scored at the
    overrides raised by what its family learned."""

    def score(runs: Sequence[LearnRun], over: Overrides) -> list[dict[str, Any]]:
        rows = []
        for r in runs:
            mine = over if r.arm == BEST_ARM else learned_over(over, peaks.get(r.family, {}), multiple)
            rows.append(run_row(r, truth[r.name], ev.warnings(r, mine)))  # type: ignore[arg-type]
        return rows

    return score


def loss_rule_warned(alerts: Sequence[tuple[str, str, int, str, int | None]]) -> bool:
    """Whether a run's alerts hold a warning or critical one of a rule that reads the loss (the
    service then does not learn from it)."""
    return any(rule in LOSS_RULES and severity in ("warning", "critical") for rule, severity, *_ in alerts)
