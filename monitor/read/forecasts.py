"""The forecasts' read layer: the API, ``hyperwatch forecast`` and the pages call these and nothing else.

- :func:`group_forecast`: for each stability indicator, its peak and final value against model
  size (``total_params``) or training FLOPs over the group's runs, compared at the matched fraction
  of training (:func:`monitor.read.lines.match_runs` and :func:`~monitor.read.lines.truncate`, the verdicts'
  rule, on the lines :func:`~monitor.read.lines.aggregate_series` draws), fitted and evaluated at a target
  by :mod:`monitor.analysis.forecast`.
- :func:`run_forecast`: a run at the group's largest size (with at least three smaller sizes) is
  *watched*: its peak so far against the band its smaller runs forecast for its size at the same
  fraction of training (:mod:`monitor.analysis.forecast_track`). The forecast alert reads the same
  bands (:mod:`monitor.alerting.forecast_band`).

While a watched run trains it is held out of the group's fit (its points are partial, and fitting
it would forecast it from itself); the panel shows it beside the fit instead. Once finished it is
one of the group's runs like any other.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hyperwatch.monitor.analysis import AnalysisError, jsonable
from hyperwatch.monitor.analysis.forecast import (
    DEFAULT_LEVEL,
    MIN_SIZES,
    UNIT,
    Axis,
    Forecast,
    describe,
    fmt_size,
    fmt_value,
    forecast,
    label,
)
from hyperwatch.monitor.analysis.forecast_track import (
    Position,
    TrackBand,
    Trajectory,
    position,
    position_sentence,
    track_band,
)
from hyperwatch.monitor.core.errors import InvalidInputError
from hyperwatch.monitor.read.lines import (
    STABILITY_INDICATORS,
    Agg,
    AggSeries,
    Matching,
    ScaleField,
    TokenMap,
    aggregate_series,
    group_runs,
    match_runs,
    scale_of,
    stability_values,
    truncate,
)
from hyperwatch.monitor.store.base import Store
from hyperwatch.monitor.store.entities import Group, Run
from hyperwatch.monitor.thresholds.defaults import DEFAULT_THRESHOLDS

AXIS_FIELD: dict[Axis, ScaleField] = {"params": "total_params", "flops": "flops"}
DEFAULT_LIMITS: dict[str, float] = {"attention_z": 1000.0, "max_vio": DEFAULT_THRESHOLDS["max_vio_limit"]}
"""The threshold a forecast crosses when the group sets none (``<indicator>_limit`` in its thresholds).

