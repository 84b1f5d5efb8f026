"""JSON the pages draw: ready-made Plotly figures, under ``/ui/data`` (read auth, like /api/v1 reads).

Every number comes through the read layer only (:class:`monitor.read.reader.Reader`, which also
checks read auth, and :mod:`monitor.read.lines`): the functions the API routes answer with, so a page
never shows a number the API would not give. Each figure's ``live`` says where the page's live
stream (GET /api/v1/live) starts.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Query

from hyperwatch.monitor.analysis import AnalysisError, fit_group, jsonable, stability_verdict
from hyperwatch.monitor.api.deps import QueryReaderDep, ReaderDep
from hyperwatch.monitor.api.params import Limit, buckets_query
from hyperwatch.monitor.api.schemas import MetricName
from hyperwatch.monitor.core.errors import InvalidInputError
from hyperwatch.monitor.read.lines import (
    STABILITY_INDICATORS,
    Agg,
    TokenMap,
    group_records,
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
from hyperwatch.web.heads import heads_figure
from hyperwatch.web.scale import colours, esc, labels, order_by_size, size_axis
from hyperwatch.web.sweeps import sweeps_payload

log = logging.getLogger(__name__)
router = APIRouter(prefix="/ui/data", tags=["web"], include_in_schema=False)

COMPARE_INDICATORS = (*STABILITY_INDICATORS, "loss")
"""What the scale-comparison page shows, in order."""

Buckets = Annotated[int, buckets_query(10, "buckets of the downsampling (about the plot's width)")]
GL = Annotated[bool, Query(description="draw lines with WebGL (scattergl)")]


def live_cursor(last_step: int | None, buckets: int) -> dict[str, int]:
    """Where the page's live stream starts: the run's last step read *before* the figure (points
    that arrive meanwhile come again, and the page drops steps it has), and the bucket width in
    steps that keeps the live part as dense as the first read."""
    last = -1 if last_step is None else last_step
    return {"step": last, "every": max(1, -(-(last + 1) // buckets))}


@router.get("/groups/{group_id}/thresholds")
def group_thresholds(group_id: int, read: ReaderDep) -> dict[str, Any]:
    """The group page's thresholds table: what GET /api/v1/groups/{id}/thresholds lists (each threshold
    in force, its source and how it came about), and whether the group learns."""
    learning, rows = read.group_thresholds(group_id)
    return {"learning": learning, "rows": [asdict(t) for t in rows]}


@router.get("/groups/{group_id}/compare")
def group_compare(
    group_id: int,
    name: Annotated[MetricName, Query()],
    read: QueryReaderDep,
    x: XAxis = "step",
    agg: Agg = "mean",
    buckets: Buckets = 400,
    gl: GL = False,
) -> dict[str, Any]:
    """One indicator for every run of a group, and its peak/final vs size with the verdict."""
    read.buckets(buckets)
    group, runs = read.group(group_id)
    runs = order_by_size(runs)
    colour, label = colours(runs), labels(runs)
    rank = {run.id: i for i, run in enumerate(runs)}
    lines: list[RunLine] = []
    records: list[dict[str, Any]] = []
    matching = match_runs(runs)
    axis = size_axis(runs)  # parameters, else depth, labelled so; no verdict across lengths at one size
    for run in runs:
        latest = read.index(run)
        if not any(s.name == name for s in latest):
            continue
        tmap = read.token_map(run, latest) if x != "step" else TokenMap((), None)
        line = read.line(run, name, agg, buckets, latest, tmap)
        if not line.values:
            continue
        lines.append(RunLine(run, line, label[run.id], colour[run.id], rank[run.id]))
        size = axis.of(run)
        if size is not None and run.id in matching.cutoff and matching.reason is None and axis.blocker is None:
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
    why = matching.reason or axis.blocker or ("n/a: no run has a model size" if not records else None)
    return jsonable(  # type: ignore[no-any-return]
        {
            "group": group.name,
            "figure": figure,
            "stability": stability_figure(name, verdict, axis.label, why, matching.fraction),
            "runs": len(lines),
            "live": {str(run.id): live_cursor(run.last_step, buckets) for run in runs},
        }
    )


@router.get("/groups/{group_id}/sweeps")
def group_sweeps(
    group_id: int,
    read: QueryReaderDep,
    baseline: Annotated[str | None, Query(max_length=64)] = None,
) -> dict[str, Any]:
    """Every figure of the sweeps page (LR sweeps, transfer laws, scaling laws and leverage)."""
    _, runs = read.group(group_id)
    records, skipped = group_records(read.store, runs)
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
    read: QueryReaderDep,
    x: Annotated[XAxis, Query()] = "step",
    buckets: Buckets = 600,
    gl: GL = False,
) -> dict[str, Any]:
    """One indicator of one run: its line(s) with alerts, and the layer x step heatmap when per layer."""
    read.buckets(buckets)
    run = read.run(run_id)
    latest = read.index(run)
    tmap = read.token_map(run, latest) if x != "step" else TokenMap((), None)
    per_layer = any(s.name == name and s.layer is not None for s in latest)
    lines = []
    if per_layer:
        lines.append(("mean over layers", read.line(run, name, "mean", buckets, latest, tmap), "#1f77b4"))
        lines.append(("max over layers", read.line(run, name, "max", buckets, latest, tmap), "#ff7f0e"))
    else:
        lines.append((name, read.line(run, name, "mean", buckets, latest, tmap), "#1f77b4"))
        if name == "loss" and any(s.name == "val_loss" and s.layer is None for s in latest):
            lines.append(("val_loss", read.line(run, "val_loss", "mean", buckets, latest, tmap), "#2ca02c"))
    every_alert = read.alerts(run_id=run.id, limit=read.settings.max_page_size)
    alerts = [a for a in every_alert if a.name == name]
    try:
        line_fig = run_line_figure(run, name, lines, alerts, x, gl)
        heat = None
        if per_layer:
            # the lines' buckets: one matrix (read once, monitor/read/matrix_cache.py) draws both lines and the
            # heatmap, whose columns then line up with the lines' points (issue 35: a 64-layer page read 21 matrices)
            m = read.layers(run, name, buckets)
            heat = heatmap_figure(run, m, x_values(run, m.bucket_starts, tmap.at(m.bucket_starts), x), x)
    except XAxisError as exc:
        raise InvalidInputError(str(exc)) from exc
    live = live_cursor(run.last_step, buckets)
    live["alert_after"] = max((a.id for a in every_alert), default=0)
    return jsonable({"line": line_fig, "heatmap": heat, "per_layer": per_layer, "live": live})  # type: ignore[no-any-return]


@router.get("/runs/{run_id}/heads")
def run_heads(run_id: int, read: QueryReaderDep) -> dict[str, Any]:
    """The heads x layers heatmap of ``attention_lse_max`` at the run's newest logged step, titled with
    the ceiling its group's alert uses (the same matrix as GET /api/v1/runs/{id}/heads)."""
    run = read.run(run_id)
    return jsonable(heads_figure(read.heads(run), read.thresholds(run)["attention_lse_max_limit"]))  # type: ignore[no-any-return]


