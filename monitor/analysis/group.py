"""Everything a dashboard shows for a group of runs, from each run's scale fields and final loss.

A group is the set of runs of one study (a sweep, a scaling ladder, a method comparison). Each
run record carries its scale fields and its final validation loss::

    {"run": "d8-lr0.02", "method": "muonh_hyperp", "depth": 8, "tokens": 1.04e10,
     "batch_size": 2097152, "lr": 0.02, "flops": 3.1e18, "val_loss": 2.91}

Only ``run`` and ``val_loss`` are required; ``arm`` is accepted as another name for ``method``;
other keys (the rest of a run's config) are ignored. From these, :func:`fit_group` derives:

- LR sweeps: runs that share (method, depth, tokens, batch_size) and differ in ``lr`` form a
  sweep; each sweep with 3 or more distinct LRs gets its optimal-LR fit (:mod:`.lr`), a sweep of
  2 LRs gets the error saying it is too short, and a single LR is not a sweep.
- Transfer laws: for each axis (tokens, depth, batch_size), sweeps that differ only along it give
  optimal LR vs that axis, fitted as a power law (:mod:`.powerlaw`) when there are 2 or more.
- Scaling laws: runs with ``flops`` give each method's law L(C) (a budget's point is its best
  run; runs without a method count as method "default") and, with a baseline, the leverage of
  every other method over it (:mod:`.scaling`).

A part that cannot be fitted carries its error message instead of a fit, so one short sweep
never hides the rest of the page.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hyperwatch.hooks.schema import SchemaError, decode_value
from hyperwatch.monitor.analysis._common import AnalysisError, jsonable
from hyperwatch.monitor.analysis.lr import LRFit, fit_optimal_lr
from hyperwatch.monitor.analysis.powerlaw import PowerLawFit, fit_power_law
from hyperwatch.monitor.analysis.scaling import ScalingComparison, compare_methods

AXES = ("depth", "tokens", "batch_size")
_NUMERIC = ("depth", "tokens", "batch_size", "lr", "flops")

SweepKey = tuple[str | None, float | None, float | None, float | None]


@dataclass(frozen=True)
class RunPoint:
    """One run's scale fields and final validation loss, validated."""

    run: str
    val_loss: float
    method: str | None = None
    depth: float | None = None
    tokens: float | None = None
    batch_size: float | None = None
    lr: float | None = None
    flops: float | None = None

    def sweep_key(self) -> SweepKey:
        return (self.method, self.depth, self.tokens, self.batch_size)


def parse_run(record: Mapping[str, Any], where: str = "record") -> RunPoint:
    """Validate one record; raises :class:`AnalysisError` naming the field and the fix."""
    if not isinstance(record, Mapping):
        raise AnalysisError(where, f"must be an object with run and val_loss, got {type(record).__name__}")
    run = record.get("run")
    if not isinstance(run, str) or not run:
        raise AnalysisError(f"{where}.run", f"must be a non-empty string naming the run, got {run!r}")
    if record.get("val_loss") is None:
        raise AnalysisError(f"{where}.val_loss", f"run {run!r} has no final validation loss; log val_loss")
    try:
        val_loss = decode_value(record["val_loss"], f"{where}.val_loss")
    except SchemaError as exc:
        raise AnalysisError(exc.field, str(exc)[len(exc.field) + 2 :]) from exc
    method = record.get("method", record.get("arm"))
    if method is not None and not isinstance(method, str):
        raise AnalysisError(f"{where}.method", f"must be a string naming the method, got {method!r}")
    values: dict[str, float | None] = {}
    for key in _NUMERIC:
        v = record.get(key)
        if v is None:
            values[key] = None
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
            raise AnalysisError(f"{where}.{key}", f"must be a positive finite number or null, got {v!r}")
        values[key] = float(v)
    return RunPoint(run=run, val_loss=val_loss, method=method, **values)


@dataclass(frozen=True)
class SweepFit:
    """The optimal-LR fit of one sweep (or why there is none)."""

    key: SweepKey
    runs: tuple[str, ...]
    fit: LRFit | str

    def to_json(self) -> dict[str, Any]:
        method, depth, tokens, batch_size = self.key
        fit = {"error": self.fit} if isinstance(self.fit, str) else self.fit
        return jsonable(
            {
                "method": method,
                "depth": depth,
                "tokens": tokens,
                "batch_size": batch_size,
                "runs": self.runs,
                "fit": fit,
            }
        )


