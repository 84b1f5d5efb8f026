"""Figure builders: plain Plotly figure JSON (``{"data": [...], "layout": {...}}``) from stored series.

The browser only calls ``Plotly.newPlot`` on these; the controls (log-y, EMA smoothing) act on
the drawn traces. Conventions shared by every figure:

- Finite values are drawn as lines; a non-finite value (NaN, +Inf, -Inf) is a gap in the line
  (``null``) and a red marker on a hidden overlay axis (``yaxis2``, range [0, 1]) in a lane near
  the top: ``x`` for NaN, a triangle up for +Inf, down for -Inf, hover text naming the value.
  Nothing is clamped or dropped.
- Line traces carry ``meta.smooth = true`` (the EMA toggle smooths only those).
- Every user string is escaped with :func:`web.scale.esc`.
"""

from __future__ import annotations

import bisect
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hyperwatch.monitor.read.lines import FINAL_ONLY, AggSeries, XAxis, XAxisError, x_values
from hyperwatch.monitor.store.entities import Alert, LayerMatrix, Run
from hyperwatch.web.layout import fit_y_margin, reserve_right
from hyperwatch.web.scale import NONFINITE_COLOUR, esc, human_count

__all__ = ["XAxis", "XAxisError", "x_values"]  # re-exported for the pages
X_TITLES = {"step": "step", "tokens": "training tokens", "flops": "training FLOPs", "fraction": "fraction of training"}
NONFINITE_SYMBOL = {"NaN": "x", "Infinity": "triangle-up", "-Infinity": "triangle-down"}
TITLES = {
    "attention_z": "Attention Z (mean LSE² of attention logits)",
    "router_z": "Router Z (mean LSE² of router logits)",
    "attention_rms": "Attention branch output RMS",
    "mlp_rms": "MLP / MoE branch output RMS",
    "attention_outlier_ratio": "Attention output outlier ratio (> 5σ)",
    "mlp_outlier_ratio": "MLP / MoE output outlier ratio (> 5σ)",
    "max_vio": "MaxVio (MoE load imbalance)",
    "loss": "Training loss",
    "val_loss": "Validation loss",
    "lr": "Learning rate",
    "grad_norm": "Gradient norm (before clipping)",
}


def wire(v: float) -> str:
    """The wire spelling of a non-finite value ("NaN", "Infinity", "-Infinity")."""
    return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")


def _finite_or_none(values: Sequence[float]) -> list[float | None]:
    return [v if math.isfinite(v) else None for v in values]


def nonfinite_trace(
    xs: Sequence[float | None], values: Sequence[float], name: str, group: str, lane: float, edge: str
) -> dict[str, Any] | None:
    """Red markers for the non-finite values of one line, or None when every value is finite."""
    at = [(x, wire(v)) for x, v in zip(xs, values, strict=True) if not math.isfinite(v) and x is not None]
    if not at:
        return None
    return {
        "type": "scatter",
        "mode": "markers",
        "x": [x for x, _ in at],
        "y": [lane] * len(at),
        "yaxis": "y2",
        "name": f"{name} · non-finite",
        "legendgroup": group,
        "showlegend": False,
        "text": [w for _, w in at],
        "hovertemplate": "%{fullData.name}<br>%{text} at %{x}<extra></extra>",
        "marker": {
            "color": NONFINITE_COLOUR,
            "size": 10,
            "symbol": [NONFINITE_SYMBOL[w] for _, w in at],
            "line": {"color": edge, "width": 1.5},
        },
        "meta": {"nonfinite": True},
    }


def line_trace(
    xs: Sequence[float | None], values: Sequence[float], name: str, group: str, colour: str, gl: bool, **extra: Any
) -> dict[str, Any]:
    trace: dict[str, Any] = {
        "type": "scattergl" if gl else "scatter",
        "mode": "lines",
        "x": list(xs),
        "y": _finite_or_none(values),
        "name": name,
        "legendgroup": group,
        "line": {"color": colour, "width": 1.5},
        "hovertemplate": "%{fullData.name}<br>%{x}: %{y:.5g}<extra></extra>",
        "meta": {"smooth": True},
    }
    trace.update(extra)
    return trace


