"""The service's detectors replayed offline on a recorded run (issue 33): what would it have raised?

A recording (``bench/early_warning/ew_record.py``) holds every batch the hooks sent, in order. :func:`replay` feeds
them to :func:`monitor.alerting.detectors.detect`, the function the ingest route calls, exactly as the route
does: the batch's last value of each key (``last_per_key``) is stored first, then judged against a
store that already holds it. The store is :class:`MemoryReader`, a :class:`WindowReader` with the SQL
store's semantics (``monitor/store/trailing.py``): a series' values strictly before a step, the newest
``limit`` in step order; a re-sent step overwrites its value; NaN and +-Inf kept. Alerts are kept once
per (rule, name, layer, step), as the store's unique key keeps them.

A threshold search replays each run for many threshold sets. :class:`RunTrace` replays a run once:
every rule but ``logit_ceiling`` and ``z_growth`` at its base thresholds, and for those two what they
see at each point, none of which depends on their thresholds (the value, the series' previous stored
value, the fitted rise of its window). Any set that differs from the base only in
:data:`FAST_KEYS` is then a few array comparisons; any other set is replayed in full.
``tests/bench/test_ew_replay.py`` checks both give the same alerts.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np
from ew_gauges import recorded_thresholds, threshold_gauges, with_step_statistics, with_thresholds
from ew_score import EFFICIENCY_RULES

from hyperwatch.hooks.columns import PointColumns
from hyperwatch.hooks.schema import base_name
from hyperwatch.monitor.alerting.detectors import detect
from hyperwatch.monitor.alerting.trends import _head_steps, fitted_log_rise, growth_recent, recent_rise
from hyperwatch.monitor.store.points import last_per_key
from hyperwatch.monitor.thresholds.defaults import DEFAULT_THRESHOLDS, GROWTH_METRICS, thresholds_for

RUN_ID = 1
FAST_KEYS = frozenset(
    {
        "attention_lse_max_limit",
        "growth_factor",
        "growth_info_fraction",
        "growth_recent",
        *(f"{m}_growth_floor" for m in GROWTH_METRICS),
    }
)
_NOT_LIMITS = {"growth_info_fraction", "growth_recent"}  # fast keys that are no limit (never set to inf to go quiet)
COUNTED = frozenset({"warning", "critical"})  # an info alert pages nobody: never a warning
Fired = tuple[str, str, int, str, int | None]  # rule, severity, step, name, layer
SeriesKey = tuple[str, int | None]


class MemoryReader:
    """A :class:`WindowReader` over one run held in memory (``run_id`` is not looked at)."""

    def __init__(self) -> None:
        self._steps: dict[SeriesKey, list[int]] = {}
        self._values: dict[SeriesKey, list[float]] = {}

    def store(self, cols: PointColumns) -> None:
        """Store a batch: a key sent again (in this batch or an earlier one) keeps its last value."""
        names = cols.names
        for code, layer, step, value in zip(
            cols.name_index.tolist(), cols.layer.tolist(), cols.step.tolist(), cols.value.tolist()
        ):
            key = (names[code], None if layer < 0 else layer)
            steps = self._steps.get(key)
            if steps is None:
                self._steps[key], self._values[key] = [step], [value]
                continue
            values = self._values[key]
            if step > steps[-1]:
                steps.append(step)
                values.append(value)
                continue
            i = bisect_left(steps, step)
            if steps[i] == step:
                values[i] = value
            else:
                steps.insert(i, step)
                values.insert(i, value)

    def trailing_points(
        self, run_id: int, keys: Sequence[tuple[str, int | None, int]], limit: int
    ) -> list[list[tuple[int, float]]]:
        """Per key, the ``limit`` newest ``(step, value)`` strictly before its step, oldest first."""
        if limit < 1:
            raise ValueError(f"limit: the window must hold at least 1 point, got {limit}")
        out: list[list[tuple[int, float]]] = []
        for name, layer, before in keys:
            steps = self._steps.get((name, layer))
            if steps is None:
                out.append([])
                continue
            end = bisect_left(steps, before)
            start = max(0, end - limit)
            out.append(list(zip(steps[start:end], self._values[(name, layer)][start:end])))
        return out

    def trailing_windows(
        self, run_id: int, keys: Sequence[tuple[str, int | None, int]], limit: int
    ) -> list[list[float]]:
        return [[v for _s, v in w] for w in self.trailing_points(run_id, keys, limit)]


def decode_value(value: Any) -> float:
    """A recorded value: a number, or ``"NaN"``, ``"Infinity"``, ``"-Infinity"``."""
    if isinstance(value, str):
        if value not in ("NaN", "Infinity", "-Infinity"):
            raise ValueError(f"value {value!r}: a number, or one of NaN, Infinity, -Infinity")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"value {value!r}: a number, or one of NaN, Infinity, -Infinity")
    return float(value)


def to_columns(batch: Sequence[Sequence[Any]]) -> PointColumns:
    """A recorded batch, ``[[name, layer_or_null, step, value], ...]``, as the columns the route judges."""
    if any(len(p) != 4 for p in batch):
        raise ValueError("batch: each point is [name, layer_or_null, step, value]")
    return PointColumns.build(
        [str(p[0]) for p in batch],
        [int(p[2]) for p in batch],
        [decode_value(p[3]) for p in batch],
        [None if p[1] is None else int(p[1]) for p in batch],
        [None] * len(batch),
    )


def _sorted(alerts: list[Fired]) -> list[Fired]:
    return sorted(alerts, key=lambda a: (a[2], a[0], a[3], -1 if a[4] is None else a[4], a[1]))


def _replayed(
    batches: Sequence[PointColumns], thresholds: dict[str, Any] | None
) -> Iterator[tuple[int, PointColumns, MemoryReader, list[Fired]]]:
    """The ingest route's order, batch by batch: (index, the batch as stored, the reader holding it and
    every batch before, the alerts :func:`detect` raises on it not raised before for the same
    (rule, name, layer, step))."""
    reader = MemoryReader()
    seen: set[tuple[str, str, int | None, int]] = set()
    for b, raw in enumerate(batches):
        cols = last_per_key(raw)
        reader.store(cols)
        new: list[Fired] = []
        for a in detect(reader, RUN_ID, cols, thresholds):
            key = (a.rule, a.name, a.layer, a.step)
            if key not in seen:
                seen.add(key)
                new.append((a.rule, a.severity, a.step, a.name, a.layer))
        yield b, cols, reader, new


def replay(batches: Sequence[PointColumns], thresholds: dict[str, Any] | None = None) -> list[Fired]:
    """Every alert the service raises on these batches at these thresholds (overrides of the
    defaults), once per (rule, name, layer, step), sorted by step."""
    return _sorted([a for _b, _cols, _reader, new in _replayed(batches, thresholds) for a in new])


def _series(cols: PointColumns, wanted: np.ndarray) -> dict[SeriesKey, list[tuple[int, float]]]:
    """The batch's points of the names flagged in ``wanted``, per series (first-seen order), by step."""
    at = np.flatnonzero(wanted[cols.name_index])
    out: dict[SeriesKey, list[tuple[int, float]]] = {}
    names = cols.names
    for code, layer, step, value in zip(
        cols.name_index[at].tolist(), cols.layer[at].tolist(), cols.step[at].tolist(), cols.value[at].tolist()
    ):
        out.setdefault((names[code], None if layer < 0 else layer), []).append((step, value))
    for pts in out.values():
        pts.sort()
    return out