Attention Z = 1000 is an LSE of about 32: the softmax's largest logit some 30 nats above the rest,
attention collapsed onto single keys (the demo's breaking arm reaches it at d=4, 1M parameters,
while HyperP stays near 40). MaxVio's is the detector's collapse limit. Other indicators have no
default: a group sets ``attention_rms_limit``... to have their crossing forecast."""
DEFAULT_BUCKETS = 200
"""Buckets of each run's line: a bucket keeps each layer's max, so a peak survives any width; 200 place it
within half a percent of training, and a coarser bucket is read from the store's rollups where 1000
(the stability API's default) reads nearly every point of a long run."""
DEFAULT_TARGET_FACTOR = 10.0
"""The pages' target when none is given: ten times the group's largest run (the next run up)."""


def limit_of(group: Group, name: str) -> tuple[float | None, str]:
    """(threshold, its key in the group's thresholds): the group's own, else the default, else None."""
    key = f"{name}_limit"
    raw = group.thresholds.get(key)
    return (float(raw) if raw is not None else DEFAULT_LIMITS.get(name)), key


def _total_steps(run: Run) -> int | None:
    """Steps of the whole run: its total_steps, else (finished) the steps it took."""
    if run.total_steps:
        return run.total_steps
    return run.last_step + 1 if run.status == "finished" and run.last_step is not None else None


def _progress(run: Run) -> float | None:
    """Fraction of training done, as the verdicts' matching counts it (None: cannot be placed)."""
    if run.last_step is None:
        return None
    if run.status == "finished":
        return 1.0
    return min(1.0, (run.last_step + 1) / run.total_steps) if run.total_steps else None


def split_watched(runs: Sequence[Run]) -> tuple[list[Run], list[Run]]:
    """(runs at the largest size in parameters, the runs smaller than it) when the smaller ones
    span at least :data:`MIN_SIZES` sizes; else ([], []): nothing to watch against."""
    sizes = {r.id: scale_of(r, "total_params") for r in runs}
    known = {s for s in sizes.values() if s is not None}
    if not known:
        return [], []
    top = max(known)
    if len(known) - 1 < MIN_SIZES:
        return [], []
    smaller = [r for r in runs if (s := sizes[r.id]) is not None and s < top]
    return [r for r in runs if sizes[r.id] == top], smaller


class _LineCache:
    """Each run's lines, memoised on the run's state (id, last_point_at, updated_at) and the read.

    Every batch moves ``last_point_at`` and every change of the run moves ``updated_at``, so a hit is
    the line the store would give: a finished run's lines are read once, not on every forecast (the
    panel asks again for each target, the alert's watch every 30 s).
    """

    def __init__(self, size: int = 2048) -> None:
        self.size = size
        self.items: OrderedDict[tuple[Any, ...], dict[str, AggSeries]] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, store: Store, run: Run, names: Sequence[str], agg: Agg, buckets: int) -> dict[str, AggSeries]:
        key = (id(store), run.id, run.last_point_at, run.updated_at, agg, buckets)
        with self.lock:
            known = self.items.get(key)
            if known is not None:
                self.items.move_to_end(key)
        lines = dict(known) if known is not None else {}
        missing = [n for n in names if n not in lines]
        if missing:
            latest = store.list_series(run.id)
            have = {s.name for s in latest}
            no_tokens = TokenMap((), None)  # fractions come from steps: skip the tokens lookup
            for name in missing:
                line = aggregate_series(store, run, name, agg, buckets, latest, no_tokens) if name in have else None
                lines[name] = line if line is not None and line.values else _NO_LINE
            with self.lock:
                self.items[key] = lines
                while len(self.items) > self.size:
                    self.items.popitem(last=False)
        return {n: lines[n] for n in names if lines[n] is not _NO_LINE}


_NO_LINE = AggSeries([], [], [], None, False, 0, False)
"""What the cache keeps for an indicator the run does not store (so it is not asked again)."""
_cache = _LineCache()


def _lines(
    store: Store, runs: Sequence[Run], names: Sequence[str], agg: Agg, buckets: int
) -> dict[tuple[int, str], AggSeries]:
    """Each run's line of each indicator it stores (the scale page's line), read once per run state."""
    return {(run.id, n): line for run in runs for n, line in _cache.get(store, run, names, agg, buckets).items()}


def _trajectory(run: Run, size: float, line: AggSeries) -> Trajectory | None:
    total, progress = _total_steps(run), _progress(run)
    if total is None or progress is None:
        return None
    return Trajectory.of(run.name, size, line.steps, line.values, total, progress)


@dataclass(frozen=True)
class Watch:
    """A watched run and, per indicator, the band over its training and where it stands."""

    run: Run
    size: float
    bands: dict[str, TrackBand]
    lines: dict[str, Trajectory]
    compared: tuple[dict[str, Any], ...]
    axis: Axis = "params"

    def position(self, name: str) -> Position | None:
        line = self.lines.get(name)
        return position(self.bands[name], line) if line is not None else None

    def indicator_json(self, name: str) -> dict[str, Any]:
        band, line = self.bands[name], self.lines.get(name)
        pos = self.position(name)
        run: dict[str, Any] = {"fraction": [], "value": [], "peak": []}
        if line is not None:
            run = {"fraction": line.fraction, "value": line.value, "peak": line.running_peak}
        return jsonable(
            {
                "band": band,
                "run": run,
                "now": pos,
                "sentence": position_sentence(band, pos, "params" if self.axis == "params" else "FLOPs"),
            }
        )


