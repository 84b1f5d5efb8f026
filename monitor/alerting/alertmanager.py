"""The Alertmanager webhook's work, batched per run (``POST /api/v1/alerts/prometheus``).

A notification may carry thousands of alerts, most about a few runs. Each run is looked up once,
its latest series read once, and all its alerts stored in one transaction; one lookup, one series
read and one transaction per alert took 15.5 s for 2,000 alerts of one run (issue 25). What is
stored, and what is listed as ignored, is the same as alert by alert.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from hyperwatch.monitor.core.errors import NotFoundError
from hyperwatch.monitor.store.base import Store
from hyperwatch.monitor.store.entities import NewAlert, SeriesInfo

PROMETHEUS_METRICS: dict[str, str] = {
    # Prometheus alertname (stored as the rule, so it never collides with a detector's event) -> metric
    "HyperWatchAttentionZSpike": "attention_z",
    "HyperWatchRouterZSpike": "router_z",
    "HyperWatchNaNLoss": "loss",
    "HyperWatchMaxVioCollapse": "max_vio",
    "HyperWatchRunStale": "loss",
    "HyperWatchLogitCeiling": "attention_lse_max",
    "HyperWatchAttentionZCeiling": "attention_z",
    "HyperWatchAttentionZGrowth": "attention_z",
    "HyperWatchOutputZGrowth": "output_z",
    "HyperWatchLossSpike": "loss",
    "HyperWatchGradNormSpike": "grad_norm",
}
Labelled = tuple[Mapping[str, str], Mapping[str, str]]  # an alert's labels and annotations


def store_firing(
    store: Store, alerts: Iterable[tuple[str, Mapping[str, str], Mapping[str, str]]]
) -> tuple[int, list[str]]:
    """Store each firing alert ``(status, labels, annotations)`` of a known run; ``(stored, ignored)``.

    ``ignored`` says why each alert that was not stored was left out, in the order they came for
    alerts refused on their own labels, then per unknown run.
    """
    ignored: list[str] = []
    by_run: dict[tuple[str, str], list[Labelled]] = {}
    for status, labels, notes in alerts:
        where = labels.get("alertname", "") or "alert without alertname"
        if status != "firing":
            ignored.append(f"{where}: {status}, only firing alerts are stored")
            continue
        if "run" not in labels:
            ignored.append(f"{where}: no 'run' label; the rules in prometheus/rules.yml keep project and run")
            continue
        key = (labels.get("project", "default"), labels["run"])
        by_run.setdefault(key, []).append((labels, notes))
    stored = 0
    for (project, run_name), group in by_run.items():
        try:
            run = store.find_run(project, run_name)
        except NotFoundError:
            for labels, _ in group:
                where = labels.get("alertname", "") or "alert without alertname"
                ignored.append(f"{where}: no run {project}/{run_name}")
            continue
        series = store.list_series(run.id)
        new = [_to_alert(labels, annotations, series, run.last_step) for labels, annotations in group]
        stored += len(store.add_alerts(run.id, new))
    return stored, ignored


def _to_alert(
    labels: Mapping[str, str], annotations: Mapping[str, str], series: list[SeriesInfo], last_step: int | None
) -> NewAlert:
    name = labels.get("alertname", "")
    rule, metric = name[:64] or "prometheus", PROMETHEUS_METRICS.get(name, "loss")
    latest = [s for s in series if s.name == metric]
    step = max((s.step for s in latest), default=last_step or 0)
    value = worst([s.value for s in latest if s.step == step])
    message = annotations.get("summary") or annotations.get("description") or name
    return NewAlert(rule, labels.get("severity", "warning")[:16], metric, None, step, value, None,
                    f"Prometheus {name}: {message}", source="prometheus")  # fmt: skip


def worst(values: list[float]) -> float:
    """The largest value (NaN first): what the rule's ``max over layers`` gauge showed."""
    if not values:
        return math.nan
    if any(math.isnan(v) for v in values):
        return math.nan
    return max(values)
