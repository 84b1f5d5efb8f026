"""Prometheus metrics: the service's own (module level) and a scrape-time collector over active runs.

Service metrics are declared once here, unregistered; :func:`build_registry` puts them and a
:class:`RunCollector` into a registry per app (tests pass a fresh ``CollectorRegistry``).

Run gauges are read from the ``series_latest`` table at scrape time, for runs whose status is
``running`` only (a finished run's series disappear, so label sets stay bounded), and for the
gauges' metric names only: a scrape reads ~11 series per layer of each active run, however many
other series (``user.*``) the runs hold (issue 37); a run's step, last write and series count come
from its ``runs`` row (``hyperwatch_run_series``: the count the cardinality limit is checked against). Labels are
``project`` and ``run``; ``layer`` only on the ``hyperwatch_layer_*`` families and only for runs
created with ``export_layers: true``. No step or metric-name labels: per-step detail stays in SQL.
NaN and +-Inf are exported as themselves (the exposition format has NaN, +Inf and -Inf).

The Z-spike rules (prometheus/rules.yml) need a baseline that does not depend on how fast the
machine trains, so the collector also exports, per run, the trailing median *in logged steps* of
the max over layers and its robust deviation (1.4826 x MAD; :func:`monitor.alerting.detectors.step_baseline`,
over the run's group ``spike_window``) and the group's own thresholds (overridden or learned, as the
detectors use them: :func:`monitor.thresholds.learned.effective_thresholds`): the rule then fires on the
service detector's three tests (level, ratio, robust deviations), whatever the wall-clock speed,
and a group's thresholds tune both alerting paths at once.

The loss and grad-norm rules are judged in logged steps the same way (:data:`SIGMA_GAUGES`): per run,
what :func:`monitor.alerting.trends.spike_stats` and :func:`~monitor.alerting.trends.shift_stats` compute at
the metric's latest logged point (the streak's lowest value, the mean and sigma of the window before it;
the loss shift's recent mean, window mean and standard error). Before, the rules took their windows
and streaks from the scraped samples, so they held logged steps only at one scrape per logged step:
a run that logs its loss every 3 minutes is scraped 3 times per value, its 16-sample window held ~5
values and the shift rule's "6 samples without their largest" kept a spike's repeats (the demo's one
false alarm by the loss, issue 33). A statistic without a verdict (too little history, a non-finite
value: NaN has its own rule) is not exported, and the rule cannot fire on it. The growth rules too
(:data:`GROWTH_GAUGES`): the fitted rise of ln(max over layers) over the last ``growth_window`` logged
steps, where ``deriv`` over 16 one-minute samples held 16 logged steps only at one scrape per logged
step (at 3 scrapes per step ~5, so a climb came late; at one scrape per 4 steps 64, so a slow one
fired). Every rule of ``prometheus/rules.yml`` is now counted in logged steps.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Collection, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from hyperwatch.monitor.alerting.detectors import SPIKE_METRICS, step_baseline
from hyperwatch.monitor.alerting.trends import (
    growth_stats,
    shift_span,
    shift_stats,
    spike_span,
    spike_stats,
)
from hyperwatch.monitor.core.errors import MonitorError
from hyperwatch.monitor.store.base import Store
from hyperwatch.monitor.store.entities import ActiveRun, LatestValue
from hyperwatch.monitor.thresholds.defaults import GROWTH_METRICS, SIGMA_SPIKE_METRICS
from hyperwatch.monitor.thresholds.learned import effective_thresholds

log = logging.getLogger(__name__)

POINTS_INGESTED = Counter(
    "hyperwatch_points_ingested_total", "Metric points stored (duplicates of a batch not counted)", registry=None
)
BATCHES_INGESTED = Counter(
    "hyperwatch_batches_ingested_total", "Batches received, by outcome", ["outcome"], registry=None
)
REQUEST_DURATION = Histogram(
    "hyperwatch_http_request_duration_seconds",
    "HTTP request duration by method, route template and status class",
    ["method", "route", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=None,
)
DATABASE_ERRORS = Counter("hyperwatch_database_errors_total", "Database operations that failed", registry=None)
ALERTS_RAISED = Counter(
    "hyperwatch_alerts_raised_total", "Alert events stored by the detectors", ["rule"], registry=None
)
WEBHOOK_DELIVERIES = Counter(
    "hyperwatch_webhook_deliveries_total",
    "Webhook notification attempts (monitor.alerting.notify), by outcome: delivered, retry (failed, will be "
    "tried again) or failed (given up)",
    ["outcome"],
    registry=None,
)
SERVICE_METRICS = (
    POINTS_INGESTED,
    BATCHES_INGESTED,
    REQUEST_DURATION,
    DATABASE_ERRORS,
    ALERTS_RAISED,
    WEBHOOK_DELIVERIES,
)

# registry metric name -> (gauge suffix, help). Max over layers at the series' latest step.
RUN_GAUGES: dict[str, tuple[str, str]] = {
    "attention_z": ("attention_z_max", "Latest attention Z-value, max over layers (logit^2)"),
    "router_z": ("router_z_max", "Latest router Z-value, max over MoE layers (logit^2)"),
    "max_vio": ("max_vio_ratio_max", "Latest MaxVio, max over MoE layers (ratio; 0 = balanced)"),
    "attention_rms": ("attention_rms_max", "Latest attention branch output RMS, max over layers"),
    "mlp_rms": ("mlp_rms_max", "Latest MLP/MoE branch output RMS, max over layers"),
    "attention_outlier_ratio": ("attention_outlier_ratio_max", "Latest attention output outlier ratio (0..1)"),
    "mlp_outlier_ratio": ("mlp_outlier_ratio_max", "Latest MLP/MoE output outlier ratio (0..1)"),
    "loss": ("loss_nats", "Latest training loss (nats)"),
    "attention_lse_max": ("attention_lse_max_max", "Latest max attention LSE, max over heads and layers (logit)"),
    "output_z": ("output_z", "Latest output Z-value of the LM head (logit^2)"),
    "grad_norm": ("grad_norm", "Latest global gradient norm"),
}
RUN_LEVEL = frozenset({"loss", "output_z", "grad_norm"})
"""Run-level metrics: no ``hyperwatch_layer_*`` family. The per-head ``attention_lse_max.h<k>`` names
are no gauges at all (only the layer's max over heads is): the store keeps the heads."""


SIGMA_GAUGES: dict[str, str] = {
    # gauge suffix (hyperwatch_run_<suffix>) -> help; {m}: loss or grad_norm
    "{m}_spike_streak": "The lowest of the latest {m}_spike_persist logged values: the sigma-spike rule's candidate",
    "{m}_spike_mean": "Mean of the {m}_spike_window logged values before the streak (the finite ones)",
    "{m}_spike_sigma": "Standard deviation (population) of the same values as hyperwatch_run_{m}_spike_mean",
    "loss_shift_recent": "Mean of the latest loss_shift_points logged losses without the largest of them",
    "loss_shift_mean": "Mean of the loss_shift_window logged losses before those",
    "loss_shift_error": "Standard deviation of the same losses as hyperwatch_run_loss_shift_mean / sqrt(points - 1)",
}


GROWTH_GAUGES: dict[str, str] = {
    # gauge suffix (hyperwatch_run_<suffix>) -> help; {m}: a growth metric, over its max over layers
    "{m}_growth_rise": "Fitted rise of ln(max over layers of {m}) over its last growth_window logged steps (Theil-Sen)",
    "{m}_growth_late": "The window's last growth_window // 2 logged steps' rise, carried over its span (NaN: no fit)",
}


TREND_GAUGES: dict[str, tuple[str, str]] = {
    # threshold (monitor.thresholds.defaults) -> (gauge suffix, help)
    "attention_lse_max_limit": ("logit_ceiling", "The group threshold attention_lse_max_limit (logit)"),
    "growth_factor": ("growth_log_factor", "ln of the group threshold growth_factor: the fitted rise of a climb"),
    "attention_z_growth_floor": ("attention_z_growth_floor", "The group threshold attention_z_growth_floor"),
    "attention_lse_max_growth_floor": (
        "attention_lse_max_growth_floor",
        "The group threshold attention_lse_max_growth_floor",
    ),
    "output_z_growth_floor": ("output_z_growth_floor", "The group threshold output_z_growth_floor"),
    "router_z_growth_floor": ("router_z_growth_floor", "The group threshold router_z_growth_floor"),
    "attention_rms_growth_floor": ("attention_rms_growth_floor", "The group threshold attention_rms_growth_floor"),
    "mlp_rms_growth_floor": ("mlp_rms_growth_floor", "The group threshold mlp_rms_growth_floor"),
    "growth_info_fraction": (
        "growth_info_fraction",
        "The group threshold growth_info_fraction: a climb above this fraction of its floor, but below it, is info",
    ),
    "growth_recent": (
        "growth_recent",
        "The group threshold growth_recent: 1 when a climb's last 8 points must keep its pace (0: the whole window)",
    ),
    "sigma_spike_multiple": ("sigma_spike_multiple", "The group threshold sigma_spike_multiple (loss, grad norm)"),
    "sigma_spike_min_relative": ("sigma_spike_min_relative", "The group threshold sigma_spike_min_relative"),
    "loss_shift_multiple": ("loss_shift_multiple", "The group threshold loss_shift_multiple (standard errors)"),
    "max_vio_limit": ("max_vio_limit", "The group threshold max_vio_limit (MoE routing collapse)"),
}


def _max(values: list[float]) -> float:
    """Max that keeps NaN: a NaN anywhere is the fact to report."""
    if any(math.isnan(v) for v in values):
        return math.nan
    return max(values)


def step_gauges(metric: str, points: Sequence[tuple[int, float]], th: dict[str, float]) -> dict[str, float]:
    """The statistics in logged steps ``/metrics`` exports for ``metric`` whose logged ``(step, value)``
    points (oldest first; a layered metric's max over layers per step) are ``points``, by gauge suffix:
    :data:`SIGMA_GAUGES` of the loss and the grad norm, :data:`GROWTH_GAUGES` of a growth metric; none
    where its rule gives no verdict. The benchmark replays them for recordings older than the gauges."""
    out: dict[str, float] = {}
    if metric in SIGMA_SPIKE_METRICS:
        values = [v for _step, v in points]
        spike = spike_stats(values, spike_span(metric, th), th)
        if spike is not None:
            out.update({f"{metric}_spike_{k}": v for k, v in spike._asdict().items()})
        shift = shift_stats(values, th) if metric == "loss" else None
        if shift is not None:
            out.update({f"loss_shift_{k}": v for k, v in shift._asdict().items()})
    if metric in GROWTH_METRICS:
        growth = growth_stats(points, th)
        if growth is not None:
            out.update({f"{metric}_growth_{k}": v for k, v in growth._asdict().items()})
    return out


def _step_families(gauges: dict[str, str], metrics: Collection[str]) -> dict[str, GaugeMetricFamily]:
    """One family per gauge suffix of ``gauges`` (``{m}``: each of ``metrics``; else the loss's own)."""
    fams = {}
    for suffix, help_ in gauges.items():
        for m in metrics if "{m}" in suffix else ("loss",):
            name = suffix.format(m=m)
            fams[name] = GaugeMetricFamily(f"hyperwatch_run_{name}", help_.format(m=m), labels=["project", "run"])
    return fams


def _per_run(
    latest: list[LatestValue], names: Collection[str], run_level: bool = False
) -> dict[tuple[str, str, int, int | None], list[LatestValue]]:
    """The latest values of ``names`` (run-level series only, with ``run_level``) by (project, run, run id,
    group id)."""
    out: dict[tuple[str, str, int, int | None], list[LatestValue]] = defaultdict(list)
    for lv in latest:
        if lv.name in names and (lv.layer is None or not run_level):
            out[(lv.project, lv.run, lv.run_id, lv.group_id)].append(lv)
    return out


Maxima = dict[tuple[int, str, int], tuple[int, list[tuple[int, float]]]]
"""(run id, name, top step) -> (the limit read, ``Store.step_maxima``'s window): one scrape's reads."""


class RunCollector(Collector):
    """Gauges of active runs, read from the store at scrape time."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def describe(self) -> list[Any]:
        return []  # values are read at scrape time; nothing to describe at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            # the gauges' metrics only: a run's other series (any number of user.* names) cost nothing here
            latest = self.store.latest_for_active_runs(list(RUN_GAUGES))
            runs = self.store.active_runs()
        except MonitorError as exc:  # a scrape must still return the service metrics
            log.warning("run gauges skipped: %s", exc)
            return
        yield from self._latest(latest, runs)
        try:
            groups: dict[int | None, dict[str, float]] = {}  # each group's thresholds, read once a scrape
            maxima: Maxima = {}  # the max-over-layers windows this scrape read (Z: spike baseline and growth)
            yield from self._spike_baselines(latest, groups, maxima)
            yield from self._trend_thresholds(latest, groups)
            yield from self._sigma_statistics(latest, groups)
            yield from self._growth_statistics(latest, groups, maxima)
        except MonitorError as exc:
            log.warning("spike baselines skipped: %s", exc)

    def _thresholds(self, groups: dict[int | None, dict[str, float]], group_id: int | None) -> dict[str, float]:
        """A group's thresholds as the detectors use them (``groups``: those this scrape read)."""
        if group_id not in groups:
            groups[group_id] = effective_thresholds(self.store.get_group(group_id) if group_id else None)
        return groups[group_id]

    def _sigma_statistics(
        self, latest: list[LatestValue], groups: dict[int | None, dict[str, float]]
    ) -> list[GaugeMetricFamily]:
        """Per run: the loss and grad-norm rules' statistics at each metric's latest logged point
        (:data:`SIGMA_GAUGES`), from one window read per run."""
        fams = _step_families(SIGMA_GAUGES, SIGMA_SPIKE_METRICS)
        for (project, run, run_id, group_id), rows in _per_run(latest, SIGMA_SPIKE_METRICS, run_level=True).items():
            th = self._thresholds(groups, group_id)
            limit = max(sum(shift_span(th)), *(sum(spike_span(m, th)) for m in SIGMA_SPIKE_METRICS))
            windows = self.store.trailing_points(run_id, [(lv.name, None, lv.step + 1) for lv in rows], limit)
            for lv, window in zip(rows, windows, strict=True):
                for suffix, value in step_gauges(lv.name, window, th).items():
                    fams[suffix].add_metric([project, run], value)
        return list(fams.values())

    def _maxima(self, memo: Maxima, run_id: int, name: str, top: int, limit: int) -> list[tuple[int, float]]:
        """``Store.step_maxima`` of ``name`` up to ``top``, its newest ``limit`` steps; read once a scrape at
        the longest limit asked first (the Z-spike baseline's, then the growth window's from it)."""
        got = memo.get((run_id, name, top))
        if got is None or got[0] < limit:
            got = memo[(run_id, name, top)] = (limit, self.store.step_maxima(run_id, [(name, top)], limit)[0])
        return got[1][-limit:]

    def _growth_statistics(
        self, latest: list[LatestValue], groups: dict[int | None, dict[str, float]], maxima: Maxima
    ) -> list[GaugeMetricFamily]:
        """Per run and growth metric: the growth rule's rise over the metric's last ``growth_window`` logged
        steps, its max over layers per step (:data:`GROWTH_GAUGES`; ``Store.step_maxima``, all layers of a
        name in two statements)."""
        fams = _step_families(GROWTH_GAUGES, GROWTH_METRICS)
        for (project, run, run_id, group_id), rows in _per_run(latest, GROWTH_METRICS).items():
            th = self._thresholds(groups, group_id)
            n = int(th["growth_window"])
            top: dict[str, int] = {}
            layered: set[str] = set()
            for lv in rows:
                top[lv.name] = max(lv.step, top.get(lv.name, lv.step))
                if lv.layer is not None:
                    layered.add(lv.name)
            series = {m: self._maxima(maxima, run_id, m, top[m], n) for m in layered}
            flat = [m for m in top if m not in layered]  # run level (output Z): its own points
            series.update(zip(flat, self.store.trailing_points(run_id, [(m, None, top[m] + 1) for m in flat], n)))
            for m, points in series.items():
                for suffix, value in step_gauges(m, points, th).items():
                    fams[suffix].add_metric([project, run], value)
        return list(fams.values())

    def _trend_thresholds(
        self, latest: list[LatestValue], groups: dict[int | None, dict[str, float]]
    ) -> list[GaugeMetricFamily]:
        """Per active run: its group's thresholds of the trend rules (prometheus/rules.yml reads them)."""
        labels = ["project", "run"]
        fams = {
            key: GaugeMetricFamily(f"hyperwatch_run_{name}", help_, labels=labels)
            for key, (name, help_) in TREND_GAUGES.items()
        }
        done: set[tuple[str, str]] = set()
        for lv in latest:
            if (lv.project, lv.run) in done:
                continue
            done.add((lv.project, lv.run))
            th = self._thresholds(groups, lv.group_id)
            for key, fam in fams.items():
                fam.add_metric([lv.project, lv.run], math.log(th[key]) if key == "growth_factor" else th[key])
        return list(fams.values())

    def _spike_baselines(
        self, latest: list[LatestValue], groups: dict[int | None, dict[str, float]], maxima: Maxima
    ) -> list[GaugeMetricFamily]:
        """Per run and spike metric: the step-space baseline and the group's thresholds."""
        labels = ["project", "run"]
        base = {
            m: GaugeMetricFamily(
                f"hyperwatch_run_{m}_baseline",
                f"Median {m} (max over layers) of the group's spike_window logged steps before the latest",
                labels=labels,
            )
            for m in SPIKE_METRICS
        }
        floor = {
            m: GaugeMetricFamily(
                f"hyperwatch_run_{m}_spike_floor", f"The group threshold {m}_min: no spike below it", labels=labels
            )
            for m in SPIKE_METRICS
        }
        deviation = {
            m: GaugeMetricFamily(
                f"hyperwatch_run_{m}_baseline_deviation",
                f"1.4826 x the MAD of the same window as hyperwatch_run_{m}_baseline (a robust standard deviation)",
                labels=labels,
            )
            for m in SPIKE_METRICS
        }
        relative = GaugeMetricFamily(
            "hyperwatch_run_spike_min_relative",
            "The group threshold spike_min_relative: a spike exceeds (1 + it) x its baseline",
            labels=labels,
        )
        mad_multiple = GaugeMetricFamily(
            "hyperwatch_run_spike_mad_multiple",
            "The group threshold spike_mad_multiple: a spike exceeds its baseline by this many robust deviations",
            labels=labels,
        )
        layers: dict[tuple[str, str, int, int | None, str], list[tuple[int | None, int]]] = defaultdict(list)
        for lv in latest:
            if lv.name in SPIKE_METRICS:
                layers[(lv.project, lv.run, lv.run_id, lv.group_id, lv.name)].append((lv.layer, lv.step))
        with_relative: set[tuple[str, str]] = set()
        for (project, run, run_id, group_id, name), rows in layers.items():
            th = self._thresholds(groups, group_id)
            if (project, run) not in with_relative:
                with_relative.add((project, run))
                relative.add_metric([project, run], th["spike_min_relative"])
                mad_multiple.add_metric([project, run], th["spike_mad_multiple"])
            top, n = max(step for _, step in rows), int(th["spike_window"])
            if all(layer is not None for layer, _ in rows):  # the max over layers per step, all layers at once
                newest = self._maxima(maxima, run_id, name, top, n + 1)
                windows = [[(step, v) for step, v in newest if step < top][-n:]]
            else:
                windows = self.store.trailing_points(run_id, [(name, layer, top) for layer, _ in rows], n)
            found = step_baseline(windows, th)
            if found is not None:
                base[name].add_metric([project, run], found[0])
                deviation[name].add_metric([project, run], found[1])
            floor[name].add_metric([project, run], th[f"{name}_min"])
        return [*base.values(), *deviation.values(), *floor.values(), relative, mad_multiple]

    def _latest(self, latest: list[LatestValue], runs: list[ActiveRun]) -> Iterator[GaugeMetricFamily]:
        per_run: dict[tuple[str, str], dict[str, list[tuple[int | None, int, float]]]] = defaultdict(
            lambda: defaultdict(list)
        )
        export_layers: dict[tuple[str, str], bool] = {}
        for lv in latest:
            key = (lv.project, lv.run)
            per_run[key][lv.name].append((lv.layer, lv.step, lv.value))
            export_layers[key] = lv.export_layers
        labels = ["project", "run"]
        fams = {
            m: GaugeMetricFamily(f"hyperwatch_run_{suffix}", help_, labels=labels)
            for m, (suffix, help_) in RUN_GAUGES.items()
        }
        layer_fams = {
            m: GaugeMetricFamily(
                f"hyperwatch_layer_{m}", f"Latest {m} per layer (runs with export_layers)", labels=[*labels, "layer"]
            )
            for m in RUN_GAUGES
            if m not in RUN_LEVEL
        }
        nan_flag = GaugeMetricFamily(
            "hyperwatch_run_nan", "1 when the run's latest loss or any latest indicator is NaN or +-Inf", labels=labels
        )
        step = GaugeMetricFamily("hyperwatch_run_step", "Latest step with a stored point", labels=labels)
        seen = GaugeMetricFamily(
            "hyperwatch_run_last_point_timestamp_seconds", "Unix time the run last sent points", labels=labels
        )
        series = GaugeMetricFamily(
            "hyperwatch_run_series",
            "Distinct (metric name, layer) series the run holds (HYPERWATCH_MAX_SERIES_PER_RUN caps it)",
            labels=labels,
        )
        for run in runs:
            lab = [run.project, run.run]
            step.add_metric(lab, float(run.last_step))
            series.add_metric(lab, float(run.series_count))
            if run.last_point_at is not None:
                seen.add_metric(lab, run.last_point_at.timestamp())
            names = per_run.get((run.project, run.run), {})
            nonfinite = False
            for name, rows in names.items():
                top = max(s for _, s, _ in rows)
                at_top = [v for _, s, v in rows if s == top]
                nonfinite = nonfinite or any(not math.isfinite(v) for v in at_top)
                fams[name].add_metric(lab, _max(at_top))
                if export_layers.get((run.project, run.run)) and name in layer_fams:
                    for layer, _s, v in rows:
                        if layer is not None:
                            layer_fams[name].add_metric([*lab, str(layer)], v)
            nan_flag.add_metric(lab, 1.0 if nonfinite else 0.0)
        yield from fams.values()
        yield from layer_fams.values()
        yield from (nan_flag, step, seen, series)


def build_registry(store: Store, registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """A registry holding the service metrics and a collector over ``store``'s active runs."""
    reg = registry if registry is not None else CollectorRegistry()
    for metric in SERVICE_METRICS:
        reg.register(metric)
    reg.register(RunCollector(store))
    return reg
