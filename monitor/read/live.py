"""The live read: what an open page lacks since it last drew, and nothing it already has.

A page draws a run once (the whole series, downsampled by :mod:`monitor.read.lines`), remembers the
last step it was read up to (its *cursor*) and then asks :func:`run_delta` for the points after
it. The delta is read with the same rules as the first read, so a live page and a reloaded page
draw the same numbers:

- a per-layer indicator is aggregated over layers per bucket (each layer's max in the bucket, then
  the mean or the max over layers: :func:`monitor.read.lines.aggregate_series`), in buckets of
  ``every`` steps (the first read's bucket width, so the line keeps its density and its spikes);
- a run-level metric or one layer is min/max-downsampled by the store, NaN/Inf points always kept;
- the heatmap's new columns are the layers' max per bucket (``store.layer_matrix``).

Nothing here runs on the ingest path: the stream route waits on :mod:`monitor.read.live_notify` (the
points route sets an event per stored batch; a slow fallback read covers other replicas), reads the
runs' ``last_step`` (``store.run_heads``: one small read) and builds a delta only for runs that moved.
A page that keeps up asks for one new step: its points are each series' latest value, which the store
keeps in memory for the batches this process stored (``store.newest_points``: served only while the
run's row shows no other batch since, else read), so such an answer reads no point from the database.
"""

from __future__ import annotations

import json
import math
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hyperwatch.hooks.schema import encode_value
from hyperwatch.monitor.analysis import jsonable
from hyperwatch.monitor.read.lines import TokenMap, XAxis, XAxisError, is_stale, x_values
from hyperwatch.monitor.read.live_notify import FALLBACK_S, news
from hyperwatch.monitor.store.base import Store
from hyperwatch.monitor.store.entities import Alert, Run, SeriesInfo

LINE_MODES = ("mean", "max", "heat")
"""What a page asks per indicator: the mean or max over layers, the heatmap's columns, or a layer number."""
MAX_DELTA_BUCKETS = 2000


@dataclass(frozen=True)
class Cursor:
    """Where a page's drawing of one run stops: its last step read (-1: nothing yet) and status."""

    run_id: int
    step: int
    status: str | None

    @classmethod
    def parse(cls, text: str) -> Cursor:
        """``"<run_id>:<step>[:<status>]"``; raises ValueError naming the expected form."""
        parts = text.split(":")
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            return cls(int(parts[0]), int(parts[1]), parts[2] if len(parts) == 3 and parts[2] else None)
        except ValueError:
            raise ValueError(
                f"cursor: {text!r} is not '<run_id>:<last step drawn>[:<status>]' (e.g. '12:480:running')"
            ) from None

    def moved(self, last_step: int | None, status: str) -> bool:
        """Whether a run at ``last_step`` with ``status`` has points or a status the page has not drawn."""
        return (last_step is not None and last_step > self.step) or (self.status is not None and status != self.status)


class _RecentIndex:
    """``store.list_series(run)`` kept for ``ttl_s``: which (name, layer) series a run has changes
    rarely, and a live page asks for it with every answer (the points themselves are read fresh; a
    new layer of a series already known shows up within ``ttl_s``)."""

    def __init__(self, ttl_s: float = 5.0, size: int = 256) -> None:
        self.ttl_s, self.size = ttl_s, size
        # per store (weakly: a closed store's entries go with it), run id -> (when read, index)
        self.items: weakref.WeakKeyDictionary[Store, dict[int, tuple[float, list[SeriesInfo]]]] = (
            weakref.WeakKeyDictionary()
        )
        self.lock = threading.Lock()

    def get(self, store: Store, run_id: int, names: Sequence[str]) -> list[SeriesInfo]:
        """The index, read again when older than ``ttl_s`` or lacking one of ``names`` (so the first
        points of a series are never skipped by a stale index)."""
        now = time.monotonic()
        with self.lock:
            hit = self.items.get(store, {}).get(run_id)
        if hit is not None and now - hit[0] < self.ttl_s and set(names) <= {s.name for s in hit[1]}:
            return hit[1]
        return self.refresh(store, run_id)

    def refresh(self, store: Store, run_id: int) -> list[SeriesInfo]:
        """The index read now (and kept)."""
        now = time.monotonic()
        found = store.list_series(run_id)
        with self.lock:
            runs = self.items.setdefault(store, {})
            if len(runs) >= self.size:
                runs.pop(next(iter(runs)))
            runs[run_id] = (now, found)
        return found


_index = _RecentIndex()


