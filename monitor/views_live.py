"""The live read: what an open page lacks since it last drew, and nothing it already has.

A page draws a run once (the whole series, downsampled by :mod:`monitor.views`), remembers the
last step it was read up to (its *cursor*) and then asks :func:`live_delta` for the points after
it. The delta is read with the same rules as the first read, so a live page and a reloaded page
draw the same numbers:

- a per-layer indicator is aggregated over layers per bucket (each layer's max in the bucket, then
  the mean or the max over layers: :func:`monitor.views.aggregate_series`), in buckets of
  ``every`` steps (the first read's bucket width, so the line keeps its density and its spikes);
- a run-level metric or one layer is min/max-downsampled by the store, NaN/Inf points always kept;
- the heatmap's new columns are the layers' max per bucket (``store.layer_matrix``).

Nothing here runs on the ingest path: the stream route polls the runs' ``last_step`` (one primary
key read per run) and calls :func:`live_delta` only for runs that moved.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hyperwatch.monitor.store.base import Store
from hyperwatch.monitor.store.entities import Alert, Run, SeriesInfo
from hyperwatch.monitor.views import TokenMap, XAxis, XAxisError, is_stale, x_values

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

    def moved(self, run: Run) -> bool:
        """Whether ``run`` has points or a status the page has not drawn."""
        return (run.last_step is not None and run.last_step > self.step) or (
            self.status is not None and run.status != self.status
        )


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


def _line(steps: list[int], tokens: list[int | None], values: list[float], run: Run, x: XAxis) -> dict[str, Any]:
    xs = x_values(run, steps, tokens, x)
    keep = [i for i, v in enumerate(xs) if v is not None]
    return {"step": [steps[i] for i in keep], "x": [xs[i] for i in keep], "y": [values[i] for i in keep]}


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
                           "z": [[row[j] for j in cols] for row in m.values]}  # fmt: skip
    for mode in modes:
        if mode.isdigit():
            s = store.series(run.id, name, int(mode), _buckets(after, last, every), after + 1, last)
            pts = s.points
            out[mode] = _line([p.step for p in pts], [p.tokens for p in pts], [p.value for p in pts], run, x)
    return out


def alert_view(a: Alert) -> dict[str, Any]:
    return {"id": a.id, "run_id": a.run_id, "rule": a.rule, "severity": a.severity, "name": a.name,
            "layer": a.layer, "step": a.step, "value": a.value, "message": a.message}  # fmt: skip


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
    latest = store.list_series(run.id)
    tmap = token_map_since(store, run, latest, cursor.step) if x != "step" else TokenMap((), None)
    for name in names:
        try:
            found = delta_series(store, run, name, modes, cursor.step, every, latest, tmap, x)
        except XAxisError as exc:  # the page said so on its first read; the delta stays empty
            state.setdefault("missing", {})[name] = str(exc)
            continue
        if found:
            state["series"][name] = found
    new = sorted(
        (a for a in store.list_alerts(run_id=run.id, limit=alert_limit) if a.id > alert_after), key=lambda a: a.id
    )
    for a in new:
        view = alert_view(a)
        try:
            view["x"] = x_values(run, [a.step], tmap.at([a.step]), x)[0]
        except XAxisError:
            view["x"] = None
        state["alerts"].append(view)
    return state
