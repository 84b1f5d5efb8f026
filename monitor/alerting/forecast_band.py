"""The forecast alert: a watched run whose indicator leaves its forecast band upward.

A run at its group's largest size, with runs at three or more smaller sizes, is watched
(:func:`monitor.read.forecasts.watch_of`): for each stability indicator, the band its smaller runs
forecast for its size over the fraction-of-training grid. Each batch of a watched run is checked in
the ingest transaction, like the other detectors, so its ``forecast_band`` alerts commit with its
points (:func:`monitor.analysis.forecast_track.band_exits`: the value over layers at a logged step
above the upper edge at that step's fraction, once per episode).

The bands are computed from the other runs' stored lines, a read too heavy for every batch, so each
service process keeps them per run (:class:`ForecastWatches`) and rebuilds a run's entry when it is
older than ``refresh_s`` (30 s), in the background after the batch's reply: a new smaller run that
finishes, or a larger one that joins the group, changes the alerts within ``refresh_s``. A run's
first batch only starts its entry. In the transaction the check costs one read (the batch's steps
and the step before them, every layer, to aggregate over layers and to know whether an episode is
already under way), and only for a watched run's indicators.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hyperwatch.hooks.columns import NULL_INT, PointColumns
from hyperwatch.monitor.analysis import AnalysisError
from hyperwatch.monitor.analysis.forecast import fmt_size
from hyperwatch.monitor.analysis.forecast_track import TrackBand, band_exits
from hyperwatch.monitor.core.errors import MonitorError
from hyperwatch.monitor.read.forecasts import Watch, watch_of
from hyperwatch.monitor.read.lines import STABILITY_INDICATORS, group_runs
from hyperwatch.monitor.store.base import Detector, Store, WindowReader
from hyperwatch.monitor.store.entities import NewAlert

log = logging.getLogger(__name__)
RULE = "forecast_band"
REFRESH_S = 30.0


@dataclass(frozen=True)
class Entry:
    """One run's watch as of ``built_at`` (``watch`` None: not watched) and its layers per indicator."""

    built_at: float
    watch: Watch | None = None
    total_steps: int = 0
    layers: dict[str, tuple[int | None, ...]] = field(default_factory=dict)
    group: str = ""


def build_entry(store: Store, run_id: int, now: float) -> Entry:
    """Read what the alert of ``run_id`` needs (its group's runs and their lines)."""
    run = store.get_run(run_id)
    if run.group_id is None or not run.total_steps:
        return Entry(now)
    _, runs = group_runs(store, run.group_id)
    watch = watch_of(store, run, runs, STABILITY_INDICATORS)
    if isinstance(watch, str) or not watch.bands:
        return Entry(now)
    layers: dict[str, list[int | None]] = {}
    for s in store.list_series(run.id):
        if s.name in watch.bands:
            layers.setdefault(s.name, []).append(s.layer)
    return Entry(now, watch, run.total_steps, {k: tuple(v) for k, v in layers.items()}, run.group or "")


def _mean(values: Sequence[float]) -> float:
    """The scale page's mean over layers: a NaN layer makes it NaN (no alert on it: see band_exits)."""
    return float(np.mean(values))


def check(entry: Entry, reader: WindowReader, run_id: int, cols: PointColumns) -> list[NewAlert]:
    """The batch's ``forecast_band`` alerts (see the module doc): one read in the batch's transaction
    of every watched indicator's layers, over the batch's steps and the step before them."""
    assert entry.watch is not None
    watched = [(code, name) for code, name in enumerate(cols.names) if name in entry.watch.bands]
    keys: list[tuple[str, int | None, int]] = []
    first: dict[str, int] = {}
    limit = 0
    for code, name in watched:
        mine = cols.name_index == code
        steps = np.unique(cols.step[mine])
        layers = set(entry.layers.get(name, ())) | {None if la == NULL_INT else int(la) for la in cols.layer[mine]}
        keys += [(name, layer, int(steps[-1]) + 1) for layer in layers]
        first[name] = int(steps[0])
        limit = max(limit, len(steps) + 1)
    by_step: dict[str, dict[int, list[float]]] = {name: {} for name in first}
    for (name, _, _), window in zip(keys, reader.trailing_points(run_id, keys, limit), strict=True):
        for step, value in window:
            by_step[name].setdefault(step, []).append(value)
    alerts: list[NewAlert] = []
    for name, values_at in by_step.items():
        earlier = [s for s in values_at if s < first[name]]
        before = (max(earlier), _mean(values_at[max(earlier)])) if earlier else None
        ordered = sorted(s for s in values_at if s >= first[name])
        band = entry.watch.bands[name]
        values = [_mean(values_at[s]) for s in ordered]
        for step, value, upper in band_exits(band, entry.total_steps, ordered, values, before):
            alerts.append(_alert(entry, band, name, step, value, upper))
    return alerts


def _alert(entry: Entry, band: TrackBand, name: str, step: int, value: float, upper: float) -> NewAlert:
    assert entry.watch is not None
    fraction = (step + 1) / entry.total_steps
    at = band.at(fraction)
    assert at is not None
    predicted, lower, _ = at
    message = (
        f"{name} (mean over layers) is {value:.4g} at step {step} ({fraction:.0%} of training), above the "
        f"{band.level:.0%} forecast band {lower:.4g}-{upper:.4g} (predicted {predicted:.4g}) that "
        f"{band.sizes_at(fraction)} smaller sizes of group {entry.group!r} give for "
        f"{fmt_size(entry.watch.size)} params"
    )
    return NewAlert(RULE, "warning", name, None, step, value, upper, message)


class ForecastWatches:
    """Per-process watches by run id, rebuilt when older than ``refresh_s`` (see the module doc)."""

    def __init__(self, refresh_s: float = REFRESH_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.refresh_s = refresh_s
        self.clock = clock
        self._entries: dict[int, Entry] = {}
        self._building: set[int] = set()
        self._lock = threading.Lock()

    def detector(self, run_id: int, points: PointColumns) -> Detector | None:
        """The check of a batch of ``run_id`` against its band, or None when the run is not watched
        (or not yet: its first batch only starts its entry)."""
        entry = self._entries.get(run_id)
        if entry is None or entry.watch is None or not set(points.names) & set(entry.watch.bands):
            return None
        return lambda reader: check(entry, reader, run_id, points)

    def due(self, run_id: int) -> bool:
        entry = self._entries.get(run_id)
        return (entry is None or self.clock() - entry.built_at >= self.refresh_s) and run_id not in self._building

    def refresh(self, store: Store, run_id: int) -> None:
        """Rebuild the run's entry if it is due (one builder per run at a time); never raises: a
        failed read keeps the old entry and is logged (the batch itself is already stored)."""
        with self._lock:
            if not self.due(run_id):
                return
            self._building.add(run_id)
        try:
            self._entries[run_id] = build_entry(store, run_id, self.clock())
        except (MonitorError, AnalysisError) as exc:
            log.warning("forecast watch of run %s not refreshed: %s", run_id, exc)
        finally:
            with self._lock:
                self._building.discard(run_id)