def _unwatched(run: Run, runs: Sequence[Run], axis: Axis) -> tuple[str | None, list[Run]]:
    """(why ``run`` is not watched or None, the runs smaller than it)."""
    watched, smaller = split_watched(runs)
    if run.id not in {r.id for r in watched}:
        return (
            f"not watched: a run is compared with the forecast when it is at its group's largest size in "
            f"parameters and the group holds runs at {MIN_SIZES} or more smaller sizes"
        ), []
    if scale_of(run, AXIS_FIELD[axis]) is None:
        return f"not watched: the run has no {AXIS_FIELD[axis]}; set it on the run", []
    if _total_steps(run) is None:
        return "not watched: the run has no total_steps to place its points at a fraction of training; set it", []
    return None, smaller


def _watch(
    run: Run,
    smaller: Sequence[Run],
    names: Sequence[str],
    lines: dict[tuple[int, str], AggSeries],
    level: float,
    axis: Axis,
) -> Watch:
    """The bands of ``run`` (watched: see :func:`_unwatched`) from the smaller runs' ``lines``."""
    size_field = AXIS_FIELD[axis]
    size = scale_of(run, size_field)
    assert size is not None
    bands: dict[str, TrackBand] = {}
    own: dict[str, Trajectory] = {}
    compared = tuple(
        {"run": r.name, "run_id": r.id, "size": scale_of(r, size_field), "progress": _progress(r)} for r in smaller
    )
    for name in names:
        trajectories = []
        for other in smaller:
            s, line = scale_of(other, size_field), lines.get((other.id, name))
            t = None if s is None or line is None else _trajectory(other, s, line)
            if t is not None:
                trajectories.append(t)
        if len({t.size for t in trajectories}) < MIN_SIZES:
            continue
        bands[name] = track_band(name, trajectories, size, level)
        mine = lines.get((run.id, name))
        t = None if mine is None else _trajectory(run, size, mine)
        if t is not None:
            own[name] = t
    return Watch(run, size, bands, own, compared, axis)


def watch_of(
    store: Store,
    run: Run,
    runs: Sequence[Run],
    names: Sequence[str],
    agg: Agg = "mean",
    level: float = DEFAULT_LEVEL,
    buckets: int = DEFAULT_BUCKETS,
) -> Watch | str:
    """The :class:`Watch` of ``run`` among its group's ``runs`` (in parameters), or why it is not watched."""
    why, smaller = _unwatched(run, runs, "params")
    if why is not None:
        return why
    return _watch(run, smaller, names, _lines(store, [run, *smaller], names, agg, buckets), level, "params")


def run_forecast(
    store: Store,
    run_id: int,
    names: Sequence[str] = STABILITY_INDICATORS,
    agg: Agg = "mean",
    level: float = DEFAULT_LEVEL,
    buckets: int = DEFAULT_BUCKETS,
) -> dict[str, Any]:
    """What ``GET /api/v1/runs/{id}/forecast`` returns and the run page draws."""
    run = store.get_run(run_id)
    out: dict[str, Any] = {"run_id": run.id, "run": run.name, "group_id": run.group_id, "group": run.group,
                           "agg": agg, "level": level, "watched": False, "reason": None, "indicators": {}}  # fmt: skip
    if run.group_id is None:
        out["reason"] = "not watched: the run is in no group"
        return out
    _, runs = group_runs(store, run.group_id)
    watch = watch_of(store, run, runs, names, agg, level, buckets)
    if isinstance(watch, str):
        out["reason"] = watch
        return out
    out.update(watched=True, size=watch.size, compared_with=list(watch.compared))
    out["indicators"] = {name: watch.indicator_json(name) for name in watch.bands}
    return jsonable(out)  # type: ignore[no-any-return]