class _RecentAlerts:
    """``store.list_alerts(run_id=...)`` kept while this process announces no new alert event of the run
    (:mod:`monitor.read.live_notify`), for at most :data:`FALLBACK_S` s (alerts stored by another replica or
    delivered by Alertmanager): a live page asks for them with every answer, and they rarely change."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self.items: weakref.WeakKeyDictionary[Store, dict[tuple[int, int], tuple[float, int, list[Alert]]]] = (
            weakref.WeakKeyDictionary()
        )
        self.lock = threading.Lock()

    def get(self, store: Store, run_id: int, limit: int) -> list[Alert]:
        now, announced = time.monotonic(), news.alerts(run_id)
        with self.lock:
            hit = self.items.get(store, {}).get((run_id, limit))
        if hit is not None and hit[1] == announced and now - hit[0] < FALLBACK_S:
            return hit[2]
        found = store.list_alerts(run_id=run_id, limit=limit)
        with self.lock:
            runs = self.items.setdefault(store, {})
            if len(runs) >= self.size:
                runs.pop(next(iter(runs)))
            runs[(run_id, limit)] = (now, announced, found)
        return found


_alerts = _RecentAlerts()


def _buckets(after: int, last: int, every: int) -> int:
    return max(1, min(MAX_DELTA_BUCKETS, -(-(last - after) // max(1, every))))


def _aggregate(cells: Sequence[float], agg: str) -> float:
    if any(math.isnan(v) for v in cells):
        return math.nan
    return max(cells) if agg == "max" else math.fsum(cells) / len(cells)


def token_map_since(store: Store, run: Run, latest: Sequence[SeriesInfo], after: int) -> TokenMap:
    """Tokens as a function of step from the new points on (and the last one before: interpolation)."""
    names = {(s.name, s.layer) for s in latest}
    ref = next((k for k in (("tokens", None), ("loss", None), ("lr", None)) if k in names), None)
    if ref is None:
        return TokenMap.of(store, run, latest)
    s = store.series(run.id, ref[0], ref[1], MAX_DELTA_BUCKETS, max(0, after), None)
    known = tuple((p.step, p.tokens) for p in s.points if p.tokens is not None)
    per_step = run.tokens / run.total_steps if run.tokens and run.total_steps else None
    if len(known) >= 2:
        return TokenMap(known, per_step)
    if len(known) == 1 and known[0][0] > 0 and per_step is None:
        per_step = known[0][1] / known[0][0]
    return TokenMap((), per_step)


def _wire(v: float | None) -> float | str | None:
    """A value as JSON carries it: "NaN", "Infinity", "-Infinity" for the non-finite (see :func:`to_json`)."""
    return v if v is None or math.isfinite(v) else encode_value(v)


def _line(steps: list[int], tokens: list[int | None], values: list[float], run: Run, x: XAxis) -> dict[str, Any]:
    xs = x_values(run, steps, tokens, x)
    keep = [i for i, v in enumerate(xs) if v is not None]
    return {"step": [steps[i] for i in keep], "x": [xs[i] for i in keep], "y": [_wire(values[i]) for i in keep]}


FAST_STEPS = 256
"""Up to this many new steps, the delta is read as raw points (all layers of all names in a few
statements: ``store.trailing_points``) and bucketed here by the store's own rules, instead of a
downsampled read per layer; a page that keeps up asks for a step or two at a time."""


def _bucket_max(pts: Sequence[tuple[int, float]], lo: int, w: int) -> dict[int, float]:
    """Each bucket's max, a NaN making the bucket NaN (``store.layer_matrix``'s cells)."""
    out: dict[int, float] = {}
    for step, v in pts:
        b = (step - lo) // w
        cur = out.get(b)
        if cur is None or math.isnan(v) or (not math.isnan(cur) and v > cur):
            out[b] = v
    return out


def _downsampled(pts: Sequence[tuple[int, float]], buckets: int) -> list[tuple[int, float]]:
    """``store.series``' min/max downsampling of a run-level delta: all points when few, else the first,
    the last, each bucket's min and max and every non-finite point."""
    if not pts:
        return []
    lo, hi = pts[0][0], pts[-1][0]
    w = -(-(hi - lo + 1) // buckets)
    if hi - lo + 1 <= 2 * buckets:
        return list(pts)
    keep = {pts[0][0]: pts[0], pts[-1][0]: pts[-1]}
    ext: dict[int, list[tuple[int, float]]] = {}
    for p in pts:
        if not math.isfinite(p[1]):
            keep[p[0]] = p
        if math.isnan(p[1]):  # NaN has no order; an infinity is a bucket's min or max like any value
            continue
        b = ext.setdefault((p[0] - lo) // w, [p, p])
        b[0] = p if p[1] < b[0][1] else b[0]
        b[1] = p if p[1] > b[1][1] else b[1]
    for lo_p, hi_p in ext.values():
        keep[lo_p[0]], keep[hi_p[0]] = lo_p, hi_p
    return [keep[s] for s in sorted(keep)]


def one_step(
    run: Run, points: Sequence[tuple[str, int | None, float]], modes: Sequence[str], tmap: TokenMap, x: XAxis
) -> dict[str, dict[str, Any]]:
    """The delta of one new step, the run's last (what a page that keeps up asks for), from
    ``store.newest_points``' ``(name, layer, value)``: one column per name, so no buckets; the
    numbers :func:`fast_deltas` gives (each layer's value, NaN wins, then the mean or the max)."""
    step = run.last_step if run.last_step is not None else 0
    by_name: dict[str, list[tuple[int | None, float]]] = {}
    for name, layer, value in points:
        by_name.setdefault(name, []).append((layer, value))
    xs = x_values(run, [step], tmap.at([step]), x)
    if xs[0] is None:
        return {}
    one = {"step": [step], "x": xs}
    out: dict[str, dict[str, Any]] = {}
    for name, pts in by_name.items():
        layered = sorted((p for p in pts if p[0] is not None), key=lambda p: p[0] or 0)
        if not layered:
            out[name] = {"run": {**one, "y": [_wire(pts[0][1])]}}
            continue
        values = [v for _la, v in layered]
        found: dict[str, Any] = {}
        for agg in (m for m in modes if m in ("mean", "max")):
            found[agg] = {**one, "y": [_wire(_aggregate(values, agg))]}
        if "heat" in modes:
            found["heat"] = {**one, "layers": [la for la, _v in layered], "width": 1,
                             "z": [[_wire(v)] for v in values]}  # fmt: skip
        for la, v in layered:
            if str(la) in modes:
                found[str(la)] = {**one, "y": [_wire(v)]}
        out[name] = found
    return out


def fast_deltas(
    store: Store,
    run: Run,
    names: Sequence[str],
    modes: Sequence[str],
    after: int,
    every: int,
    latest: Sequence[SeriesInfo],
    tmap: TokenMap,
    x: XAxis,
) -> dict[str, dict[str, Any]]:
    """:func:`delta_series` of every name at once from the raw new points (see :data:`FAST_STEPS`);
    ``latest``: the series index, maybe a few seconds old (every known series' newest points are read)."""
    last = run.last_step if run.last_step is not None else after
    span = last - after
    nb = _buckets(after, last, every)
    keys = [(s.name, s.layer, last + 1) for s in latest if s.name in names]
    windows = store.trailing_points(run.id, keys, span) if keys else []
    by_name: dict[str, dict[int | None, list[tuple[int, float]]]] = {}
    for (name, layer, _), pts in zip(keys, windows, strict=True):
        by_name.setdefault(name, {})[layer] = [p for p in pts if p[0] > after]
    out: dict[str, dict[str, Any]] = {}
    for name, series in by_name.items():
        found: dict[str, Any] = {}
        if None in series and not any(k is not None for k in series):
            pts = _downsampled(series[None], nb)
            steps = [p[0] for p in pts]
            if pts:
                out[name] = {"run": _line(steps, tmap.at(steps), [p[1] for p in pts], run, x)}
            continue
        layers = sorted(k for k in series if k is not None)
        every_pt = [p for la in layers for p in series[la]]
        if not every_pt:
            continue
        lo, hi = min(p[0] for p in every_pt), max(p[0] for p in every_pt)
        w = -(-(hi - lo + 1) // nb)
        cells = {la: _bucket_max(series[la], lo, w) for la in layers}
        cols = sorted({b for c in cells.values() for b in c})
        steps = [lo + b * w for b in cols]
        tokens = tmap.at(steps)
        for agg in (m for m in modes if m in ("mean", "max")):
            values = [_aggregate([cells[la][b] for la in layers if b in cells[la]], agg) for b in cols]
            found[agg] = _line(steps, tokens, values, run, x)
        if "heat" in modes:
            found["heat"] = {"step": steps, "x": x_values(run, steps, tokens, x), "layers": layers, "width": w,
                             "z": [[_wire(cells[la].get(b)) for b in cols] for la in layers]}  # fmt: skip
        for mode in modes:
            if mode.isdigit() and series.get(int(mode)):
                pts = _downsampled(series[int(mode)], nb)
                st = [p[0] for p in pts]
                found[mode] = _line(st, tmap.at(st), [p[1] for p in pts], run, x)
        out[name] = found
    return out


def delta_series(
    store: Store,
    run: Run,
    name: str,
    modes: Sequence[str],
    after: int,
    every: int,
    latest: Sequence[SeriesInfo],
    tmap: TokenMap,
    x: XAxis,
) -> dict[str, Any]:
    """The new part of ``name`` for ``run``: one entry per mode (a run-level metric answers ``"run"``)."""
    last = run.last_step if run.last_step is not None else after
    per_layer = any(s.name == name and s.layer is not None for s in latest)
    out: dict[str, Any] = {}
    if not per_layer:
        if any(s.name == name and s.layer is None for s in latest):
            s = store.series(run.id, name, None, _buckets(after, last, every), after + 1, last)
            pts = s.points
            out["run"] = _line([p.step for p in pts], [p.tokens for p in pts], [p.value for p in pts], run, x)
        return out
    aggs = [m for m in modes if m in ("mean", "max")]
    if aggs or "heat" in modes:
        m = store.layer_matrix(run.id, name, _buckets(after, last, every), after + 1, last)
        cols = [j for j in range(len(m.bucket_starts)) if any(row[j] is not None for row in m.values)]
        steps = [m.bucket_starts[j] for j in cols]
        tokens = tmap.at(steps)
        for agg in aggs:
            values = [_aggregate([c for c in (row[j] for row in m.values) if c is not None], agg) for j in cols]
            out[agg] = _line(steps, tokens, values, run, x)
        if "heat" in modes:
            xs = x_values(run, steps, tokens, x)
            out["heat"] = {"step": steps, "x": xs, "layers": m.layers, "width": m.bucket_width,
                           "z": [[_wire(row[j]) for j in cols] for row in m.values]}  # fmt: skip
    for mode in modes:
        if mode.isdigit():
            s = store.series(run.id, name, int(mode), _buckets(after, last, every), after + 1, last)
            pts = s.points
            out[mode] = _line([p.step for p in pts], [p.tokens for p in pts], [p.value for p in pts], run, x)
    return {mode: part for mode, part in out.items() if part["step"]}  # only what has new points


def alert_view(a: Alert) -> dict[str, Any]:
    return {"id": a.id, "run_id": a.run_id, "rule": a.rule, "severity": a.severity, "name": a.name,
            "layer": a.layer, "step": a.step, "value": _wire(a.value), "message": a.message}  # fmt: skip


def run_delta(
    store: Store,
    run: Run,
    cursor: Cursor,
    names: Sequence[str],
    modes: Sequence[str],
    every: int,
    x: XAxis,
    alert_after: int,
    stale_after_s: float,
    alert_limit: int,
) -> dict[str, Any]:
    """One run's news for a page: its state, the new part of each series, the new alerts (id > alert_after)."""
    state: dict[str, Any] = {"id": run.id, "name": run.name, "project": run.project, "status": run.status,
                             "last_step": run.last_step, "stale": is_stale(run, stale_after_s),
                             "cursor": run.last_step if run.last_step is not None else cursor.step,
                             "series": {}, "alerts": []}  # fmt: skip
    if run.last_step is None or run.last_step <= cursor.step:
        return state
    span = run.last_step - cursor.step
    # one new step (a page that keeps up): each series' point there, from the store's memory of the
    # batches this process stored while the run's row says nobody stored another since (else a read)
    newest = store.newest_points(run.id, run.last_step) if span == 1 else None
    latest = _index.get(store, run.id, names) if newest is None or x != "step" else []
    tmap = token_map_since(store, run, latest, cursor.step) if x != "step" else TokenMap((), None)
    try:
        if newest is not None:
            wanted = set(names)
            state["series"] = one_step(run, [p for p in newest if p[0] in wanted], modes, tmap, x)
        elif span <= FAST_STEPS:
            state["series"] = fast_deltas(store, run, names, modes, cursor.step, every, latest, tmap, x)
    except XAxisError as exc:  # the page said so on its first read; the delta stays empty
        state["missing"] = str(exc)
    if newest is None and span > FAST_STEPS:
        for name in names:
            try:
                found = delta_series(store, run, name, modes, cursor.step, every, latest, tmap, x)
            except XAxisError as exc:
                state["missing"] = str(exc)
                continue
            if found:
                state["series"][name] = found
    new = sorted((a for a in _alerts.get(store, run.id, alert_limit) if a.id > alert_after), key=lambda a: a.id)
    for a in new:
        view = alert_view(a)
        try:
            view["x"] = x_values(run, [a.step], tmap.at([a.step]), x)[0]
        except XAxisError:
            view["x"] = None
        state["alerts"].append(view)
    return state


def to_json(body: dict[str, Any]) -> bytes:
    """The live answer as JSON bytes. Its values are already wire-encoded (:func:`_wire`), so the plain
    encoder does (FastAPI's generic one walks every number of a 64-layer heatmap again); anything
    non-finite left over goes through :func:`jsonable` rather than out as a bare ``NaN``."""
    try:
        return json.dumps(body, allow_nan=False, separators=(",", ":")).encode()
    except ValueError:
        return json.dumps(jsonable(body), allow_nan=False, separators=(",", ":")).encode()
