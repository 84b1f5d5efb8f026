"""The read layer's plain reads: runs, the series index, series, layer matrices, alerts, comparisons.

With :mod:`monitor.read.lines` (aggregation, x-axis, matching) and :mod:`monitor.read.live` (the live
delta) this is the only path from the API routes and the pages to the store, so a page never
shows a number the API would not give. Routes and pages get a :class:`Reader` through
:data:`monitor.api.deps.ReaderDep` (read auth, the store and the settings as one dependency;
:data:`~monitor.api.deps.QueryReaderDep` for a series or a figure, which also waits for a read
slot), never through an API route module. Nothing here knows HTTP.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hyperwatch.hooks.schema import MAX_LAYER, head_of
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.core.errors import InvalidInputError
from hyperwatch.monitor.read.lines import (
    Agg,
    AggSeries,
    TokenMap,
    aggregate_series,
    group_runs,
    layer_matrix,
    series_peak,
)
from hyperwatch.monitor.store.base import Store
from hyperwatch.monitor.store.entities import Alert, Group, LayerMatrix, Run, Series, SeriesInfo, SeriesSummary
from hyperwatch.monitor.thresholds.learned import ThresholdSource, effective_thresholds, learning_on, provenance

LineMode = str
"""``"mean"`` or ``"max"`` over layers, or a layer number as text (``"3"``)."""

_LAYER = re.compile(r"[0-9]{1,9}")


def layer_number(mode: LineMode) -> int | None:
    """The layer a line choice names (``"7"`` -> 7), None for ``mean``/``max``/``heat`` and for a number
    above :data:`hooks.schema.MAX_LAYER` (ASCII digits only: ``"²"`` is not a layer)."""
    if _LAYER.fullmatch(mode):
        number = int(mode)
        return number if number <= MAX_LAYER else None
    return None


class _IndexCache:
    """``store.list_series(run)`` memoised on the run's state (id, last_point_at, updated_at).

    Every point write moves ``last_point_at``, so a hit is the same answer the store would give;
    it saves the figure requests of one page from reading the same index once each per run. Bounded
    by entries and by series held in all (``max_series``: a run may hold 20,000 series, so 512 full
    indexes could otherwise reach ~1.5 GB).
    """

    def __init__(self, size: int = 512, max_series: int = 200_000) -> None:
        self.size = size
        self.max_series = max_series
        self.held = 0
        self.items: OrderedDict[tuple[Any, ...], list[SeriesInfo]] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, store: Store, run: Run) -> list[SeriesInfo]:
        key = (id(store), run.id, run.last_point_at, run.updated_at)
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        found = store.list_series(run.id)
        with self.lock:
            old = self.items.pop(key, None)
            self.held += len(found) - (0 if old is None else len(old))
            self.items[key] = found
            while len(self.items) > self.size or (self.held > self.max_series and len(self.items) > 1):
                _key, dropped = self.items.popitem(last=False)
                self.held -= len(dropped)
        return found


_index = _IndexCache()


HEAD_METRIC = "attention_lse_max"
"""The per-head indicator (``attention_lse_max.h<k>`` per layer) the heads x layers matrix draws."""


@dataclass(frozen=True)
class HeadMatrix:
    """Each attention head's max LSE at a run's newest logged step: ``values[i][j]`` for layer
    ``layers[i]`` and head ``heads[j]`` (None: that head reported nothing at ``step``; NaN kept)."""

    run_id: int
    name: str
    step: int | None
    layers: list[int]
    heads: list[int]
    values: list[list[float | None]]


def head_matrix(run_id: int, index: Sequence[SeriesInfo]) -> HeadMatrix:
    """The heads x layers matrix from the series index (each series' latest point): no extra read."""
    cells = {(s.layer, h, s.step): s.value for s in index if s.layer is not None and (h := head_of(s.name)) is not None}
    if not cells:
        return HeadMatrix(run_id, HEAD_METRIC, None, [], [], [])
    step = max(k[2] for k in cells)
    layers = sorted({k[0] for k in cells})
    heads = sorted({k[1] for k in cells})
    values = [[cells.get((la, h, step)) for h in heads] for la in layers]
    return HeadMatrix(run_id, HEAD_METRIC, step, layers, heads, values)


@dataclass(frozen=True)
class Reader:
    """The store and the settings a read needs; every method is what an API route answers."""

    store: Store
    settings: Settings

    def buckets(self, n: int) -> int:
        if n > self.settings.max_buckets:
            raise InvalidInputError(
                f"buckets: {n} is above the limit of {self.settings.max_buckets} (HYPERWATCH_MAX_BUCKETS)"
            )
        return n

    def run(self, run_id: int) -> Run:
        return self.store.get_run(run_id)

    def group(self, group_id: int) -> tuple[Group, list[Run]]:
        return group_runs(self.store, group_id)

    def index(self, run: Run) -> list[SeriesInfo]:
        """What GET /runs/{id}/series_index lists: each (name, layer) and its latest point."""
        return _index.get(self.store, run)

    def series(
        self, run_id: int, name: str, layer: int | None, buckets: int, start: int | None, end: int | None
    ) -> Series:
        return self.store.series(run_id, name, layer, self.buckets(buckets), start, end)

    def layers(
        self, run: Run, name: str, buckets: int, start: int | None = None, end: int | None = None
    ) -> LayerMatrix:
        """The layer x step matrix, buckets no narrower than the run's logging interval."""
        return layer_matrix(self.store, run, name, self.buckets(buckets), start, end)

    def heads(self, run: Run) -> HeadMatrix:
        """Per-head max LSE by layer at the run's newest logged step (the index's latest points)."""
        return head_matrix(run.id, self.index(run))

    def thresholds(self, run: Run) -> dict[str, float]:
        """The alert thresholds the detectors use for ``run``: its group's (overridden or learned) over the defaults."""
        return effective_thresholds(self.store.get_group(run.group_id) if run.group_id else None)

    def group_thresholds(self, group_id: int) -> tuple[bool, list[ThresholdSource]]:
        """Whether the group learns, and what GET /groups/{id}/thresholds lists: each threshold in
        force and where it came from."""
        group = self.store.get_group(group_id)
        return learning_on(group), provenance(group, group_id)

    def token_map(self, run: Run, latest: Sequence[SeriesInfo]) -> TokenMap:
        return TokenMap.of(self.store, run, latest)

    def line(
        self, run: Run, name: str, mode: LineMode, buckets: int, latest: Sequence[SeriesInfo], tmap: TokenMap
    ) -> AggSeries:
        """One run's line of ``name``: aggregated over layers (``mean``/``max``), or one layer (``"3"``);
        a run-level metric is its own series whatever the mode."""
        buckets = self.buckets(buckets)
        per_layer = any(s.name == name and s.layer is not None for s in latest)
        layer = layer_number(mode)  # the route read it by monitor.api.params.parse_line
        if layer is None or not per_layer:
            agg: Agg = "max" if mode == "max" else "mean"
            return aggregate_series(self.store, run, name, agg, buckets, latest, tmap)
        s = self.store.series(run.id, name, layer, buckets, None, None)
        pts = s.points
        return AggSeries([p.step for p in pts], [p.tokens for p in pts], [p.value for p in pts],
                         pts[-1].value if pts else None, False, 0, s.downsampled)  # fmt: skip

    def alerts(
        self,
        run_id: int | None = None,
        project: str | None = None,
        group_id: int | None = None,
        rule: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Alert]:
        """Alert events, newest first, at most the service's page size."""
        return self.store.list_alerts(run_id, project, group_id, rule, min(limit, self.settings.max_page_size), offset)

    def incident_peaks(
        self,
        run_id: int | None = None,
        project: str | None = None,
        rule: str | None = None,
        limit: int = 100,
        most: int = 200,
    ) -> dict[tuple[int, str], float | None]:
        """Each (run id, metric) of the incidents GET /incidents lists for these filters -> that series'
        largest value over the whole run (:func:`monitor.read.lines.series_peak`; NaN and inf kept), the
        first ``most`` pairs only: the peak the series reached, not the worst of the alert events."""
        found = self.store.list_incidents(run_id, project, None, rule, min(limit, self.settings.max_page_size), 0)
        pairs = list(dict.fromkeys((i.run_id, i.name) for i in found))[:most]
        runs = {rid: self.store.get_run(rid) for rid in dict.fromkeys(r for r, _ in pairs)}
        return {(rid, name): series_peak(self.store, runs[rid], name) for rid, name in pairs}

    def run_summaries(self, runs: Sequence[Run], names: Sequence[str]) -> dict[int, dict[str, SeriesSummary]]:
        """Run id -> metric name -> its run-level series summed up (latest value, min and max with their
        steps; :meth:`monitor.store.base.Store.series_summaries`), for the runs table's columns."""
        out: dict[int, dict[str, SeriesSummary]] = {run.id: {} for run in runs}
        for (run_id, name), summary in self.store.series_summaries([r.id for r in runs], names).items():
            out[run_id][name] = summary
        return out

    def runs_by_id(self, ids: Sequence[int]) -> list[Run]:
        """The runs of ``ids`` (each once, in the order given), at most ``max_compare_runs``."""
        unique = list(dict.fromkeys(ids))
        if not unique:
            raise InvalidInputError("run_id: give one or more run_id=N parameters (pick runs on /runs)")
        if len(unique) > self.settings.max_compare_runs:
            raise InvalidInputError(f"run_id: {len(unique)} runs; the limit is {self.settings.max_compare_runs}")
        return [self.store.get_run(rid) for rid in unique]