def _bucket_words(width: int) -> str:
    """A heatmap cell's span: one logged step needs no "max" (``width`` is in steps)."""
    return "one cell per step" if width == 1 else f"max per bucket of {width} steps"


RATIOS = ("attention_outlier_ratio", "mlp_outlier_ratio")
"""Fractions in 0..1: their axes start at 0 (never -1..1 around an all-zero line) and stop at 1 at most."""


def ratio_axis(layout: dict[str, Any], name: str, axis: str = "yaxis") -> dict[str, Any]:
    """Keep a ratio's value axis inside 0..1 and autoranged there, so tiny fractions stay readable.

    ``clipmin``/``clipmax`` bound the autorange; ``minallowed``/``maxallowed`` would not do: plotly.js
    then draws the whole 0..1 range and a 1e-5 outlier ratio lies flat on the axis (seen in Chromium).
    """
    if name in RATIOS:
        layout[axis].update({"rangemode": "tozero", "autorangeoptions": {"clipmin": 0, "clipmax": 1}})
    return layout


def flat_range(values: Sequence[float | None]) -> list[float] | None:
    """A y range around a line that never changes (a constant LR), else None (autorange).

    Plotly autoranges a constant y to value +- 1, so 3e-3 lay flat at "0" on a -1..1 axis; the
    range here is value +- 10% (+-1 for 0), so the axis reads the value."""
    finite = {v for v in values if v is not None and math.isfinite(v)}
    if len(finite) != 1:
        return None
    (v,) = finite
    pad = abs(v) * 0.1 if v != 0 else 1.0
    return [v - pad, v + pad]


def fix_flat_axis(layout: dict[str, Any], data: Sequence[dict[str, Any]], axis: str = "yaxis") -> None:
    """Give ``axis`` the range of :func:`flat_range` when every line drawn on it is one constant."""
    ys = [y for t in data if not t.get("yaxis") and t.get("mode") == "lines" for y in t.get("y", [])]
    rng = flat_range(ys)
    if rng is not None:
        clip = layout[axis].get("autorangeoptions", {})  # a ratio's axis stays inside 0..1
        if "clipmin" in clip and "clipmax" in clip:
            rng = [max(rng[0], clip["clipmin"]), min(rng[1], clip["clipmax"])]
        layout[axis]["range"] = rng
        layout[axis]["autorange"] = False


Y_TICKS = {"automargin": True, "ticklabelstandoff": 6, "ticklabeloverflow": "allow"}
X_TICKS = {"automargin": True, "ticklabelstandoff": 3, "ticklabeloverflow": "allow"}
"""Tick labels stand off their axis: at the corner the two axes share, y's first label ("0", "2")
sat on x's first ("0", "0%", "100M"). "allow": automargin keeps every label inside the figure, and
Plotly's default ("hide past div") measured every label of the axis again after placing each one."""


def base_layout(title: str, x_title: str, y_title: str, height: int = 340) -> dict[str, Any]:
    return {
        "title": {"text": title, "font": {"size": 14}, "x": 0.01, "xanchor": "left"},
        # automargin: long tick labels push the margin instead of running into the axis title or
        # off the figure; the margins below (fit_y_margin: from the label length) are sized so that
        # plotly needs no second layout pass for it in the usual case (web/layout.py)
        # exponentformat "B": SI prefixes but 1e9 is "B", as human_count and the size labels write it
        # (plotly's "SI" wrote "100G" on an axis beside "100B" on a colour bar)
        "xaxis": {"title": {"text": x_title}, "exponentformat": "B", **X_TICKS},
        "yaxis": {"title": {"text": y_title}, "type": "linear", "exponentformat": "B", **Y_TICKS},
        "yaxis2": {"overlaying": "y", "range": [0, 1], "visible": False, "fixedrange": True},
        "height": height,
        "margin": {"l": 64, "r": 20, "t": 40, "b": 45},
        "legend": {"font": {"size": 11}},
        "hovermode": "closest",
        "template": None,
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#fafafa",
    }


