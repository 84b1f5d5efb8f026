"""The service's own alerting: the same rules as prometheus/rules.yml.

The trend rules (``logit_ceiling``, ``z_growth``, ``loss_spike``, ``grad_norm_spike``) live in
:mod:`monitor.alerting.trends`; the defaults of every rule in :mod:`monitor.thresholds.defaults`. What
the rules raise is grouped into incidents (one per run, rule and episode) by the store
(:mod:`monitor.store.incidents`).

For users without Prometheus, every ingested batch runs through these detectors and what they find
is stored as alert events (listed by ``GET /api/v1/alerts`` and drawn on the dashboards).

Rules (thresholds per group, see :class:`monitor.api.schemas.Thresholds`):

- ``z_spike`` (attention_z, router_z, per layer): a value is a spike when it exceeds the trailing
  baseline by ``spike_mad_multiple`` robust deviations *and* by ``spike_min_relative`` x |median|,
  and is at least the metric's absolute minimum. The baseline is the median of the previous
  ``spike_window`` points (the current point excluded, so a spike cannot raise its own bar) and the
  deviation is 1.4826 x MAD (a standard deviation for Gaussian noise, unmoved by earlier spikes).
  No verdict before ``spike_min_points`` points of history.
- ``nan_loss``: loss or val_loss is NaN or +-Inf. ``nonfinite_value``: any other metric is.
- ``max_vio_collapse``: an MoE layer's MaxVio above ``max_vio_limit`` on ``max_vio_persist``
  consecutive logged points (the busiest expert gets more than (1 + limit) x its fair share, and
  stays there: routing is collapsing onto few experts).
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from hyperwatch.hooks.columns import PointColumns
from hyperwatch.hooks.schema import MAX_LAYER, Point, base_name, encode_value
from hyperwatch.monitor.alerting.heads import is_head
from hyperwatch.monitor.alerting.trends import detect_trends
from hyperwatch.monitor.store.base import Store, WindowReader
from hyperwatch.monitor.store.entities import NewAlert
from hyperwatch.monitor.store.trailing import per_step_max
from hyperwatch.monitor.thresholds.defaults import DEFAULT_THRESHOLDS, thresholds_for

__all__ = ["DEFAULT_THRESHOLDS", "detect", "is_spike", "step_baseline", "thresholds_for"]

SPIKE_METRICS = ("attention_z", "router_z")
SPIKE_SEVERITY = "info"
"""``z_spike`` is visible on the run and pages nobody: on the family benchmark's 68 healthy runs it added
false alarms and no warning that the growth and ceiling rules did not give (bench/early_warning/README.md)."""
LOSS_METRICS = ("loss", "val_loss")
MAD_TO_SIGMA = 1.4826


def _median(ordered: Sequence[float]) -> float:
    """Median of sorted values (the mean of the two middle ones for an even count, as numpy's)."""
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def step_baseline(windows: Sequence[Sequence[tuple[int, float]]], th: dict[str, float]) -> tuple[float, float] | None:
    """(median, robust deviation) in steps of a metric's max over layers: the Prometheus spike rules' baseline.

    A wall-clock window judges a rise by how fast the machine trains: on a loaded CPU a blow-up
    spreads over minutes and never stands out from its own 30-minute median. Counted in logged
    steps it does, on any machine. ``windows`` hold each layer's ``(step, value)`` pairs before the
    latest step; the newest ``spike_window`` steps count, non-finite values are left out as the
    detector leaves them out; None with fewer than ``spike_min_points`` steps of history. The
    deviation is 1.4826 x the MAD, as :func:`is_spike` measures a jump.
    """
    newest = [v for _step, v in per_step_max(windows)[-int(th["spike_window"]) :]]
    if not newest or len(newest) < th["spike_min_points"]:
        return None
    med = _median(sorted(newest))
    return med, _median(sorted(abs(v - med) for v in newest)) * MAD_TO_SIGMA


def is_spike(value: float, history: Sequence[float], th: dict[str, float], floor: float) -> tuple[bool, float | None]:
    """(spike?, baseline median) of ``value`` against its trailing ``history`` (finite values only).

    Plain Python on purpose: a window is ~50 values, where sorting a list beats numpy's per-call cost.
    """
    if not math.isfinite(value) or value < floor:
        return False, None  # cheap exits first: most points are below the absolute minimum
    return _spike_sorted(value, sorted(v for v in history if math.isfinite(v)), th, floor)


def _spike_sorted(value: float, finite: list[float], th: dict[str, float], floor: float) -> tuple[bool, float | None]:
    """:func:`is_spike` given the history's finite values already sorted."""
    if not math.isfinite(value) or value < floor or len(finite) < th["spike_min_points"]:
        return False, None
    med = _median(finite)
    mad = _median(sorted(abs(v - med) for v in finite)) * MAD_TO_SIGMA
    jump = value - med
    return (
        value >= floor and jump > th["spike_mad_multiple"] * mad and jump > th["spike_min_relative"] * abs(med),
        med,
    )


def _flagged(cols: PointColumns, th: dict[str, float]) -> tuple[list[Point], dict[tuple[str, int | None], list[Point]]]:
    """The batch's points that can raise an alert, found on whole columns.

    First: every non-finite point and every MaxVio above the limit, in batch order. Second: the
    points of each spike-metric series that holds a candidate (a finite value at or above the
    metric's absolute minimum), series in order of first appearance: a point below the minimum is
    never a spike, but a candidate's series needs all of its points (they slide its window).
    Everything else (nearly every point of a healthy run) never becomes a Python object here.
    """
    code = cols.name_index
    value = cols.value
    finite = np.isfinite(value)
    alarming = ~finite
    floors = np.array([th.get(f"{n}_min", np.inf) if n in SPIKE_METRICS else np.nan for n in cols.names])[code]
    spiky = ~np.isnan(floors)
    candidate = spiky & finite & (value >= floors)
    series: dict[tuple[str, int | None], list[Point]] = {}
    if candidate.any():
        key = code.astype(np.int64) * (MAX_LAYER + 2) + (cols.layer + 1)  # one integer per (name, layer)
        members = np.flatnonzero(spiky & np.isin(key, np.unique(key[candidate])))
        for p in cols.points(members):
            series.setdefault((p.name, p.layer), []).append(p)
    return cols.points(np.flatnonzero(alarming)), series


def detect(
    store: Store | WindowReader,
    run_id: int,
    points: Sequence[Point] | PointColumns,
    group_thresholds: dict[str, Any] | None,
) -> list[NewAlert]:
    """Alerts raised by a batch (after it is stored: the trailing windows are read from the store).

    ``store`` is anything with ``trailing_windows``: the ingest route passes the batch's own
    transaction (``Store.ingest(..., detector=...)``) so its alerts commit with its points.

    The alerts of a z_spike series are in step order; the others follow the batch's point order.
    """
    th = thresholds_for(group_thresholds)
    alerts: list[NewAlert] = []
    cols = PointColumns.of(points)
    flagged, candidates = _flagged(cols, th)
    for p in flagged:
        base = base_name(p.name)
        if is_head(p.name):
            continue  # a non-finite head makes its layer's attention_lse_max non-finite: one alert there
        if not math.isfinite(p.value):
            rule = "nan_loss" if base in LOSS_METRICS else "nonfinite_value"
            where = "" if p.layer is None else f" in layer {p.layer}"
            alerts.append(
                NewAlert(
                    rule,
                    "critical",
                    p.name,
                    p.layer,
                    p.step,
                    p.value,
                    None,
                    f"{p.name}{where} is {encode_value(p.value)} at step {p.step}",
                )
            )
    window = int(th["spike_window"])
    # only series with a candidate need their stored window (one read for all of them)
    for pts in candidates.values():
        pts.sort(key=lambda q: q.step)
    keys = [(name, layer, pts[0].step) for (name, layer), pts in candidates.items()]
    stored = store.trailing_windows(run_id, keys, window)
    for ((name, layer), pts), before in zip(candidates.items(), stored):
        history: deque[float] = deque(before, maxlen=window)
        ordered = sorted(v for v in history if math.isfinite(v))  # kept sorted as the window slides
        floor = th[f"{name}_min"]
        for p in pts:
            spike, med = _spike_sorted(p.value, ordered, th, floor)
            if spike:
                assert med is not None
                alerts.append(
                    NewAlert(
                        "z_spike",
                        SPIKE_SEVERITY,
                        name,
                        layer,
                        p.step,
                        p.value,
                        med,
                        f"{name} of layer {layer} jumped to {p.value:.4g} at step {p.step} from a "
                        f"trailing median of {med:.4g}",
                    )
                )
            if len(history) == window:
                _discard(ordered, history[0])
            history.append(p.value)
            if math.isfinite(p.value):
                insort(ordered, p.value)
    alerts += _max_vio_alerts(store, run_id, cols, th)
    alerts += detect_trends(store, run_id, cols, th)
    return alerts


def _max_vio_alerts(
    store: Store | WindowReader, run_id: int, cols: PointColumns, th: dict[str, float]
) -> list[NewAlert]:
    """``max_vio_collapse``: each point of a layer's MaxVio above the limit that ends a run of
    ``max_vio_persist`` consecutive logged points above it (the earlier ones read from the store)."""
    limit, persist = th["max_vio_limit"], max(1, int(th["max_vio_persist"]))
    is_max_vio = np.array([base_name(n) == "max_vio" for n in cols.names], dtype=bool)[cols.name_index]
    over = is_max_vio & np.isfinite(cols.value) & (cols.value > limit)
    if not over.any():
        return []
    key = cols.name_index.astype(np.int64) * (MAX_LAYER + 2) + (cols.layer + 1)  # one integer per (name, layer)
    series: dict[tuple[str, int | None], list[Point]] = {}
    for p in cols.points(np.flatnonzero(is_max_vio & np.isin(key, np.unique(key[over])))):
        series.setdefault((p.name, p.layer), []).append(p)
    for pts in series.values():
        pts.sort(key=lambda q: q.step)
    keys = [(name, layer, pts[0].step) for (name, layer), pts in series.items()]
    before = store.trailing_windows(run_id, keys, persist - 1) if persist > 1 else [[] for _ in keys]
    alerts: list[NewAlert] = []
    for ((name, layer), pts), earlier in zip(series.items(), before):
        streak = 0
        for v in earlier:
            streak = streak + 1 if math.isfinite(v) and v > limit else 0
        for p in pts:
            streak = streak + 1 if math.isfinite(p.value) and p.value > limit else 0
            if streak >= persist:
                alerts.append(
                    NewAlert(
                        "max_vio_collapse",
                        "warning",
                        name,
                        layer,
                        p.step,
                        p.value,
                        limit,
                        f"MaxVio of layer {layer} is {p.value:.3g} at step {p.step}, above {limit:.3g} on "
                        f"{streak} logged points in a row: routing is collapsing onto few experts",
                    )
                )
    return alerts


def _discard(ordered: list[float], old: float) -> None:
    """Remove the window's oldest value from its sorted copy (the very value: -0.0 is not 0.0 here).

    Equal values sit in arrival order (``sorted`` is stable, ``insort`` appends after equals), so
    the first one with ``old``'s sign is ``old`` itself, and the sorted copy stays exactly
    ``sorted(finite history)``.
    """
    if not math.isfinite(old):
        return
    i = bisect_left(ordered, old)
    while math.copysign(1.0, ordered[i]) != math.copysign(1.0, old):
        i += 1
    del ordered[i]
