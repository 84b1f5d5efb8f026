"""JSON the pages draw: ready-made Plotly figures, under ``/ui/data`` (read auth, like /api/v1 reads).

Every figure comes from the store through the same functions the API uses (the aggregation of
:mod:`monitor.api.routes.analysis`, the store's min/max downsampling), so a page never shows a
number the API would not give.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Annotated, Any

from fastapi import APIRouter, Query

from hyperwatch.monitor.analysis import AnalysisError, fit_group, jsonable, stability_verdict
from hyperwatch.monitor.api.deps import ReadAuth, SettingsDep, StoreDep
from hyperwatch.monitor.core.errors import InvalidInputError
from hyperwatch.monitor.schemas import MetricName
from hyperwatch.monitor.store.base import Store
from hyperwatch.monitor.store.entities import Run, SeriesInfo
from hyperwatch.monitor.views import (
    STABILITY_INDICATORS,
    Agg,
    TokenMap,
    aggregate_series,
    group_records,
    group_runs,
    layer_matrix,
    match_runs,
    stability_values,
    truncate,
)
from hyperwatch.web.figures import (
    RunLine,
    XAxis,
    XAxisError,
    compare_figure,
    heatmap_figure,
    run_line_figure,
    stability_figure,
    x_values,
)
from hyperwatch.web.scale import colours, esc, labels, order_by_size, size_of
from hyperwatch.web.sweeps import sweeps_payload

log = logging.getLogger(__name__)
router = APIRouter(prefix="/ui/data", tags=["web"], dependencies=[ReadAuth], include_in_schema=False)

COMPARE_INDICATORS = (*STABILITY_INDICATORS, "loss")
"""What the scale-comparison page shows, in order."""

Buckets = Annotated[int, Query(ge=10, description="buckets of the downsampling (about the plot's width)")]
GL = Annotated[bool, Query(description="draw lines with WebGL (scattergl)")]


class _LatestCache:
    """``store.list_series(run)`` memoised on the run's state (id, last_point_at, updated_at).

    Every point write moves ``last_point_at``, so a hit is the same answer the store would give;
    it saves the 8 figure requests of one page from reading the same index 8 times per run.
    """

    def __init__(self, size: int = 512) -> None:
        self.size = size
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
            self.items[key] = found
            while len(self.items) > self.size:
                self.items.popitem(last=False)
        return found


_latest = _LatestCache()


def _check_buckets(n: int, limit: int) -> int:
    if n > limit:
        raise InvalidInputError(f"buckets: {n} is above the limit of {limit} (HYPERWATCH_MAX_BUCKETS)")
    return n


@router.get("/groups/{group_id}/compare")
def group_compare(
    group_id: int,
    name: Annotated[MetricName, Query()],
    store: StoreDep,
    settings: SettingsDep,
    x: XAxis = "step",
    agg: Agg = "mean",
    buckets: Buckets = 400,
    gl: GL = False,
) -> dict[str, Any]:
    """One indicator for every run of a group, and its peak/final vs size with the verdict."""
    _check_buckets(buckets, settings.max_buckets)
    group, runs = group_runs(store, group_id)
    runs = order_by_size(runs)
    colour, label = colours(runs), labels(runs)
    rank = {run.id: i for i, run in enumerate(runs)}
    lines: list[RunLine] = []
    records: list[dict[str, Any]] = []
    matching = match_runs(runs)
    for run in runs:
        latest = _latest.get(store, run)
        if not any(s.name == name for s in latest):
            continue
        tmap = TokenMap.of(store, run, latest) if x != "step" else TokenMap((), None)
        line = aggregate_series(store, run, name, agg, buckets, latest, tmap)
        if not line.values:
            continue
        lines.append(RunLine(run, line, label[run.id], colour[run.id], rank[run.id]))
        size = size_of(run)
        if size is not None and run.id in matching.cutoff and matching.reason is None:
            compared = truncate(line, matching.cutoff[run.id])
            if compared.values:
                records.append({"run": run.name, "scale": size, "indicators": {name: stability_values(compared, name)}})
    figure = compare_figure(name, lines, x, agg, gl)
    verdict = None
    if records:
        try:
            verdict = stability_verdict(records).to_json()["indicators"].get(name)
        except AnalysisError as exc:  # the records are built here, so this is a bug worth a log line
            log.warning("stability verdict of %s in group %s failed: %s", name, group.name, exc)
    why = matching.reason or ("n/a: no run has a model size" if not records else None)
    return jsonable(  # type: ignore[no-any-return]
        {
            "group": group.name,
            "figure": figure,
            "stability": stability_figure(name, verdict, "model size (parameters)", why, matching.fraction),
            "runs": len(lines),
        }
    )


@router.get("/groups/{group_id}/sweeps")
def group_sweeps(
    group_id: int,
    store: StoreDep,
    baseline: Annotated[str | None, Query(max_length=64)] = None,
) -> dict[str, Any]:
    """Every figure of the sweeps page (LR sweeps, transfer laws, scaling laws and leverage)."""
    _, runs = group_runs(store, group_id)
    records, skipped = group_records(store, runs)
    methods = sorted({r["method"] or "default" for r in records if r["flops"] is not None})
    if baseline is not None and baseline not in methods:
        raise InvalidInputError(
            f"baseline: {baseline!r} is not a method with FLOPs in this group; choose one of {methods}"
        )
    if not records:
        return {"figures": {}, "notes": ["no run of this group has a final val_loss yet"], "methods": [], "skipped": []}
    try:
        analysis = fit_group(records, baseline=baseline)
    except AnalysisError as exc:
        raise InvalidInputError(str(exc)) from exc
    payload = sweeps_payload(analysis, records)
    payload["methods"] = methods
    payload["skipped"] = [f"{s['run']}: {s['reason']}" for s in skipped]
    return jsonable(payload)  # type: ignore[no-any-return]


@router.get("/runs/{run_id}/indicator")
def run_indicator(
    run_id: int,
    name: Annotated[MetricName, Query()],
    store: StoreDep,
    settings: SettingsDep,
    x: Annotated[XAxis, Query()] = "step",
    buckets: Buckets = 600,
    gl: GL = False,
) -> dict[str, Any]:
    """One indicator of one run: its line(s) with alerts, and the layer x step heatmap when per layer."""
    _check_buckets(buckets, settings.max_buckets)
    run = store.get_run(run_id)
    latest = store.list_series(run.id)
    tmap = TokenMap.of(store, run, latest) if x != "step" else TokenMap((), None)
    per_layer = any(s.name == name and s.layer is not None for s in latest)
    lines = []
    if per_layer:
        lines.append(("mean over layers", aggregate_series(store, run, name, "mean", buckets, latest, tmap), "#1f77b4"))
        lines.append(("max over layers", aggregate_series(store, run, name, "max", buckets, latest, tmap), "#ff7f0e"))
    else:
        lines.append((name, aggregate_series(store, run, name, "mean", buckets, latest, tmap), "#1f77b4"))
        if name == "loss" and any(s.name == "val_loss" and s.layer is None for s in latest):
            lines.append(
                ("val_loss", aggregate_series(store, run, "val_loss", "mean", buckets, latest, tmap), "#2ca02c")
            )
    alerts = [a for a in store.list_alerts(run_id=run.id, limit=settings.max_page_size) if a.name == name]
    try:
        line_fig = run_line_figure(run, name, lines, alerts, x, gl)
        heat = None
        if per_layer:
            m = layer_matrix(store, run, name, min(buckets, 300))
            heat = heatmap_figure(run, m, x_values(run, m.bucket_starts, tmap.at(m.bucket_starts), x), x)
    except XAxisError as exc:
        raise InvalidInputError(str(exc)) from exc
    return jsonable({"line": line_fig, "heatmap": heat, "per_layer": per_layer})  # type: ignore[no-any-return]


@router.get("/alerts")
def alerts_timeline(
    store: StoreDep,
    settings: SettingsDep,
    run_id: int | None = None,
    rule: Annotated[str | None, Query(max_length=64)] = None,
    project: Annotated[str | None, Query(max_length=200)] = None,
    limit: Annotated[int, Query(ge=1)] = 1000,
) -> dict[str, Any]:
    """Alert events as a timeline (time x run, symbol by rule) with each point's run page link data."""
    found = store.list_alerts(run_id, project, None, rule, min(limit, settings.max_page_size), 0)
    symbols = {"z_spike": "circle", "nan_loss": "x", "nonfinite_value": "triangle-up", "max_vio_collapse": "square"}
    sev = {"critical": "#d62728", "warning": "#ff9f1c"}
    by_rule: dict[str, list[Any]] = {}
    for a in found:
        by_rule.setdefault(a.rule, []).append(a)
    data = []
    for r, items in sorted(by_rule.items()):
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "x": [a.created_at.isoformat() for a in items],
                "y": [esc(f"{a.project}/{a.run}") for a in items],
                "name": esc(f"{r} ({items[0].source})" if items[0].source != "service" else r),
                "text": [
                    esc(f"{a.name}{'' if a.layer is None else f' layer {a.layer}'} step {a.step}: {a.message}")
                    for a in items
                ],
                "customdata": [[a.run_id, a.step, a.name] for a in items],
                "hovertemplate": "%{y}<br>%{text}<extra>%{fullData.name}</extra>",
                "marker": {
                    "symbol": symbols.get(r, "diamond"),
                    "size": 10,
                    "color": [sev.get(a.severity, "#555") for a in items],
                },
            }
        )
    layout = {
        "title": {"text": "Alert timeline (click a point to open it on its run page)", "font": {"size": 14}},
        "xaxis": {"title": {"text": "raised at"}, "type": "date"},
        "yaxis": {"title": {"text": ""}, "type": "category", "automargin": True},
        "height": 360,
        "margin": {"l": 60, "r": 20, "t": 40, "b": 45},
        "hovermode": "closest",
    }
    if not found:  # say so, instead of a date axis around the year 2000
        layout.update(height=160, xaxis={"visible": False}, yaxis={"visible": False})
        why = "no alerts" + (
            " match these filters" if run_id or rule or project else " yet: none of the runs has tripped a rule"
        )
        layout["annotations"] = [{"text": esc(why), "xref": "paper", "yref": "paper", "x": 0.5, "y": 0.5,
                                  "showarrow": False, "font": {"size": 13, "color": "#555"}}]  # fmt: skip
    return jsonable({"figure": {"data": data, "layout": layout}, "count": len(found)})  # type: ignore[no-any-return]