@dataclass(frozen=True)
class RunLine:
    """One run's line in a comparison: the run, its aggregated series, its legend label and colour;
    ``rank`` is the run's place among all the group's runs by size (the page legend's order, which
    must not depend on which figure's data arrives first)."""

    run: Run
    line: AggSeries
    label: str
    colour: str
    rank: int = 0


def compare_figure(name: str, lines: Sequence[RunLine], x: XAxis, agg: str, gl: bool) -> dict[str, Any]:
    """One indicator, one line per run (legend "d=12 · 570M"); runs that cannot be drawn go to ``meta.missing``.

    ``meta.missing`` is plain text for the page's ``textContent`` (not escaped; never given to Plotly).
    """
    data: list[dict[str, Any]] = []
    missing: list[str] = []
    missing_runs: list[str] = []
    lanes: list[dict[str, Any]] = []
    for i, rl in enumerate(lines):
        try:
            xs = x_values(rl.run, rl.line.steps, rl.line.tokens, x)
        except XAxisError as exc:
            missing.append(str(exc))
            missing_runs.append(rl.run.name)
            continue
        label, group = esc(rl.label), f"run{rl.run.id}"
        # meta.label is the raw label for the page's own legend (textContent); plotly gets the escaped one
        meta = {"smooth": True, "run_id": rl.run.id, "label": rl.label, "colour": rl.colour, "rank": rl.rank}
        data.append(line_trace(xs, rl.line.values, label, group, rl.colour, gl, meta=meta))
        nf = nonfinite_trace(xs, rl.line.values, label, group, 0.97 - 0.04 * (i % 12), rl.colour)
        if nf is not None:
            nf["meta"]["run_id"] = rl.run.id
            lanes.append(nf)
    data.extend(lanes)  # markers above the lines
    per_layer = any(rl.line.per_layer for rl in lines)
    suffix = f" · {agg} over layers" if per_layer else ""
    layout = ratio_axis(base_layout(esc(TITLES.get(name, name)) + suffix, X_TITLES[x], esc(name)), name)
    fix_flat_axis(layout, data)
    fit_y_margin(layout, data)
    # per axis: switching x draws fresh ticks (the same revision kept the old axis's tick labels)
    layout["uirevision"] = f"{name}:{x}"
    layout["showlegend"] = False  # one legend for the whole page (runs share colours across figures)
    about: dict[str, Any] = {
        "name": name,
        "missing": missing_note(missing, missing_runs, x),
        # for one note per page: the runs not drawn and what fills the gap (plain text)
        "missing_runs": missing_runs,
        "missing_fix": (f"attach with {FIX[x]}" if FIX.get(x) else missing[0]) if missing else "",
    }
    if not lines and name in ROUTER_ONLY:
        about["empty"] = ROUTER_ONLY[name]
        layout["annotations"] = [note(ROUTER_ONLY[name])]
    return {"data": data, "layout": layout, "meta": about}


ROUTER_ONLY = {
    "router_z": "no run here has a router: router Z is measured on MoE routers (dense models have none)",
    "max_vio": "no run here has experts: MaxVio (MoE load imbalance) is measured on MoE layers only",
}
"""Indicators only MoE models have; their panels say so on a dense group instead of staying empty."""

FIX = {
    "step": None,
    "tokens": "hooks.attach(..., tokens=TOKEN_BUDGET) or total_steps=N with mon.step(..., tokens=seen)",
    "flops": "hooks.attach(..., tokens=TOKEN_BUDGET) (FLOPs are 6N per token unless flops_per_token= is given)",
    "fraction": "hooks.attach(..., total_steps=N) or tokens=TOKEN_BUDGET",
}
"""The attach argument that lets a hooks run be drawn on each x axis."""


def missing_note(missing: Sequence[str], names: Sequence[str], x: XAxis) -> list[str]:
    """One short note for every run that cannot be drawn on ``x`` (not one paragraph per run):
    how many, which, and the exact attach argument that fills the gap (plain text, never escaped)."""
    if not missing:
        return []
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    runs = "1 run" if len(names) == 1 else f"{len(names)} runs"
    fix = FIX.get(x)
    return [f"{runs} not drawn on x={x} ({shown}): " + (f"attach with {fix}" if fix else missing[0])]