# -- the group's forecast ------------------------------------------------------------------------
@dataclass
class GroupInputs:
    """What a group's forecast is fitted on: each indicator's (size, peak, final) per run, compared
    at ``matching``'s fraction of training, and the watched runs held out (see the module doc)."""

    group: Group
    axis: Axis
    agg: Agg
    matching: Matching
    points: dict[str, list[tuple[str, float, float, float]]] = field(default_factory=dict)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    held_out: list[Run] = field(default_factory=list)
    lines: dict[tuple[int, str], AggSeries] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)

    def largest(self) -> float | None:
        """The largest size of the group's runs (on the axis), trained or training."""
        sizes = [s for r in self.runs if (s := scale_of(r, AXIS_FIELD[self.axis])) is not None]
        return max(sizes) if sizes else None


def collect(
    store: Store,
    group_id: int,
    names: Sequence[str] = STABILITY_INDICATORS,
    axis: Axis = "params",
    agg: Agg = "mean",
    buckets: int = DEFAULT_BUCKETS,
) -> GroupInputs:
    """Read everything a group's forecast needs, each run's line once."""
    group, runs = group_runs(store, group_id)
    watched, _ = split_watched(runs)
    held_out = [r for r in watched if r.status != "finished"]
    fit_runs = [r for r in runs if r not in held_out]
    matching = match_runs(fit_runs)
    field_name = AXIS_FIELD[axis]
    inputs = GroupInputs(group, axis, agg, matching, skipped=list(matching.pending), held_out=held_out, runs=runs)
    pending = {p["run_id"] for p in matching.pending}
    placed = [r for r in fit_runs if r.id in matching.cutoff and scale_of(r, field_name) is not None]
    to_read = {r.id: r for r in placed} if matching.reason is None else {}
    for run in held_out:  # its line and the smaller runs' (their trajectories), whatever the matching says
        to_read.update((r.id, r) for r in (run, *_unwatched(run, runs, axis)[1]))
    inputs.lines = _lines(store, list(to_read.values()), names, agg, buckets)
    for run in fit_runs:
        size = scale_of(run, field_name)
        if size is None:
            inputs.skipped.append({"run": run.name, "run_id": run.id, "reason": f"no {field_name}; set it on the run"})
        elif run.id not in matching.cutoff and run.id not in pending and matching.reason is None:
            inputs.skipped.append({"run": run.name, "run_id": run.id, "reason": "no points yet"})
    for run in placed if matching.reason is None else []:
        size = scale_of(run, field_name)
        assert size is not None
        for name in names:
            line = inputs.lines.get((run.id, name))
            if line is None:
                continue
            values = stability_values(truncate(line, matching.cutoff[run.id]), name)
            if values:
                inputs.points.setdefault(name, []).append((run.name, size, float(np.max(values)), values[-1]))
    return inputs


@dataclass(frozen=True)
class GroupForecast:
    inputs: GroupInputs
    target: float | None
    level: float
    forecasts: dict[str, tuple[Forecast, Forecast]]
    watches: tuple[Watch, ...]

    def to_json(self) -> dict[str, Any]:
        inp = self.inputs
        indicators = {}
        for name, (peak, final) in self.forecasts.items():
            limit, key = limit_of(inp.group, name)
            indicators[name] = {
                "threshold": limit,
                "threshold_key": key,
                "peak": forecast_json(peak),
                "final": forecast_json(final),
            }
        watched = []
        for w in self.watches:
            entry = {"run": w.run.name, "run_id": w.run.id, "status": w.run.status, "size": w.size}
            entry["indicators"] = {
                n: {k: v for k, v in w.indicator_json(n).items() if k in ("now", "sentence")}
                for n in self.forecasts
                if n in w.bands
            }
            watched.append(entry)
        return jsonable(  # type: ignore[no-any-return]
            {
                "group_id": inp.group.id,
                "group": inp.group.name,
                "project": inp.group.project,
                "axis": inp.axis,
                "agg": inp.agg,
                "level": self.level,
                "target": self.target,
                "matched": inp.matching.to_json(),
                "skipped": inp.skipped,
                "held_out": [
                    {"run": r.name, "run_id": r.id, "reason": "watched while it trains"} for r in inp.held_out
                ],
                "indicators": indicators,
                "watched": watched,
            }
        )


