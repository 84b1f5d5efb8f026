"""A threshold set written into a recording's ``/metrics`` scrapes (issue 33): the Prometheus source of the
family benchmark replays the recorded scrapes with the gauges that export each threshold set to it
(``prometheus/rules.yml`` reads them), and reads back the thresholds the recording service ran at.
A recording older than a gauge lacks it: :func:`older_than_gauge` is the one place that says where it
goes and what the service ran at before it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from hyperwatch.monitor.thresholds.defaults import thresholds_for


def threshold_gauges() -> dict[str, tuple[str, bool]]:
    """Threshold -> (the ``hyperwatch_run_*`` gauge that exports it, exported as its ln?)."""
    from hyperwatch.monitor.alerting.detectors import SPIKE_METRICS
    from hyperwatch.monitor.alerting.prometheus import TREND_GAUGES

    out = {k: (f"hyperwatch_run_{suffix}", k == "growth_factor") for k, (suffix, _help) in TREND_GAUGES.items()}
    out.update({f"{m}_min": (f"hyperwatch_run_{m}_spike_floor", False) for m in SPIKE_METRICS})
    out.update({k: (f"hyperwatch_run_{k}", False) for k in ("spike_min_relative", "spike_mad_multiple")})
    return out


def _gauge_column(columns: dict[str, list[float | None]], gauge: str) -> str | None:
    found = [k for k in columns if k.startswith(gauge + "{")]
    return found[0] if len(found) == 1 else None


_RAN_BEFORE_GAUGE = {"growth_recent": 0.0}  # a rule's fixed value before its threshold had a gauge


class OlderThanGauge(NamedTuple):
    """A recording older than a threshold's gauge: where that gauge goes, and what the service ran at."""

    beside: str  # the growth factor's column: its labels and scrapes are the missing gauge's
    column: str  # the missing gauge's column, named with those labels
    ran_at: float | None  # the value the rule ran at before the gauge (None: not known)


def older_than_gauge(
    columns: dict[str, list[float | None]], key: str, gauges: dict[str, tuple[str, bool]]
) -> OlderThanGauge | None:
    """The one place that knows which threshold gauges a recording may lack: any but the growth factor's
    (exported since the first), so a recording that holds it and not ``key``'s is older than ``key``'s
    gauge. None where it holds ``key``'s, ``key`` has none, or the growth factor's is missing too."""
    if key not in gauges or _gauge_column(columns, gauges[key][0]) is not None:
        return None
    factor = gauges["growth_factor"][0]
    beside = _gauge_column(columns, factor)
    if beside is None:
        return None
    return OlderThanGauge(beside, gauges[key][0] + beside[len(factor) :], _RAN_BEFORE_GAUGE.get(key))


def recorded_thresholds(columns: dict[str, list[float | None]]) -> dict[str, float]:
    """The thresholds the recording service exported (its first scrape that holds each gauge), and those
    it ran at a known value before their gauge (:func:`older_than_gauge`)."""
    out: dict[str, float] = {}
    gauges = threshold_gauges()
    for key, (gauge, as_log) in gauges.items():
        col = _gauge_column(columns, gauge)
        value = next((v for v in columns[col] if v is not None), None) if col else None
        if value is not None:
            out[key] = math.exp(value) if as_log else value
        elif (older := older_than_gauge(columns, key, gauges)) is not None and older.ran_at is not None:
            out[key] = older.ran_at
    return out


def with_thresholds(
    columns: dict[str, list[float | None]], thresholds: dict[str, float], keys: Sequence[str]
) -> tuple[dict[str, list[float | None]], list[str]]:
    """The scrapes with the gauges of ``keys`` set to ``thresholds`` (merged with the defaults) at every
    scrape that recorded them (a gauge the recording lacks, younger than it, at every scrape that holds the
    growth factor's); and the keys that could not be written (no gauge, or neither recorded)."""
    gauges = threshold_gauges()
    th = thresholds_for(thresholds)
    out = dict(columns)
    missing: list[str] = []
    for key in keys:
        col = _gauge_column(columns, gauges[key][0]) if key in gauges else None
        older = older_than_gauge(columns, key, gauges) if col is None else None
        if older is not None:
            col = older.column
            out[col] = list(out[older.beside])
        if col is None:
            missing.append(key)
            continue
        value = math.log(th[key]) if gauges[key][1] else th[key]
        out[col] = [None if v is None else value for v in out[col]]
    return out, missing


def with_step_statistics(
    columns: dict[str, list[float | None]], thresholds: dict[str, float], logged_steps: Sequence[int]
) -> dict[str, list[float | None]]:
    """The scrapes with the statistics in logged steps the service exports since 2026-11-30 (the loss and
    grad-norm ones, ``monitor.alerting.prometheus.SIGMA_GAUGES``; the growth rises, ``GROWTH_GAUGES``)
    where a recording predates them: at each scrape that holds the metric, what the service's
    ``prometheus.step_gauges`` gives over the values scraped so far, at ``logged_steps`` (the growth
    metrics' max-over-layers gauge). At one scrape per logged step (the recordings' pace)
    those are the metric's logged values, what the service reads. A recording that holds the statistics
    keeps them; ``thresholds`` merge with the defaults."""
    from hyperwatch.monitor.alerting.prometheus import RUN_GAUGES, step_gauges
    from hyperwatch.monitor.thresholds.defaults import GROWTH_METRICS, SIGMA_SPIKE_METRICS

    th = thresholds_for(thresholds)
    out = dict(columns)
    for metric in (*SIGMA_SPIKE_METRICS, *GROWTH_METRICS):
        gauge = f"hyperwatch_run_{RUN_GAUGES[metric][0]}"
        col = _gauge_column(columns, gauge)
        marker = f"{metric}_spike_streak" if metric in SIGMA_SPIKE_METRICS else f"{metric}_growth_rise"
        if col is None or _gauge_column(columns, f"hyperwatch_run_{marker}") is not None:
            continue
        labels, scraped = col[len(gauge) :], columns[col]
        points: list[tuple[int, float]] = []
        found: dict[str, list[float | None]] = {}
        for i, value in enumerate(scraped):
            if value is None:
                continue
            points.append((logged_steps[i], value))
            for name, v in step_gauges(metric, points, th).items():
                found.setdefault(name, [None] * len(scraped))[i] = v
        out.update({f"hyperwatch_run_{name}{labels}": v for name, v in found.items()})
    return out