@dataclass(frozen=True)
class TransferLaw:
    """Optimal LR vs one axis for sweeps that share everything else."""

    axis: str
    fixed: dict[str, Any]
    x: tuple[float, ...]
    optimal_lr: tuple[float, ...]
    fit: PowerLawFit | str

    def to_json(self) -> dict[str, Any]:
        fit = {"error": self.fit} if isinstance(self.fit, str) else self.fit
        return jsonable(
            {"axis": self.axis, "fixed": self.fixed, "x": self.x, "optimal_lr": self.optimal_lr, "fit": fit}
        )


@dataclass(frozen=True)
class GroupAnalysis:
    sweeps: tuple[SweepFit, ...]
    transfer_laws: tuple[TransferLaw, ...]
    scaling: ScalingComparison | str | None
    n_runs: int

    def to_json(self) -> dict[str, Any]:
        scaling = {"error": self.scaling} if isinstance(self.scaling, str) else self.scaling
        return jsonable(
            {
                "n_runs": self.n_runs,
                "sweeps": self.sweeps,
                "transfer_laws": self.transfer_laws,
                "scaling": scaling,
            }
        )


def _fit_sweeps(runs: Sequence[RunPoint]) -> list[SweepFit]:
    groups: dict[SweepKey, list[RunPoint]] = {}
    for r in runs:
        if r.lr is not None:
            groups.setdefault(r.sweep_key(), []).append(r)
    out = []
    for key, members in groups.items():
        if len({m.lr for m in members}) < 2:
            continue  # one LR is a single run (a scaling-ladder point), not a sweep
        fit: LRFit | str
        try:
            lrs = [m.lr for m in members if m.lr is not None]
            fit = fit_optimal_lr(lrs, [m.val_loss for m in members])
        except AnalysisError as exc:
            fit = str(exc)
        out.append(SweepFit(key, tuple(m.run for m in members), fit))
    return out


def _transfer_laws(sweeps: Sequence[SweepFit]) -> list[TransferLaw]:
    names = ("method", *AXES)
    laws = []
    for a, axis in enumerate(AXES, start=1):
        families: dict[tuple[Any, ...], list[tuple[float, float]]] = {}
        for s in sweeps:
            x = s.key[a]
            if isinstance(s.fit, str) or not isinstance(x, float):
                continue
            rest = tuple(v for i, v in enumerate(s.key) if i != a)
            families.setdefault(rest, []).append((x, s.fit.optimal_lr))
        for rest, pairs in families.items():
            if len({x for x, _ in pairs}) < 2:
                continue
            pairs.sort()
            xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
            fit: PowerLawFit | str
            try:
                fit = fit_power_law(xs, ys)
            except AnalysisError as exc:
                fit = str(exc)
            fixed = dict(zip([n for n in names if n != axis], rest, strict=True))
            laws.append(TransferLaw(axis, fixed, tuple(xs), tuple(ys), fit))
    return laws


def fit_group(
    records: Sequence[Mapping[str, Any]], baseline: str | None = None, floor: bool | None = None
) -> GroupAnalysis:
    """LR sweeps, transfer laws and scaling laws (with leverage over ``baseline``) of a group.

    Raises :class:`AnalysisError` for a malformed record (naming ``records[i].field``) or a
    ``baseline`` that is not a method with FLOPs in the group; failures of individual fits are
    reported inside the result instead.
    """
    runs = [parse_run(r, f"records[{i}]") for i, r in enumerate(records)]
    sweeps = _fit_sweeps(runs)
    laws = _transfer_laws(sweeps)
    with_flops = [r for r in runs if r.flops is not None]
    scaling: ScalingComparison | str | None = None
    if with_flops:
        methods = [r.method or "default" for r in with_flops]
        try:
            flops = [r.flops for r in with_flops if r.flops is not None]
            scaling = compare_methods(methods, flops, [r.val_loss for r in with_flops], baseline, floor)
        except AnalysisError as exc:
            if exc.field == "baseline":
                raise
            scaling = str(exc)
    elif baseline is not None:
        raise AnalysisError("baseline", f"{baseline!r} given but no run has flops; record each run's FLOPs")
    return GroupAnalysis(tuple(sweeps), tuple(laws), scaling, len(runs))