@router.get("/alerts")
def alerts_timeline(
    read: QueryReaderDep,
    run_id: int | None = None,
    rule: Annotated[str | None, Query(max_length=64)] = None,
    project: Annotated[str | None, Query(max_length=200)] = None,
    limit: Limit = 1000,
) -> dict[str, Any]:
    """Alert events as a timeline (time x run, symbol by rule) with each point's run page link data, and
    ``peaks``: the largest value each incident's series reached over its run (not only at its events)."""
    found = read.alerts(run_id, project, None, rule, limit, 0)
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
    names = sorted({(a.project, a.run) for a in found})
    layout = {
        "title": {"text": "Alert timeline (click a point to open it on its run page)", "font": {"size": 14}},
        # automargin: tick labels tilted on a crowded date axis ran past a fixed bottom margin
        "xaxis": {"title": {"text": "raised at"}, "type": "date", "automargin": True},
        # a long project/run name is shortened in its middle on the axis (the hover gives it whole):
        # whole, automargin gave two thirds of a 1280 px page to the names and a sliver to the plot
        "yaxis": {
            "title": {"text": ""},
            "type": "category",
            "automargin": True,
            "tickvals": [esc(f"{p}/{r}") for p, r in names],
            "ticktext": [esc(t) for t in axis_names(names)],
        },
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
    peaks = [
        {"run_id": rid, "name": name, "peak": peak}
        for (rid, name), peak in read.incident_peaks(run_id, project, rule, limit).items()
    ]
    return jsonable({"figure": {"data": data, "layout": layout}, "count": len(found), "peaks": peaks})  # type: ignore[no-any-return]


def axis_names(names: list[tuple[str, str]]) -> list[str]:
    """The timeline's run labels: the run's name alone when every run is of one project, shortened
    (:func:`shorten`) unless that makes two labels alike."""
    full = [r if len({p for p, _ in names}) == 1 else f"{p}/{r}" for p, r in names]
    short = [shorten(t) for t in full]
    return [s if short.count(s) == 1 else f for s, f in zip(short, full, strict=True)]


def shorten(text: str, width: int = 48) -> str:
    """``text`` of at most ``width`` characters: its start and its end around an ellipsis (a run's
    name differs at its start, its size, and at its end, its seed or variant)."""
    if len(text) <= width:
        return text
    head = (width - 1) // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head) :]