def stability_figure(
    name: str,
    verdict: dict[str, Any] | None,
    size_of_scale: str,
    why: str | None = None,
    fraction: float | None = 1.0,
) -> dict[str, Any]:
    """Peak and final value of one indicator vs model size (log axis), titled with the verdict.

    ``why`` replaces the verdict when there is none (e.g. "n/a until runs finish"); ``fraction``
    below 1 says the runs are compared at that matched fraction of training. A loss shows its
    final value only (a larger model starts higher: its peak says nothing)."""
    layout = ratio_axis(base_layout(esc(name), esc(size_of_scale), "value", height=360), name)
    layout["xaxis"]["type"] = "log"
    layout["showlegend"] = True
    # outside the plot, right of it: inside, the peak/final legend covered the smallest model's points
    layout["legend"] = {"x": 1.02, "y": 1.0, "xanchor": "left", "yanchor": "top", "font": {"size": 11}}
    # the title on two lines (name, then the verdict): one line ran past a third-of-the-page panel;
    # the verdict rule and any reason are the page's caption under the figure (meta), in HTML that
    # wraps to the panel: an annotation never wraps, and was clipped at the right and the bottom
    layout["margin"] = {**layout["margin"], "r": 70, "t": 58, "b": 50}
    if verdict is None:
        short = (why or "no data").split(":")[0]
        layout["title"]["text"] = f"{esc(name)}<br><span style='color:#7f7f7f'>{esc(short)}</span>"
        layout["xaxis"]["visible"] = layout["yaxis"]["visible"] = False
        layout["showlegend"] = False
        layout["annotations"] = [note(why or "no data", 36)]
        layout["annotations"][0]["font"]["size"] = 12
        meta: dict[str, Any] = {"verdict": None, "reason": why, "rule": verdict_rule(name)}
        return {"data": [], "layout": layout, "meta": meta, "config": {"displayModeBar": False}}
    data: list[dict[str, Any]] = []
    keys = (("final", "dash", "#ff7f0e"),) if name in FINAL_ONLY else (
        ("peak", "solid", "#1f77b4"), ("final", "dash", "#ff7f0e"))  # fmt: skip
    for key, dash, colour in keys:
        part = verdict[key]
        scales = [float(s) for s in part["scales"]]
        values = [_decode(v) for v in part["values"]]
        data.append(
            {
                "type": "scatter",
                "mode": "lines+markers",
                "x": scales,
                "y": _finite_or_none(values),
                "name": key,
                "line": {"color": colour, "dash": dash},
                "hovertemplate": f"{key} at %{{x:.3s}}: %{{y:.5g}}<extra></extra>",
            }
        )
        nf = nonfinite_trace(scales, values, key, key, 0.95 if key == "peak" else 0.88, colour)
        if nf is not None:
            data.append(nf)
    state = verdict["verdict"]
    text = {"transferable": "transferable ✓", "breaks": "breaks", "insufficient_scales": "one scale only"}[state]
    if state == "breaks" and verdict.get("breaks_at") is not None:
        text += f" at {human_count(float(verdict['breaks_at']))}"
    colour = {"transferable": "#2ca02c", "breaks": NONFINITE_COLOUR}.get(state, "#7f7f7f")
    at = "" if fraction is None or fraction >= 1.0 else f" (at {fraction:.0%} of training)"
    layout["title"]["text"] = f"{esc(name)}<br><span style='color:{colour}'>{text}</span>{at}"
    fit_y_margin(layout, data)
    meta = {"verdict": state, "breaks_at": verdict.get("breaks_at"), "fraction": fraction, "rule": verdict_rule(name)}
    return {"data": data, "layout": layout, "meta": meta, "config": {"displayModeBar": False}}