class _WindowState(NamedTuple):
    """What ``trends._growing`` reads of a growth window before comparing with the floor and the factor."""

    ok: bool  # enough points, and the last value and the fitted rise finite
    last: float  # the last value (NaN with too few points: not ok, whatever it is)
    fit: float  # the whole window's fitted rise
    late: float  # its last half's rise (``trends.recent_rise``)


class _CeilingPoint(NamedTuple):
    """What ``logit_ceiling`` sees at one logged point of a series it judges."""

    step: int
    value: float
    prev: float  # the series' value before (-inf where none is stored)
    is_z: bool  # attention Z, judged against the limit squared
    where: SeriesKey


class _GrowthPoint(NamedTuple):
    """What ``z_growth`` sees at one logged point of a growth metric, and at the series' point before."""

    step: int
    now: _WindowState
    prev: _WindowState
    metric: int  # the index in GROWTH_METRICS
    where: SeriesKey


class RunTrace:
    """One run replayed once, then its alerts at any threshold set (see the module's doc)."""

    def __init__(self, batches: Sequence[PointColumns], base: dict[str, Any] | None = None) -> None:
        self.batches = list(batches)
        self.base = thresholds_for(base)
        n, need = int(self.base["growth_window"]), max(2, int(self.base["growth_min_points"]))
        # the rules but these two at the base: the same detect() with no series above an infinite limit
        quiet = {**self.base, **{k: math.inf for k in FAST_KEYS - _NOT_LIMITS}}
        fits: dict[tuple[tuple[int, float], ...], tuple[float, float]] = {}  # a window's rises (whole, last half)
        self.fixed: list[Fired] = []
        ceil: list[_CeilingPoint] = []
        grow: list[_GrowthPoint] = []
        metric = {m: i for i, m in enumerate(GROWTH_METRICS)}
        for _b, cols, reader, new in _replayed(self.batches, quiet):
            self.fixed += new
            is_ceil = np.array([nm == "attention_z" or base_name(nm) == "attention_lse_max" for nm in cols.names])
            series = _series(cols, is_ceil) if len(cols) else {}
            heads = _head_steps(cols) if any(nm == "attention_lse_max" for nm, _ in series) else set()
            keys = [(nm, la, pts[0][0]) for (nm, la), pts in series.items()]
            for ((nm, la), pts), before in zip(series.items(), reader.trailing_points(RUN_ID, keys, 1)):
                if nm == "attention_lse_max" and all((la, s) in heads for s, _ in pts):
                    continue  # its heads are judged one by one
                prev = before[-1][1] if before else -math.inf  # none stored: no previous value above a limit
                for step, value in pts:
                    ceil.append(_CeilingPoint(step, value, prev, base_name(nm) == "attention_z", (nm, la)))
                    prev = value
            is_grow = np.array([nm in metric for nm in cols.names], dtype=bool)
            series = _series(cols, is_grow) if len(cols) else {}
            keys = [(nm, la, pts[0][0]) for (nm, la), pts in series.items()]
            for ((nm, la), pts), before in zip(series.items(), reader.trailing_points(RUN_ID, keys, n)):
                window = list(before)
                was = _state(window, n, need, fits)
                for step, value in pts:
                    window = [*window, (step, value)][-n:]
                    now = _state(window, n, need, fits)
                    grow.append(_GrowthPoint(step, now, was, metric[nm], (nm, la)))
                    was = now
        self._fixed_counted = np.array(_counted_steps(self.fixed), dtype=np.int64)
        self._ceil_step = np.array([c.step for c in ceil], dtype=np.int64)
        self._ceil_value = np.array([c.value for c in ceil], dtype=np.float64)
        self._ceil_prev = np.array([c.prev for c in ceil], dtype=np.float64)
        self._ceil_z = np.array([c.is_z for c in ceil], dtype=bool)
        self._ceil_where = [c.where for c in ceil]
        self._grow_step = np.array([g.step for g in grow], dtype=np.int64)
        self._grow_value = np.array([g.now.last for g in grow], dtype=np.float64)
        self._grow_fit = np.array([g.now.fit for g in grow], dtype=np.float64)
        self._grow_ok = np.array([g.now.ok for g in grow], dtype=bool)
        self._grow_late = np.array([g.now.late for g in grow], dtype=np.float64)
        self._prev_value = np.array([g.prev.last for g in grow], dtype=np.float64)
        self._prev_fit = np.array([g.prev.fit for g in grow], dtype=np.float64)
        self._prev_ok = np.array([g.prev.ok for g in grow], dtype=bool)
        self._prev_late = np.array([g.prev.late for g in grow], dtype=np.float64)
        self._grow_metric = np.array([g.metric for g in grow], dtype=np.int64)
        self._grow_where = [g.where for g in grow]

    def fast(self, thresholds: dict[str, Any] | None) -> dict[str, float] | None:
        """The merged thresholds when they differ from the base only in :data:`FAST_KEYS`, else None."""
        th = thresholds_for(thresholds)
        same = all(v == self.base[k] for k, v in th.items() if k not in FAST_KEYS)
        return th if same and th.keys() == self.base.keys() else None

    def _masks(self, th: dict[str, float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ceiling alerts, growth warnings, growth info alerts) over the traced points."""
        limit = th["attention_lse_max_limit"]
        lim = np.where(self._ceil_z, limit**2, limit)
        with np.errstate(invalid="ignore"):
            ceil = np.isfinite(self._ceil_value) & (self._ceil_value > lim) & ~(self._ceil_prev > lim)
        rise = math.log(th["growth_factor"])
        floor = np.array([th[f"{m}_growth_floor"] for m in GROWTH_METRICS], dtype=np.float64)[self._grow_metric]
        with np.errstate(invalid="ignore"):
            fit_ok, prev_fit_ok = self._grow_fit >= rise, self._prev_fit >= rise
            if growth_recent(th):
                fit_ok &= self._grow_late >= rise
                prev_fit_ok &= self._prev_late >= rise

        def growing(level: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            with np.errstate(invalid="ignore"):
                now = self._grow_ok & fit_ok & (self._grow_value >= level)
                was = self._prev_ok & prev_fit_ok & (self._prev_value >= level)
            return now, was

        now_w, was_w = growing(floor)
        warn = now_w & ~was_w
        info_fraction = min(1.0, max(0.0, th.get("growth_info_fraction", 1.0)))
        if info_fraction < 1:
            now_i, was_i = growing(info_fraction * floor)
            info = now_i & ~was_i & ~now_w
        else:
            info = np.zeros_like(warn)
        return ceil, warn, info

    def alerts(self, thresholds: dict[str, Any] | None = None) -> list[Fired]:
        """What :func:`replay` gives at these thresholds (overrides of the defaults)."""
        th = self.fast(thresholds)
        if th is None:
            return replay(self.batches, thresholds)
        ceil, warn, info = self._masks(th)
        out = list(self.fixed)
        seen: set[tuple[str, str, int | None, int]] = set()
        found = [(i, "logit_ceiling", "critical", self._ceil_step, self._ceil_where) for i in np.flatnonzero(ceil)]
        found += [(i, "z_growth", "warning", self._grow_step, self._grow_where) for i in np.flatnonzero(warn)]
        found += [(i, "z_growth", "info", self._grow_step, self._grow_where) for i in np.flatnonzero(info)]
        found.sort(key=lambda f: (f[1], f[0]))  # per rule in trace (batch) order: the first of a key is kept
        for i, rule, severity, steps, where in found:
            name, layer = where[i]
            step = int(steps[i])
            if (rule, name, layer, step) not in seen:
                seen.add((rule, name, layer, step))
                out.append((rule, severity, step, name, layer))
        return _sorted(out)

    def first_warnings(self, thresholds: dict[str, Any] | None, since: int | None) -> tuple[int | None, int | None]:
        """(first warning step, first at or after ``since``) of the rules judged by the loss (warning or
        critical; not the MaxVio guard), or None where none."""
        th = self.fast(thresholds)
        if th is None:
            steps = np.array(_counted_steps(replay(self.batches, thresholds)), dtype=np.int64)
        else:
            ceil, warn, _info = self._masks(th)
            steps = np.concatenate([self._fixed_counted, self._ceil_step[ceil], self._grow_step[warn]])
        first = int(steps.min()) if len(steps) else None
        if since is None:
            return first, None
        later = steps[steps >= since]
        return first, int(later.min()) if len(later) else None


def _counted_steps(alerts: Sequence[Fired]) -> list[int]:
    """The steps of the alerts that count as a warning of the loss (as ``ew_score.first_loss_warning``)."""
    return [a[2] for a in alerts if a[1] in COUNTED and a[0] not in EFFICIENCY_RULES]


def _state(
    window: list[tuple[int, float]], n: int, need: int, fits: dict[tuple[tuple[int, float], ...], tuple[float, float]]
) -> _WindowState:
    """A growth window's state, its fits looked up in ``fits`` (a window met again is not fitted again)."""
    if len(window) < need or not window:
        return _WindowState(False, math.nan, math.nan, math.nan)
    key = tuple(window[-n:])
    found = fits.get(key)
    if found is None:
        found = fits[key] = (fitted_log_rise(key), recent_rise(key, n))
    fitted, late = found
    last = window[-1][1]
    return _WindowState(math.isfinite(last) and math.isfinite(fitted), last, fitted, late)


# --- the Prometheus source: the recorded /metrics scrapes, with a threshold set's gauges written in ---


def rule_severities(rules: Path) -> dict[str, str]:
    """Alert name -> its ``severity`` label in a Prometheus rules file."""
    import yaml

    doc = yaml.safe_load(rules.read_text())
    return {
        r["alert"]: str(r.get("labels", {}).get("severity", "warning"))
        for g in doc["groups"]
        for r in g["rules"]
        if "alert" in r
    }


def counted_prom_steps(fired: dict[str, list[int]], logged_steps: Sequence[int], severity: dict[str, str]) -> list[int]:
    """The logged steps at which a Prometheus alert that counts as a warning of the loss fired."""
    return [
        logged_steps[i]
        for alert, at in fired.items()
        if severity.get(alert, "warning") in COUNTED and alert not in EFFICIENCY_RULES
        for i in at
        if i < len(logged_steps)
    ]


def _run_label(columns: dict[str, Any]) -> str | None:
    """The ``run`` label of a recording's scraped series (the name the service knew the run by)."""
    for key in columns:
        at = key.find('run="')
        if at >= 0:
            return key[at + 5 : key.index('"', at + 5)]
    return None


class Scraped(Protocol):
    name: str
    scrapes: dict[str, list[float | None]]
    logged_steps: list[int]
    onset: int | None


def prom_warnings(
    runs: Sequence[Scraped],
    over_of: Mapping[str, dict[str, float]],
    keys: Sequence[str],
    rules: Path,
    workdir: Path,
    pace: float = 1.0,
) -> tuple[dict[str, tuple[int | None, int | None]], list[str]]:
    """Per run, (first warning, first at or after its onset) of the Prometheus rules replayed by promtool
    (one call) over its scrapes, the gauges of ``keys`` rewritten to its threshold set ``over_of[name]``,
    taken at ``pace`` scrapes per logged step (``ew_prom.at_pace``); and the keys that could not be
    rewritten (no gauge, or none recorded)."""
    from ew_prom import at_pace, from_columns, replay

    scrapes: dict[str, Any] = {}
    label_of: dict[str, str] = {}
    steps_of: dict[str, list[int]] = {}
    missing: set[str] = set()
    for r in runs:
        columns, lost = with_thresholds(r.scrapes, over_of[r.name], keys)
        columns = with_step_statistics(columns, over_of[r.name], r.logged_steps)  # a recording older than those gauges
        columns, steps_of[r.name] = at_pace(columns, r.logged_steps, pace)
        missing.update(lost)
        label_of[r.name] = _run_label(columns) or r.name
        scrapes[label_of[r.name]] = from_columns(columns)
    fired = replay(scrapes, rules, workdir) if scrapes else {}
    severity = rule_severities(rules)
    out: dict[str, tuple[int | None, int | None]] = {}
    for r in runs:
        steps = sorted(counted_prom_steps(fired.get(label_of[r.name], {}), steps_of[r.name], severity))
        after = None if r.onset is None else next((s for s in steps if s >= r.onset), None)
        out[r.name] = (steps[0] if steps else None, after)
    return out, sorted(missing)


def _not_default(recorded: dict[str, float]) -> dict[str, float]:
    return {
        k: v
        for k, v in recorded.items()
        if k in DEFAULT_THRESHOLDS and not math.isclose(v, DEFAULT_THRESHOLDS[k], rel_tol=1e-9)
    }


def threshold_spans(
    scrapes: dict[str, list[float | None]], logged_steps: Sequence[int]
) -> list[tuple[int, dict[str, float]]]:
    """(first logged step, thresholds where not the defaults) of each stretch of scrapes (one per logged step)
    over which the service exported one threshold set: more than one where the group learned mid-run (a
    sibling finished while the run trained). Each scrape reads the latest value of each gauge so far (before
    a gauge's first value, that value). Without ``logged_steps``, one stretch: the first value of each."""
    names = {gauge for gauge, _as_log in threshold_gauges().values()}
    scrapes = {k: v for k, v in scrapes.items() if k.split("{", 1)[0] in names}  # all recorded_thresholds reads
    n = min(len(logged_steps), max((len(v) for v in scrapes.values()), default=0))
    spans: list[tuple[int, dict[str, float]]] = []
    for i in range(n):
        at_i = {k: [*v[i::-1], *v[i + 1 :]] for k, v in scrapes.items()}  # the latest at or before i first
        over = _not_default(recorded_thresholds(at_i))
        if not spans or spans[-1][1] != over:
            spans.append((logged_steps[i], over))
    return spans or [(0, _not_default(recorded_thresholds(scrapes)))]


def compare_recorded(
    trace: RunTrace,
    scrapes: dict[str, list[float | None]],
    service_alerts: Sequence[dict[str, Any]],
    logged_steps: Sequence[int] = (),
) -> tuple[dict[str, float], set[tuple[Any, ...]], set[tuple[Any, ...]]]:
    """The replay at the thresholds the recording's service exported (its gauges) against the alerts it
    stored, as (rule, step, name, layer): (those thresholds where not the defaults, only the service's,
    only the replay's). With the run's ``logged_steps`` (one scrape each), a run whose group learned while
    it trained is replayed at each stretch's thresholds for the steps of that stretch
    (:func:`threshold_spans`; the first stretch's are returned). ``forecast_band`` (a group's size forecast)
    is not replayed."""
    spans = threshold_spans(scrapes, logged_steps)
    got: set[tuple[Any, ...]] = set()
    for k, (start, over) in enumerate(spans):
        end = spans[k + 1][0] if k + 1 < len(spans) else math.inf
        got |= {(a[0], a[2], a[3], a[4]) for a in trace.alerts(over) if (k == 0 or a[2] >= start) and a[2] < end}
    want = {(a["rule"], int(a["step"]), a["name"], a["layer"]) for a in service_alerts if a["rule"] != "forecast_band"}
    return spans[0][1], want - got, got - want
