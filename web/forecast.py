"""The forecast on the pages: the scale page's panel and the run page's "against the forecast" figure.

Both read :mod:`monitor.read.forecasts` (the API's and ``hyperwatch forecast``'s read layer), so the
sentence under the figure is the API's ``sentence`` word for word. The panel's figure: each size's
peak (left-out sizes as red markers, their reason in the sentence), the fitted power law with its
band, the threshold line, the target with its predicted value and band, the crossing, and a run
in training at its size with its peak so far. The run page's: the run's running peak against the
band over its fraction of training.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from fastapi import APIRouter, Query

from hyperwatch.monitor.analysis import jsonable
from hyperwatch.monitor.analysis.forecast import DEFAULT_LEVEL, Axis, fmt_size, fmt_value, label
from hyperwatch.monitor.api.deps import ReadAuth, StoreDep
from hyperwatch.monitor.api.params import float_query
from hyperwatch.monitor.api.schemas import MetricName
from hyperwatch.monitor.read.forecasts import collect, default_target, forecast_group, run_forecast
from hyperwatch.monitor.read.lines import STABILITY_INDICATORS, Agg
from hyperwatch.web.figures import base_layout, nonfinite_trace, note
from hyperwatch.web.layout import legend_below
from hyperwatch.web.scale import NONFINITE_COLOUR, esc

router = APIRouter(prefix="/ui/data", tags=["web"], dependencies=[ReadAuth], include_in_schema=False)

BAND = "rgba(31,119,180,0.18)"
FIT = "#1f77b4"
TARGET = "#9467bd"
WATCHED = "#ff7f0e"
X_TITLE = {"params": "model size (parameters)", "flops": "training FLOPs"}


def _v(v: Any) -> float | None:
    """A JSON number of the read layer as a float (None for null; "NaN" and friends as floats)."""
    if v is None:
        return None
    return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[v] if isinstance(v, str) else float(v)


def _vline(x: float, colour: str, dash: str) -> dict[str, Any]:
    line = {"color": colour, "dash": dash}
    return {"type": "line", "x0": x, "x1": x, "yref": "paper", "y0": 0, "y1": 1, "line": line}


def _trace(mode: str, x: Any, y: Any, **extra: Any) -> dict[str, Any]:
    return {"type": "scatter", "mode": mode, "x": x, "y": y, **extra}


def _band(x: Any, lower: Any, upper: Any, name: str, line: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The band as two edge traces, the lower one filled up to the upper one."""
    edge = {"width": 0}
    return [
        _trace("lines", x, upper, line=edge, hoverinfo="skip", showlegend=False),
        _trace("lines", x, lower, line=edge, fill="tonexty", fillcolor=BAND, name=name, hoverinfo="skip"),
    ]


def forecast_figure(peak: dict[str, Any], watched: list[dict[str, Any]], axis: Axis) -> dict[str, Any]:
    """The panel's figure from one indicator's ``peak`` forecast (the read layer's JSON)."""
    name = peak["name"]
    layout = base_layout(f"Forecast: peak {esc(label(name))} vs {X_TITLE[axis]}", X_TITLE[axis], esc(name), 380)
    layout["xaxis"]["type"] = layout["yaxis"]["type"] = "log"
    data: list[dict[str, Any]] = []
    curve = peak["curve"]
    if curve is not None:
        xs = curve["size"]
        data += _band(xs, curve["lower"], curve["upper"], f"{peak['level']:.0%} band")
        fit_hover = "fit at %{x:.3s}: %{y:.4g}<extra></extra>"
        data.append(
            _trace(
                "lines",
                xs,
                curve["predicted"],
                name="power-law fit",
                hovertemplate=fit_hover,
                line={"color": FIT, "dash": "dash"},
            )
        )
    used = [p for p in peak["points"] if p["used"]]
    data.append(
        _trace(
            "markers",
            [p["size"] for p in used],
            [p["value"] for p in used],
            name="runs (peak)",
            text=[esc(", ".join(p["runs"])) for p in used],
            marker={"color": FIT, "size": 9},
            hovertemplate="%{text}<br>%{x:.3s}: %{y:.4g}<extra></extra>",
        )
    )
    odd = [p for p in peak["points"] if not p["used"] and not math.isfinite(_v(p["value"]) or 0.0)]
    nf = nonfinite_trace([p["size"] for p in odd], [_v(p["value"]) or 0.0 for p in odd], "left out", "nf", 0.95, FIT)
    if nf is not None:
        data.append(nf)
    shapes: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    limit = peak["threshold"]
    if limit is not None:
        red = {"color": NONFINITE_COLOUR, "dash": "dot"}
        shapes.append({"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": limit, "y1": limit, "line": red})
        annotations.append(
            {
                "xref": "paper",
                "x": 0.99,
                "xanchor": "right",
                "y": math.log10(limit),
                "yanchor": "bottom",
                "showarrow": False,
                "text": f"threshold {fmt_value(limit)}",
                "font": {"size": 11, "color": NONFINITE_COLOUR},
            }
        )
    cross = peak["crossing"] or {}
    if cross.get("size") is not None:
        shapes.append(_vline(cross["size"], NONFINITE_COLOUR, "dot"))
    target, p = peak["target"], peak["predicted"]
    if target is not None:
        shapes.append(_vline(target, TARGET, "dashdot"))
    if target is not None and p is not None and not peak.get("reliable", True):
        # a band of many decades predicts nothing: draw the band at the target, no point value
        lo, hi = peak["lower"], peak["upper"]
        hover = f"no reliable prediction at {fmt_size(target, axis)} (band {fmt_value(lo)} to {fmt_value(hi)})"
        data.append(
            _trace(
                "lines",
                [target, target],
                [lo, hi],
                name="no reliable prediction",
                line={"color": TARGET, "width": 3, "dash": "dot"},
                hovertemplate=hover + "<extra></extra>",
            )
        )
    elif target is not None and p is not None:
        lo, hi = peak["lower"], peak["upper"]
        hover = f"{fmt_value(p)} at {fmt_size(target, axis)} (band {fmt_value(lo)}-{fmt_value(hi)})<extra></extra>"
        bar = {"type": "data", "symmetric": False, "array": [hi - p], "arrayminus": [p - lo], "color": TARGET}
        data.append(
            _trace(
                "markers",
                [target],
                [p],
                name="forecast",
                error_y=bar,
                hovertemplate=hover,
                marker={"color": TARGET, "size": 13, "symbol": "star"},
            )
        )
    for w in watched:
        item = w["indicators"].get(name)
        now = None if item is None else item["now"]
        if now is None or not math.isfinite(_v(now["peak"]) or math.nan):
            continue
        who = esc(f"{w['run']} (training, {now['fraction']:.0%})")
        data.append(
            _trace(
                "markers",
                [w["size"]],
                [now["peak"]],
                name=who,
                marker={"color": WATCHED, "size": 11, "symbol": "diamond"},
                hovertemplate=esc(item["sentence"]) + "<extra></extra>",
            )
        )
    layout["shapes"], layout["annotations"] = shapes, annotations
    # under the plot: inside it, the legend (a watched run's long name) covered the points
    legend_below(layout, data)
    if curve is None:
        layout["annotations"] = [*annotations, note(peak["sentence"])]
    return {"data": data, "layout": layout, "meta": {"name": name}, "config": {"displayModeBar": False}}