def verdict_rule(name: str) -> str:
    """How the verdict of ``name`` is decided (monitor.analysis.stability), in one line for the page."""
    from hyperwatch.monitor.analysis.stability import ABS_FLOOR, DEFAULT_RTOL, GROWTH, LEVEL, NOISE_K

    what = "final value" if name in FINAL_ONLY else "peak and final value"
    rule = (
        f"transferable: the {what} never rises from one size to the next by more than "
        f"{DEFAULT_RTOL:.0%} of the smaller size's value, nor by more than {NOISE_K:g}x the run-to-run "
        "spread where several runs share a size"
    )
    floor = ABS_FLOOR.get(name)
    if floor is not None:
        rule += f" or {floor:g} (a rise under {floor:g} of the elements is noise, even if many times the value)"
    if name in LEVEL:
        rule += f"; a break must reach {LEVEL[name]:g} and grow {GROWTH[name]:g}x over the smaller size"
    return rule + "; breaks at: the first size that does, or is NaN/Inf"


def _decode(v: Any) -> float:
    if isinstance(v, str):
        return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[v]
    return float(v)


def run_line_figure(
    run: Run,
    name: str,
    lines: Sequence[tuple[str, AggSeries, str]],
    alerts: Sequence[Alert],
    x: XAxis,
    gl: bool,
) -> dict[str, Any]:
    """One indicator of one run: ``lines`` = (label, series, colour), alerts as diamonds at their step."""
    data: list[dict[str, Any]] = []
    marks: list[dict[str, Any]] = []
    ref_steps: list[int] = []
    ref_x: list[float | None] = []
    for i, (label, line, colour) in enumerate(lines):
        xs = x_values(run, line.steps, line.tokens, x)
        data.append(line_trace(xs, line.values, esc(label), f"l{i}", colour, gl))
        nf = nonfinite_trace(xs, line.values, esc(label), f"l{i}", 0.97 - 0.05 * i, colour)
        if nf is not None:
            marks.append(nf)
        if not ref_steps:
            ref_steps, ref_x = list(line.steps), xs
    if ref_steps:  # the alert trace is there even empty: live alerts join it, in its strip
        ax = [_interp_x(a.step, ref_steps, ref_x) for a in alerts]
        marks.append(
            {
                "type": "scatter",
                "mode": "markers",
                "x": ax,
                "y": [ALERT_LANE] * len(alerts),
                "yaxis": "y3",
                "name": "alerts",
                "showlegend": bool(alerts),
                "text": [esc(f"{a.rule} ({a.severity}) step {a.step}: {a.message}") for a in alerts],
                "customdata": [a.step for a in alerts],
                "hovertemplate": "%{text}<extra></extra>",
                "marker": {"symbol": "diamond", "size": 11, "color": "#ff9f1c", "line": {"color": "#000", "width": 1}},
                "meta": {"alerts": True},
            }
        )
    data.extend(marks)
    layout = ratio_axis(base_layout(esc(TITLES.get(name, name)), X_TITLES[x], esc(name), height=300), name)
    fix_flat_axis(layout, data)
    room = reserve_right(fit_y_margin(layout, data), data)
    if ref_steps:
        # alerts in a strip of their own above the lines: on the value axis they hid its peak
        layout["yaxis"]["domain"] = [0.0, ALERT_STRIP[0] - 0.02]
        layout["yaxis3"] = {"domain": list(ALERT_STRIP), "range": [0, 1], "visible": False, "fixedrange": True}
    layout["uirevision"] = f"{name}:{x}"
    return {"data": data, "layout": layout, "meta": {"name": name, "room_right": room}}


ALERT_STRIP = (0.9, 1.0)
"""The part of a run chart's height (paper fraction) where alert markers sit, above the lines."""
ALERT_LANE = 0.5
"""The markers' height inside the strip (its axis runs 0..1); common.js adds live alerts there too."""


def _interp_x(step: int, steps: Sequence[int], xs: Sequence[float | None]) -> float | None:
    """x of ``step`` on a line's axis: linear between the line's neighbouring points, clamped to its ends."""
    k = bisect.bisect_left(steps, step)
    if k == 0:
        return xs[0]
    if k == len(steps):
        return xs[-1]
    s0, s1, x0, x1 = steps[k - 1], steps[k], xs[k - 1], xs[k]
    if x0 is None or x1 is None:
        return x1 if x0 is None else x0
    return x0 + (x1 - x0) * (step - s0) / (s1 - s0)


