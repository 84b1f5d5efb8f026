"""Detectors that see levels and trends, not only jumps: logit ceiling, sustained growth, sigma spikes.

Rules (thresholds in :mod:`monitor.thresholds.defaults`):

- ``logit_ceiling`` (critical): a head's max attention LSE (``attention_lse_max.h<k>``; the layer's
  ``attention_lse_max`` where no head is sent; ``attention_z`` above the limit squared) crosses
  the limit. Raised when the series *crosses* (its previous stored value was at or below the
  limit, or it has none), so a run that blows up at step 1 is warned at step 1, and one that
  stays above the ceiling raises one event per series, not one per logged step.
- ``z_growth`` (warning): the Theil-Sen rise of ln(value) over the last ``growth_window``
  logged points of attention Z, the layer's max LSE, router Z, output Z or a branch's (attention,
  MLP/MoE) output RMS reaches ln(``growth_factor``): a steady climb that no spike rule sees. Raised when the condition
  starts to hold (it did not at the series' previous point).
- ``loss_spike`` / ``grad_norm_spike`` (warning): ``<metric>_spike_persist`` logged points in a
  row above mean + k sigma of the metric's own ``<metric>_spike_window`` values before them (the
  grad norm's blip must be confirmed by the next logged point; the loss's need not).
- ``loss_shift`` (warning): the mean of the last ``loss_shift_points`` logged losses, their largest
  left out, above the mean of the ``loss_shift_window`` before them by ``loss_shift_multiple``
  standard errors: a loss that stepped up and stayed up, no point of which need be a spike.

Every rule reads the store only for series that hold a candidate in the batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import NamedTuple

import numpy as np

from hyperwatch.hooks.columns import PointColumns
from hyperwatch.hooks.schema import MAX_LAYER, base_name
from hyperwatch.monitor.alerting.heads import is_head
from hyperwatch.monitor.store.base import WindowReader
from hyperwatch.monitor.store.entities import NewAlert
from hyperwatch.monitor.thresholds.defaults import GROWTH_METRICS, SIGMA_SPIKE_METRICS, log_factor, z_ceiling

Series = dict[tuple[str, int | None], list[tuple[int, float]]]


def theil_sen_slope(steps: Sequence[float], values: Sequence[float]) -> float:
    """The median of the pairwise slopes (values[j] - values[i]) / (steps[j] - steps[i]), i < j.

    Robust to a few outliers (a spike moves it by little); NaN with fewer than two distinct steps.
    """
    x, y = np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)
    i, j = np.triu_indices(len(x), k=1)
    dx = x[j] - x[i]
    keep = dx != 0
    if not keep.any():
        return math.nan
    return float(np.median((y[j] - y[i])[keep] / dx[keep]))


def fitted_log_rise(window: Sequence[tuple[int, float]]) -> float:
    """Theil-Sen slope of ln(value) against the step, times the window's span: the fitted rise.

    Non-finite and non-positive values are left out (ln is undefined; NaN has its own rule).
    """
    pts = [(s, math.log(v)) for s, v in window if math.isfinite(v) and v > 0]
    if len(pts) < 2:
        return math.nan
    slope = theil_sen_slope([s for s, _ in pts], [v for _, v in pts])
    return slope * (pts[-1][0] - pts[0][0])


def sigma_spike(value: float, history: Sequence[float], th: dict[str, float]) -> tuple[bool, float | None]:
    """(spike?, trailing mean): ``value`` above mean + k sigma of the finite ``history``, and above
    the mean by the minimum relative jump; no verdict before ``sigma_spike_min_points`` values."""
    finite = [v for v in history if math.isfinite(v)]
    if not math.isfinite(value) or len(finite) < th["sigma_spike_min_points"]:
        return False, None
    mean = float(np.mean(finite))
    sigma = float(np.std(finite))
    jump = value - mean
    return jump > th["sigma_spike_multiple"] * sigma and jump > th["sigma_spike_min_relative"] * abs(mean), mean


def _collect(cols: PointColumns, floor_of: Callable[[str], float | None], strict: bool) -> Series:
    """The batch points, in step order, of each series holding a candidate: a finite value above
    (``strict``) or at least its name's floor; ``floor_of`` is None for names the rule ignores.

    Found on whole columns, as :func:`monitor.alerting.detectors._flagged` does: the points of series
    without a candidate (nearly all of a healthy run's) never become Python objects.
    """
    per_name = [floor_of(n) for n in cols.names]
    if all(f is None for f in per_name):
        return {}
    floors = np.array([np.nan if f is None else f for f in per_name])[cols.name_index]
    value = cols.value
    picked = ~np.isnan(floors)
    with np.errstate(invalid="ignore"):
        above = value > floors if strict else value >= floors
    candidate = picked & np.isfinite(value) & above
    if not candidate.any():
        return {}
    key = cols.name_index.astype(np.int64) * (MAX_LAYER + 2) + (cols.layer + 1)  # one integer per series
    members = np.flatnonzero(picked & np.isin(key, np.unique(key[candidate])))
    series: Series = {}
    for p in cols.points(members):
        series.setdefault((p.name, p.layer), []).append((p.step, p.value))
    for pts in series.values():
        pts.sort()
    return series


def _windows(reader: WindowReader, run_id: int, series: Series, limit: int) -> list[list[tuple[int, float]]]:
    keys = [(name, layer, pts[0][0]) for (name, layer), pts in series.items()]
    return reader.trailing_points(run_id, keys, limit) if keys else []


def _limit_of(name: str, th: dict[str, float]) -> float:
    return z_ceiling(th) if base_name(name) == "attention_z" else th["attention_lse_max_limit"]


def _ceiling_floor(th: dict[str, float]) -> Callable[[str], float | None]:
    def floor(name: str) -> float | None:
        return _limit_of(name, th) if name == "attention_z" or base_name(name) == "attention_lse_max" else None

    return floor


def ceilings(reader: WindowReader, run_id: int, cols: PointColumns, th: dict[str, float]) -> list[NewAlert]:
    series = _collect(cols, _ceiling_floor(th), strict=True)
    with_heads = _head_steps(cols) if any(name == "attention_lse_max" for name, _ in series) else set()
    alerts = []
    for ((name, layer), pts), before in zip(series.items(), _windows(reader, run_id, series, 1)):
        if name == "attention_lse_max" and all((layer, s) in with_heads for s, _ in pts):
            continue  # its heads are judged one by one
        limit = _limit_of(name, th)
        prev = before[-1][1] if before else None
        for step, value in pts:
            above = math.isfinite(value) and value > limit
            if above and (prev is None or not prev > limit):
                message = _ceiling_message(name, layer, step, value, limit, th)
                alerts.append(NewAlert("logit_ceiling", "critical", name, layer, step, value, limit, message))
            prev = value
    return alerts


def _head_steps(cols: PointColumns) -> set[tuple[int | None, int]]:
    """(layer, step) of the batch's per-head points."""
    codes = [i for i, n in enumerate(cols.names) if is_head(n)]
    if not codes:
        return set()
    at = np.flatnonzero(np.isin(cols.name_index, codes))
    return {(None if la < 0 else la, s) for la, s in zip(cols.layer[at].tolist(), cols.step[at].tolist())}


def _ceiling_message(name: str, layer: int | None, step: int, value: float, limit: float, th: dict[str, float]) -> str:
    where = f"layer {layer}" if layer is not None else "the run"
    if base_name(name) == "attention_z":
        root = th["attention_lse_max_limit"]
        return (
            f"attention Z of {where} is {value:.4g} at step {step}, above {limit:.4g} (= {root:.4g}^2): "
            "some attention row's LSE passed the logit ceiling"
        )
    head = name.split(".h", 1)[1] if ".h" in name else None
    who = f"head {head} of {where}" if head is not None else f"a head of {where}"
    return (
        f"{who}: max attention LSE {value:.4g} at step {step}, above the ceiling {limit:.4g} "
        f"(its max logit is at least {value:.4g} - log T)"
    )


def growth(reader: WindowReader, run_id: int, cols: PointColumns, th: dict[str, float]) -> list[NewAlert]:
    """``z_growth`` in two tiers: a climb at or above the metric's floor is a warning; one at or above
    ``growth_info_fraction`` x the floor, but below it, is info (visible on the run, pages nobody)."""
    n = int(th["growth_window"])
    need = max(2, int(th["growth_min_points"]))
    rise = log_factor(th)
    info = growth_info_fraction(th)
    recent = growth_recent(th)
    series = _collect(
        cols, lambda name: info * th[f"{name}_growth_floor"] if name in GROWTH_METRICS else None, strict=False
    )
    alerts = []
    for ((name, layer), pts), before in zip(series.items(), _windows(reader, run_id, series, n)):
        window = _GrowthWindow(list(before), n)
        floor = th[f"{name}_growth_floor"]
        floors = (("warning", floor), ("info", info * floor)) if info < 1 else (("warning", floor),)
        was = {tier: _growing(window, need, rise, level, recent) for tier, level in floors}
        for step, value in pts:
            window = _GrowthWindow([*window.points, (step, value)][-n:], n)
            now = {tier: _growing(window, need, rise, level, recent) for tier, level in floors}
            # the highest tier that starts to hold; an info climb that turns into a warning raises both
            tier = next((t for t, _ in floors if now[t] and not was[t]), None)
            if tier is not None and not (tier == "info" and now["warning"]):
                factor = math.exp(window.fitted)
                first = window.points[0]
                where = "" if layer is None else f" of layer {layer}"
                below = f", below the warning floor {floor:.4g}" if tier == "info" else ""
                message = (
                    f"{name}{where} grew {factor:.3g}x (Theil-Sen fit of ln {name}) from step {first[0]} "
                    f"to {step}, now {value:.4g}{below}"
                )
                alerts.append(NewAlert("z_growth", tier, name, layer, step, value, first[1], message))
            was = now
    return alerts


def growth_info_fraction(th: dict[str, float]) -> float:
    """The info tier's floor as a fraction of the warning floor (1: no info tier)."""
    return min(1.0, max(0.0, th.get("growth_info_fraction", 1.0)))


def growth_recent(th: dict[str, float]) -> bool:
    """Whether the window's last ``growth_window // 2`` points must keep the pace too (``growth_recent`` 1)."""
    return th.get("growth_recent", 0.0) >= 0.5


def recent_rise(window: Sequence[tuple[int, float]], n: int) -> float:
    """The fitted rise of the window's last ``n // 2`` points (a full window's last half; while a run has
    fewer than ``n`` points, still its last ``n // 2``, as Prometheus' 8-minute ``deriv`` reads them),
    carried over the whole window's span: what the window would have risen at the pace of its end."""
    tail = window[-max(2, n // 2) :]
    span, tail_span = window[-1][0] - window[0][0], tail[-1][0] - tail[0][0]
    fitted = fitted_log_rise(tail)
    return fitted * span / tail_span if tail_span > 0 and math.isfinite(fitted) else math.nan


class GrowthStats(NamedTuple):
    """What ``z_growth`` compares with ln(``growth_factor``), for the Prometheus rules (gauges)."""

    rise: float  # the window's fitted rise of ln(value) (:func:`fitted_log_rise`)
    late: float  # its last growth_window // 2 points' rise over the window's span (NaN: no fit)


def growth_stats(points: Sequence[tuple[int, float]], th: dict[str, float]) -> GrowthStats | None:
    """:class:`GrowthStats` of the last ``growth_window`` of ``points`` (step, value; oldest first), the
    growth rule's window; None with fewer than ``growth_min_points`` points or no fit of the window."""
    n = int(th["growth_window"])
    window = _GrowthWindow(list(points)[-n:], n)
    if len(window.points) < max(2, int(th["growth_min_points"])) or not math.isfinite(window.fitted):
        return None
    return GrowthStats(window.fitted, window.late)


class _GrowthWindow:
    """A growth window (at most ``n`` points, oldest first), its fits made at most once: the warning and
    the info tier, and the alert's message, read the same two, and neither is made for a window that
    fails before it (too few points, the last value below the floor)."""

    def __init__(self, points: list[tuple[int, float]], n: int) -> None:
        self.points = points
        self.n = n

    @cached_property
    def fitted(self) -> float:
        """The whole window's fitted rise (:func:`fitted_log_rise`)."""
        return fitted_log_rise(self.points)

    @cached_property
    def late(self) -> float:
        """Its last ``n // 2`` points' rise over the whole span (:func:`recent_rise`)."""
        return recent_rise(self.points, self.n)


def _growing(window: _GrowthWindow, need: int, rise: float, floor: float, recent: bool = False) -> bool:
    if len(window.points) < need or not window.points:
        return False
    last = window.points[-1][1]
    if not (math.isfinite(last) and last >= floor):
        return False
    fitted = window.fitted
    if not (math.isfinite(fitted) and fitted >= rise):
        return False
    if not recent:
        return True
    late = window.late
    return math.isfinite(late) and late >= rise


def persistent_spike(
    streak: Sequence[float], history: Sequence[float], th: dict[str, float]
) -> tuple[bool, float | None]:
    """(spike?, trailing mean): every value of ``streak`` (logged points in a row) is a
    :func:`sigma_spike` against the same ``history``, the values before the first of them. A blip
    that the next logged point does not repeat is no spike with a streak of two."""
    stats = spike_stats([*history, *streak], (len(history), len(streak)), th)
    return stats is not None and is_sigma_spike(stats, th), None if stats is None else stats.mean


class SpikeStats(NamedTuple):
    """What the sigma-spike rule compares at a metric's latest logged point (the Prometheus rules read
    them as gauges: :mod:`monitor.alerting.prometheus`)."""

    streak: float  # the lowest of the latest ``persist`` values: all of them clear a bar when it does
    mean: float  # of the finite values of the window before the streak
    sigma: float  # their (population) standard deviation


def spike_stats(values: Sequence[float], span: tuple[int, int], th: dict[str, float]) -> SpikeStats | None:
    """:class:`SpikeStats` at the end of ``values`` (a metric's logged values, oldest first) for ``span``
    (window, persist: :func:`spike_span`); None where the rule gives no verdict: a value of the streak
    is not finite (NaN has its own rule), or fewer than ``sigma_spike_min_points`` finite values precede it."""
    n, persist = span
    end = len(values) - persist
    if end < 0:
        return None
    streak = values[end:]
    history = [v for v in values[max(0, end - n) : end] if math.isfinite(v)]
    if not all(math.isfinite(v) for v in streak) or len(history) < th["sigma_spike_min_points"]:
        return None
    return SpikeStats(min(streak), float(np.mean(history)), float(np.std(history)))


def is_sigma_spike(stats: SpikeStats, th: dict[str, float]) -> bool:
    """The streak above mean + k sigma, and above the mean by the minimum relative jump."""
    jump = stats.streak - stats.mean
    return jump > th["sigma_spike_multiple"] * stats.sigma and jump > th["sigma_spike_min_relative"] * abs(stats.mean)


def spike_span(name: str, th: dict[str, float]) -> tuple[int, int]:
    """(window, persist) of a sigma-spike metric: its own trailing window and streak length."""
    return int(th[f"{name}_spike_window"]), max(1, int(th[f"{name}_spike_persist"]))


def shift_span(th: dict[str, float]) -> tuple[int, int]:
    """(window, points) of the loss shift: the values it is judged against and the latest it tests."""
    return int(th["loss_shift_window"]), max(2, int(th["loss_shift_points"]))


def loss_and_grad_norm(reader: WindowReader, run_id: int, cols: PointColumns, th: dict[str, float]) -> list[NewAlert]:
    """The sigma spikes of the loss and the grad norm and the loss's shift, on one window read per series."""
    spans = {name: spike_span(name, th) for name in SIGMA_SPIKE_METRICS}
    limit = max(*(n + p - 1 for n, p in spans.values()), sum(shift_span(th)))
    series = _collect(cols, lambda name: -math.inf if name in SIGMA_SPIKE_METRICS else None, strict=False)
    alerts = []
    for ((name, layer), pts), before in zip(series.items(), _windows(reader, run_id, series, limit)):
        alerts += _spikes(name, layer, pts, before, spans[name], th)
        if name == "loss":
            alerts += _shifts(layer, pts, before, th)
    return alerts


def _spikes(
    name: str,
    layer: int | None,
    pts: list[tuple[int, float]],
    before: list[tuple[int, float]],
    span: tuple[int, int],
    th: dict[str, float],
) -> list[NewAlert]:
    n, persist = span
    values = [v for _, v in before] + [v for _, v in pts]
    alerts = []
    for j, (step, value) in enumerate(pts, start=len(before)):
        stats = spike_stats(values[: j + 1], span, th)
        if stats is not None and is_sigma_spike(stats, th):
            k = th["sigma_spike_multiple"]
            held = f" ({persist} logged points in a row)" if persist > 1 else ""
            history = min(n, j + 1 - persist)
            message = (
                f"{name} spiked to {value:.4g} at step {step}{held}: above the trailing mean {stats.mean:.4g} "
                f"+ {k:.3g} sigma of the {history} values before"
            )
            alerts.append(NewAlert(SIGMA_SPIKE_METRICS[name], "warning", name, layer, step, value, stats.mean, message))
    return alerts


class ShiftStats(NamedTuple):
    """What ``loss_shift`` compares at the loss's latest logged point (gauges for Prometheus too)."""

    recent: float  # the mean of the latest ``loss_shift_points`` values without the largest of them
    mean: float  # of the ``loss_shift_window`` values before them
    error: float  # the standard deviation of those / sqrt(points - 1): the recent mean's standard error


def shift_stats(values: Sequence[float], th: dict[str, float]) -> ShiftStats | None:
    """:class:`ShiftStats` at the end of ``values``; None where the rule gives no verdict: fewer than
    ``loss_shift_points`` values, fewer than ``sigma_spike_min_points`` (and 2) before them, or a value
    of either part not finite (NaN has its own rule)."""
    n, m = shift_span(th)
    recent, history = values[-m:], values[max(0, len(values) - m - n) : max(0, len(values) - m)]
    if len(recent) < m or len(history) < max(th["sigma_spike_min_points"], 2):
        return None
    if not all(math.isfinite(v) for v in (*recent, *history)):
        return None
    now = float(np.mean(sorted(recent)[:-1]))
    return ShiftStats(now, float(np.mean(history)), float(np.std(history)) / math.sqrt(m - 1))


def mean_shift(values: Sequence[float], th: dict[str, float]) -> tuple[bool, float | None, float | None]:
    """(shifted?, window mean, recent mean) at the end of ``values``: the mean of the last
    ``loss_shift_points`` without the largest of them (one spike is no shift; it is the spike rule's)
    above the mean of the ``loss_shift_window`` before them by ``loss_shift_multiple`` standard errors
    (sigma / sqrt(points - 1)) and by the relative minimum (:func:`shift_stats`)."""
    stats = shift_stats(values, th)
    if stats is None:
        return False, None, None
    jump = stats.recent - stats.mean
    shifted = jump > th["loss_shift_multiple"] * stats.error and jump > th["sigma_spike_min_relative"] * abs(stats.mean)
    return shifted, stats.mean, stats.recent


def _shifts(
    layer: int | None, pts: list[tuple[int, float]], before: list[tuple[int, float]], th: dict[str, float]
) -> list[NewAlert]:
    """``loss_shift`` where the test starts to hold (it did not at the loss's previous point)."""
    n, m = shift_span(th)
    values = [v for _, v in before]
    was = mean_shift(values, th)[0]
    alerts = []
    for step, value in pts:
        values.append(value)
        now, mean, recent = mean_shift(values, th)
        if now and not was:
            assert mean is not None and recent is not None
            message = (
                f"the loss stepped up: its last {m} logged values to step {step}, their largest left out, "
                f"average {recent:.4g}, above the mean {mean:.4g} of the {n} before them by more than "
                f"{th['loss_shift_multiple']:.3g} standard errors"
            )
            alerts.append(NewAlert("loss_shift", "warning", "loss", layer, step, value, mean, message))
        was = now
    return alerts


def detect_trends(reader: WindowReader, run_id: int, cols: PointColumns, th: dict[str, float]) -> list[NewAlert]:
    """Every trend rule's alerts on one batch (after it is stored)."""
    return [
        *ceilings(reader, run_id, cols, th),
        *growth(reader, run_id, cols, th),
        *loss_and_grad_norm(reader, run_id, cols, th),
    ]