def forecast_group(inputs: GroupInputs, target: float | None, level: float = DEFAULT_LEVEL) -> GroupForecast:
    """The forecasts of ``inputs`` at ``target`` (None: the fit and the crossing only)."""
    forecasts = {}
    try:
        for name, pts in inputs.points.items():
            limit, key = limit_of(inputs.group, name)
            runs, sizes = [p[0] for p in pts], [p[1] for p in pts]
            common: dict[str, Any] = {"axis": inputs.axis, "target": target, "threshold": limit, "level": level}
            peak = forecast(name, sizes, [p[2] for p in pts], runs, summary="peak", threshold_key=key, **common)
            final = forecast(name, sizes, [p[3] for p in pts], runs, summary="final", threshold_key=key, **common)
            forecasts[name] = (peak, final)
    except AnalysisError as exc:
        raise InvalidInputError(str(exc)) from exc
    watches = []
    names = sorted({name for _, name in inputs.lines})
    for run in inputs.held_out:
        why, smaller = _unwatched(run, inputs.runs, inputs.axis)
        if why is None:
            watches.append(_watch(run, smaller, names, inputs.lines, level, inputs.axis))
    return GroupForecast(inputs, target, level, forecasts, tuple(watches))


def group_forecast(
    store: Store,
    group_id: int,
    names: Sequence[str] = STABILITY_INDICATORS,
    axis: Axis = "params",
    target: float | None = None,
    agg: Agg = "mean",
    level: float = DEFAULT_LEVEL,
    buckets: int = DEFAULT_BUCKETS,
) -> GroupForecast:
    """:func:`collect` then :func:`forecast_group`: what the API and ``hyperwatch forecast`` return."""
    return forecast_group(collect(store, group_id, names, axis, agg, buckets), target, level)


UNRELIABLE_RATIO = 100.0
"""A band whose upper edge is more than this times its lower edge (two decades) predicts nothing:
the forecast says so and gives the band, not its centre as a value."""


def reliable(f: Forecast) -> bool:
    """Whether ``f``'s prediction at its target means something: a band within :data:`UNRELIABLE_RATIO`."""
    if f.predicted is None or f.lower is None or f.upper is None:
        return True  # nothing predicted: nothing to call unreliable
    lo, hi = f.lower, f.upper
    return math.isfinite(lo) and math.isfinite(hi) and lo > 0 and hi / lo <= UNRELIABLE_RATIO


def forecast_json(f: Forecast) -> dict[str, Any]:
    """``f.to_json()`` with ``reliable``; when the band is too wide, the sentence gives the band and
    no point value ("no reliable prediction at 1.3B params (90% band 2.35e-06 to 4.33e+11)")."""
    out: dict[str, Any] = f.to_json()
    out["reliable"] = reliable(f)
    if not out["reliable"]:
        assert f.target is not None and f.lower is not None and f.upper is not None
        head = f"{f.summary} {label(f.name)}: "
        rest = describe(replace(f, predicted=None))
        assert rest.startswith(head)
        clause = (
            f"no reliable prediction at {fmt_size(f.target, f.axis)} {UNIT[f.axis]} "
            f"({f.level:.0%} band {fmt_value(f.lower)} to {fmt_value(f.upper)}, more than "
            f"{UNRELIABLE_RATIO:,.0f}x wide)"
        )
        body = rest[len(head) :]
        out["sentence"] = f"{head}{clause}, {body}" if body and body != "." else f"{head}{clause}."
    return out


def default_target(inputs: GroupInputs) -> float | None:
    """The pages' target when none is asked for: :data:`DEFAULT_TARGET_FACTOR` x the largest run."""
    largest = inputs.largest()
    return None if largest is None else largest * DEFAULT_TARGET_FACTOR