def heatmap_figure(run: Run, m: LayerMatrix, xs: Sequence[float | None], x: XAxis) -> dict[str, Any]:
    """Layer x step heatmap (each cell the layer's max over the bucket); non-finite cells marked red."""
    data = heatmap_traces(m.name, list(xs), m.layers, m.values, "layer %{y}<br>%{x}<br>max %{z:.5g}", "at %{x}")
    layout = base_layout(f"{esc(m.name)} per layer ({_bucket_words(m.bucket_width)})", X_TITLES[x], "layer", 300)
    layout.pop("yaxis2")
    layout["yaxis"].update(title={"text": "layer"}, dtick=1 if len(m.layers) <= 24 else None)
    room = reserve_right(layout, data)
    return {"data": data, "layout": layout, "meta": {"name": m.name, "layers": list(m.layers), "room_right": room}}


def heatmap_traces(
    name: str, xs: list[Any], ys: Sequence[int], rows: Sequence[Sequence[float | None]], hover: str, where: str
) -> list[dict[str, Any]]:
    """A heatmap of ``rows`` (one per ``ys``, cells at ``xs``) with its non-finite cells left blank
    and marked by red crosses on top (a NaN or Inf is a training fact: shown, never coloured away)."""
    z: list[list[float | None]] = []
    nf_x: list[Any] = []
    nf_y: list[int] = []
    nf_text: list[str] = []
    for y, row in zip(ys, rows, strict=True):
        z.append([v if v is not None and math.isfinite(v) else None for v in row])
        for xv, v in zip(xs, row, strict=True):
            if v is not None and not math.isfinite(v):
                nf_x.append(xv)
                nf_y.append(y)
                nf_text.append(wire(v))
    data: list[dict[str, Any]] = [
        {
            "type": "heatmap",
            "x": xs,
            "y": list(ys),
            "z": z,
            "colorscale": "Viridis",
            "colorbar": {"title": {"text": esc(name)}, "thickness": 12, "ticklabeloverflow": "allow"},
            "hovertemplate": hover + "<extra></extra>",
            "name": esc(name),
            **({"zmin": 0.0} if name in RATIOS else {}),
            **flat_colour_range(z),
        }
    ]
    if nf_x:
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "x": nf_x,
                "y": nf_y,
                "text": nf_text,
                "name": "non-finite",
                "hovertemplate": f"layer %{{y}}<br>%{{text}} {where}<extra></extra>",
                "marker": {"color": NONFINITE_COLOUR, "symbol": "x", "size": 9},
                "meta": {"nonfinite": True},
            }
        )
    return data


def flat_colour_range(z: Sequence[Sequence[float | None]]) -> dict[str, float]:
    """zmin/zmax for a heatmap whose finite cells are all one value (else nothing: autoscale).

    Plotly centres a constant matrix on a +-0.4 colour bar (all zeros read "-0.4..0.4"); here the
    bar starts at the value and spans 1 (or 10% of it), so a zero heatmap's bar reads 0..1."""
    rng = flat_range([v for row in z for v in row])
    if rng is None:
        return {}
    value = (rng[0] + rng[1]) / 2
    return {"zmin": value, "zmax": value + (rng[1] - value)}


def note(text: str, width: int = 70) -> dict[str, Any]:
    """A centred message in an empty figure: why there is nothing to draw (never a bare axis).

    Plotly never wraps an annotation, so a long reason is broken into lines of ``width``
    characters here (a one-line reason ran off both sides of a half-width panel)."""
    return {
        "text": "<br>".join(esc(line) for line in textwrap.wrap(text, width) or [""]),
        "xref": "paper",
        "yref": "paper",
        "x": 0.5,
        "y": 0.5,
        "showarrow": False,
        "font": {"size": 13, "color": "#555"},
    }