def watch_figure(name: str, ind: dict[str, Any], level: float) -> dict[str, Any]:
    """The run page's figure: the run's running peak and value against the band over training."""
    band, run = ind["band"], ind["run"]
    value, peak = ([v if isinstance(v, float | int) else None for v in run[k]] for k in ("value", "peak"))
    title = f"{esc(label(name))} against the forecast of its group's smaller runs"
    layout = base_layout(title, "fraction of training", esc(name), 320)
    layout["xaxis"].update(range=[0, 1.0], tickformat=".0%")
    layout["yaxis"]["type"] = "log"  # a band many times wide at few sizes: log keeps the run's line readable
    f, x = band["fraction"], run["fraction"]
    data = [
        *_band(f, band["lower"], band["upper"], f"{level:.0%} band of the peak"),
        _trace(
            "lines",
            f,
            band["predicted"],
            name="forecast peak",
            line={"color": FIT, "dash": "dash"},
            hovertemplate="%{x:.0%}: forecast %{y:.4g}<extra></extra>",
        ),
        _trace(
            "lines",
            x,
            value,
            name="value",
            line={"color": "#9ca3af", "width": 1},
            hovertemplate="%{x:.1%}: %{y:.4g}<extra></extra>",
        ),
        _trace(
            "lines",
            x,
            peak,
            name="peak so far",
            line={"color": WATCHED, "width": 2},
            hovertemplate="%{x:.1%}: peak %{y:.4g}<extra></extra>",
        ),
    ]
    return {"data": data, "layout": layout, "meta": {"name": name}, "config": {"displayModeBar": False}}


@router.get("/groups/{group_id}/forecast")
def group_forecast_panel(
    group_id: int,
    store: StoreDep,
    name: Annotated[MetricName, Query()] = "attention_z",
    axis: Axis = "params",
    target: Annotated[float | None, float_query("target", 0, None, lo_open=True)] = None,
    agg: Agg = "mean",
) -> dict[str, Any]:
    """The panel: one indicator's forecast at ``target`` (default: 10x the largest size), its figure
    and sentence, and the group's runs in training against their band."""
    inputs = collect(store, group_id, [name], axis, agg)
    target = target or default_target(inputs)
    body = forecast_group(inputs, target, DEFAULT_LEVEL).to_json()
    ind = body["indicators"].get(name)
    if ind is None:
        why = f"{name}: no run of this group can be compared yet" + (
            f" ({body['matched']['reason']})" if body["matched"]["reason"] else ""
        )
        figure = {
            "data": [],
            "layout": {**base_layout("Forecast", X_TITLE[axis], esc(name), 200), "annotations": [note(why)]},
            "config": {"displayModeBar": False},
        }
        return jsonable({"sentence": why + ".", "figure": figure, "target": target, "axis": axis, "watched": []})  # type: ignore[no-any-return]
    watched = [
        f"{w['run']} (training): {w['indicators'][name]['sentence']}"
        for w in body["watched"]
        if name in w["indicators"]
    ]
    return jsonable(  # type: ignore[no-any-return]
        {
            "sentence": ind["peak"]["sentence"],
            "final": ind["final"]["sentence"],
            "figure": forecast_figure(ind["peak"], body["watched"], axis),
            "target": target,
            "axis": axis,
            "watched": watched,
            "held_out": body["held_out"],
        }
    )


@router.get("/runs/{run_id}/forecast")
def run_forecast_panel(run_id: int, store: StoreDep, agg: Agg = "mean") -> dict[str, Any]:
    """The run page's section: nothing when the run is not watched, else a figure per indicator."""
    body = run_forecast(store, run_id, STABILITY_INDICATORS, agg)
    if not body["watched"]:
        return {"watched": False, "reason": body["reason"], "indicators": []}
    items = [
        {"name": n, "sentence": ind["sentence"], "figure": watch_figure(n, ind, body["level"])}
        for n, ind in body["indicators"].items()
    ]
    return jsonable({"watched": True, "group_id": body["group_id"], "indicators": items})  # type: ignore[no-any-return]
