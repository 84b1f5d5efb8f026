"""Figures of the sweeps page, from :func:`monitor.analysis.fit_group` on a group's stored runs.

- loss vs LR per sweep with its quadratic fit in ln(lr) and the fitted optimum (a star);
- optimal LR vs tokens, vs depth and vs batch size with the fitted power law;
- loss vs FLOPs per method with its scaling law, and the compute-leverage curve rho(C) of every
  method over the chosen baseline (points at the method's budgets, the curve from the two laws).

A part that could not be fitted is listed in ``notes`` with its error message: plain text for the
page's ``textContent`` (figure strings, which Plotly renders, are escaped instead).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hyperwatch.monitor.analysis import GroupAnalysis, LRFit, PowerLawFit, ScalingComparison, ScalingLawFit
from hyperwatch.web.figures import NONFINITE_COLOUR, base_layout, nonfinite_trace, note
from hyperwatch.web.layout import legend_below
from hyperwatch.web.scale import esc, human_count

_QUALITATIVE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
_SWEEP_STOPS = ("#440154", "#3e4989", "#26828e", "#35b779", "#b5de2b")
AXIS_TITLES = {"tokens": "training tokens", "depth": "depth", "batch_size": "batch size (tokens)"}


def _seq_colour(i: int, n: int) -> str:
    return _SWEEP_STOPS[0 if n <= 1 else round(i * (len(_SWEEP_STOPS) - 1) / (n - 1))]


def sweep_label(fixed: Mapping[str, Any]) -> str:
    parts = []
    if fixed.get("depth") is not None:
        parts.append(f"d={float(fixed['depth']):g}")
    if fixed.get("tokens") is not None:
        parts.append(f"T={human_count(float(fixed['tokens']))}")
    if fixed.get("batch_size") is not None:
        parts.append(f"B={human_count(float(fixed['batch_size']))}")
    if fixed.get("method"):
        parts.append(str(fixed["method"]))
    return " · ".join(parts) or "sweep"


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def lr_figure(analysis: GroupAnalysis, records: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """Loss vs LR per sweep (log x), fitted parabola in ln(lr) and the optimum."""
    by_run = {r["run"]: r for r in records}
    data: list[dict[str, Any]] = []
    notes: list[str] = []
    sweeps = sorted(analysis.sweeps, key=lambda s: tuple((v is None, v or 0) for v in s.key[1:]))
    for i, sw in enumerate(sweeps):
        method, depth, tokens, batch = sw.key
        plain = sweep_label({"method": method, "depth": depth, "tokens": tokens, "batch_size": batch})
        label = esc(plain)
        colour = _seq_colour(i, len(sweeps))
        pts = sorted((by_run[r]["lr"], by_run[r]["val_loss"]) for r in sw.runs if r in by_run)
        lrs, losses = [p[0] for p in pts], [float(p[1]) for p in pts]
        group = f"sweep{i}"
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "x": lrs,
                "y": [_finite(v) for v in losses],
                "name": label,
                "legendgroup": group,
                "marker": {"color": colour, "size": 8},
                "hovertemplate": "%{fullData.name}<br>lr %{x:.3g}: loss %{y:.5g}<extra></extra>",
            }
        )
        nf = nonfinite_trace(lrs, losses, label, group, 0.97 - 0.04 * (i % 12), colour)
        if nf is not None:
            data.append(nf)
        if isinstance(sw.fit, str):
            notes.append(f"{plain}: {sw.fit}")
            continue
        data.extend(_parabola(sw.fit, label, group, colour))
    layout = base_layout("Final validation loss vs learning rate, per sweep", "learning rate", "val_loss", 420)
    layout["xaxis"]["type"] = "log"
    legend_below(layout, data)  # labels name the sweep's method: at the right they squeezed the plot
    fig = {"data": data, "layout": layout, "meta": {"sweeps": len(sweeps)}}
    if not sweeps:
        lrs = sorted({r["lr"] for r in records if r.get("lr") is not None})
        why = (
            f"no learning-rate sweep: the {len(records)} finished runs use "
            + (f"one learning rate ({lrs[0]:g})" if len(lrs) == 1 else f"{len(lrs)} learning rates")
            + "; runs at 2 or more LRs sharing method, depth, tokens and batch size form a sweep"
        )
        return empty_figure(fig, why), notes
    return fig, notes


FIT_R2_CAVEAT = 0.95
"""Below this R^2 (or with fewer than 4 points) a fitted law is drawn with a caveat, not as a finding."""


def empty_figure(fig: dict[str, Any], why: str) -> dict[str, Any]:
    """A panel with nothing to draw says why, instead of showing a bare axis with a made-up range."""
    layout = fig["layout"]
    layout["xaxis"] = {"visible": False}
    layout["yaxis"] = {"visible": False}
    layout["height"] = 160
    layout["annotations"] = [note(why)]
    fig["meta"]["empty"] = why
    return fig


def caveat(what: str, r2: float, n: int) -> str | None:
    """The warning a weak fit carries: low R^2 or too few points to read an exponent from."""
    if n < 4 or not (r2 >= FIT_R2_CAVEAT):
        return (
            f"{what}: R²={r2:.2f} from {n} points; below R²={FIT_R2_CAVEAT} or 4 points a fitted law is a "
            "sketch, not a measurement: add runs before extrapolating"
        )
    return None


def _parabola(fit: LRFit, label: str, group: str, colour: str) -> list[dict[str, Any]]:
    c2, c1, c0 = fit.coefficients
    lo, hi = math.log(fit.lr_range[0]), math.log(fit.lr_range[1])
    pad = 0.1 * (hi - lo)
    u = np.linspace(lo - pad, hi + pad, 60)
    curve = {
        "type": "scatter",
        "mode": "lines",
        "x": np.exp(u).tolist(),
        "y": (c2 * u * u + c1 * u + c0).tolist(),
        "name": f"{label} fit (R²={fit.r2:.3f})",
        "legendgroup": group,
        "showlegend": False,
        "line": {"color": colour, "dash": "dot", "width": 1.5},
        "hovertemplate": "fit<br>lr %{x:.3g}: %{y:.5g}<extra></extra>",
    }
    star = {
        "type": "scatter",
        "mode": "markers",
        "x": [fit.optimal_lr],
        "y": [_finite(fit.optimal_loss)],
        "name": f"{label} optimum",
        "legendgroup": group,
        "showlegend": False,
        "marker": {"color": colour, "symbol": "star", "size": 15, "line": {"color": "#000", "width": 1}},
        "hovertemplate": (
            f"optimum ({fit.method}{', ' + esc(fit.reason) if fit.reason else ''})"
            "<br>lr %{x:.4g}: loss %{y:.5g}<extra></extra>"
        ),
        "meta": {"optimum": True},
    }
    return [curve, star]


def transfer_figures(analysis: GroupAnalysis) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """One figure per axis (tokens, depth, batch_size) that has a transfer law: optimal LR vs axis."""
    figures: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for axis in ("tokens", "depth", "batch_size"):
        laws = [law for law in analysis.transfer_laws if law.axis == axis]
        if not laws:
            continue
        data: list[dict[str, Any]] = []
        for i, law in enumerate(laws):
            label = esc(sweep_label(law.fixed))
            colour = _QUALITATIVE[i % len(_QUALITATIVE)]
            data.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "x": list(law.x),
                    "y": list(law.optimal_lr),
                    "name": f"optimal lr · {label}",
                    "legendgroup": f"law{i}",
                    "marker": {"color": colour, "size": 9},
                    "hovertemplate": "%{x:.4g}: lr* %{y:.4g}<extra></extra>",
                }
            )
            if isinstance(law.fit, str):
                notes.append(f"optimal lr vs {axis} ({sweep_label(law.fixed)}): {law.fit}")
                continue
            data.append(_power_curve(law.fit, law.x, f"law{i}", colour, axis))
            warn = caveat(f"optimal lr vs {axis} ({sweep_label(law.fixed)})", law.fit.r2, len(law.x))
            if warn:
                notes.append(warn)
        layout = base_layout(f"Optimal learning rate vs {AXIS_TITLES[axis]}", AXIS_TITLES[axis], "optimal lr", 380)
        layout["xaxis"]["type"] = "log"
        layout["yaxis"]["type"] = "log"
        legend_below(layout, data)
        figures[f"transfer_{axis}"] = {"data": data, "layout": layout, "meta": {"axis": axis, "laws": len(laws)}}
    return figures, notes


def _power_curve(fit: PowerLawFit, xs: Sequence[float], group: str, colour: str, axis: str) -> dict[str, Any]:
    lo, hi = math.log(min(xs)), math.log(max(xs))
    pad = 0.15 * (hi - lo)
    grid = np.exp(np.linspace(lo - pad, hi + pad, 50))
    floor = f" + {fit.c:.3g}" if fit.c is not None else ""
    return {
        "type": "scatter",
        "mode": "lines",
        "x": grid.tolist(),
        "y": [_finite(float(v)) for v in fit.predict(grid)],
        "name": f"lr* = {fit.a:.3g}·{axis}^{fit.b:.3f}{floor} (R²={fit.r2:.2f}, LOO {fit.loo_mape:.1f}%)",
        "legendgroup": group,
        "line": {"color": colour, "dash": "dot"},
        "hovertemplate": "fit: %{x:.4g} → %{y:.4g}<extra></extra>",
        "meta": {"exponent": fit.b},
    }


def scaling_figures(
    scaling: ScalingComparison | str | None, records: Sequence[Mapping[str, Any]]
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Loss vs FLOPs with each method's law, and rho(C) of every method over the baseline."""
    if scaling is None:
        return {}, ["no run has flops: record each run's training FLOPs for the scaling laws"]
    if isinstance(scaling, str):
        return {}, [scaling]
    notes: list[str] = []
    data: list[dict[str, Any]] = []
    methods = list(scaling.fits)
    colour_of = {m: _QUALITATIVE[i % len(_QUALITATIVE)] for i, m in enumerate(methods)}
    with_flops = [r for r in records if r.get("flops") is not None]
    all_flops = [float(r["flops"]) for r in with_flops]
    for m in methods:
        rows = sorted((float(r["flops"]), float(r["val_loss"])) for r in with_flops if (r["method"] or "default") == m)
        label = esc(m)
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "x": [f for f, _ in rows],
                "y": [_finite(v) for _, v in rows],
                "name": label,
                "legendgroup": label,
                "marker": {"color": colour_of[m], "size": 8},
                "hovertemplate": "%{fullData.name}<br>%{x:.3s} FLOPs: loss %{y:.5g}<extra></extra>",
            }
        )
        fit = scaling.fits[m]
        if isinstance(fit, str):
            notes.append(fit)
            continue
        stalled = does_not_scale(m, fit.a, fit.b, fit.c0)
        if stalled:
            notes.append(stalled)
        warn = caveat(f"scaling law of {m}", fit.r2, fit.n_points)
        if warn:
            notes.append(warn)
        grid = _flops_grid(all_flops)
        form = law_text(fit.a, fit.b, fit.c0) + (" · does not scale" if stalled else "")
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "x": grid.tolist(),
                "y": [_finite(float(v)) for v in fit.predict(grid)],
                "name": f"{label}: L = {form} (R²={fit.r2:.2f})",
                "legendgroup": label,
                "line": {"color": colour_of[m], "dash": "dot"},
                "hovertemplate": "fit %{x:.3s}: %{y:.5g}<extra></extra>",
            }
        )
    layout = base_layout("Final validation loss vs training FLOPs", "training FLOPs", "val_loss", 420)
    layout["xaxis"]["type"] = "log"
    legend_below(layout, data)
    figures = {"scaling": {"data": data, "layout": layout, "meta": {"methods": methods}}}
    if scaling.baseline is not None:
        figures["leverage"] = _leverage_figure(scaling, colour_of, all_flops)
    return figures, notes


def does_not_scale(method: str, a: float, b: float, c0: float | None) -> str | None:
    """The note for an arm whose fitted loss does not fall with compute (exponent b <= 0 in
    L = a·C^(-b)): a good R^2 then measures a flat or rising line, not a scaling law."""
    if b > 0:
        return None
    trend = "rises" if b < 0 else "stays flat"
    return (
        f"{method} does not scale: its loss {trend} as compute grows (L = {law_text(a, b, c0)}); "
        "its law and leverage are no prediction for larger budgets (check its LR and stability)"
    )


def law_text(a: float, b: float, c0: float | None) -> str:
    """L = a·C^(-b) (+ c0) as a legend reads it; a loss that grows with compute (b < 0, the
    baseline arm of the demo) reads C^0.003, never C^--0.003."""
    return f"{a:.3g}·C^{-b:.3f}" + (f" + {c0:.3g}" if c0 is not None else "")


def _flops_grid(flops: Sequence[float]) -> np.ndarray:
    lo, hi = math.log(min(flops)), math.log(max(flops))
    pad = 0.1 * (hi - lo) if hi > lo else 0.5
    return np.exp(np.linspace(lo - pad, hi + pad, 60))


def leverage_curve(method: ScalingLawFit, baseline: ScalingLawFit, grid: Sequence[float]) -> list[float | None]:
    """rho(C) = C_base(L_method(C)) / C on a grid; None where the baseline never reaches that loss."""
    out: list[float | None] = []
    for c in grid:
        c_base, reason = baseline.flops_to_reach(float(method.predict(float(c))))
        out.append(None if reason is not None or not math.isfinite(c_base) else c_base / float(c))
    return out


def _leverage_figure(
    scaling: ScalingComparison, colour_of: Mapping[str, str], flops: Sequence[float]
) -> dict[str, Any]:
    assert scaling.baseline is not None
    base = scaling.fits[scaling.baseline]
    data: list[dict[str, Any]] = []
    grid = _flops_grid(flops)
    for m, points in scaling.leverage.items():
        label = esc(m)
        fit = scaling.fits[m]
        if isinstance(points, str) or isinstance(fit, str) or isinstance(base, str):
            continue
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "x": grid.tolist(),
                "y": leverage_curve(fit, base, grid.tolist()),
                "name": f"{label} over {esc(scaling.baseline)}",
                "legendgroup": label,
                "line": {"color": colour_of[m]},
                "hovertemplate": "%{x:.3s} FLOPs: ρ = %{y:.3f}<extra></extra>",
            }
        )
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "x": [p.flops for p in points],
                "y": [_finite(p.rho) for p in points],
                "text": [esc(p.reason or "") for p in points],
                "name": f"{label} at its budgets",
                "legendgroup": label,
                "showlegend": False,
                "marker": {"color": colour_of[m], "size": 9},
                "hovertemplate": "%{x:.3s} FLOPs: ρ = %{y:.3f} %{text}<extra></extra>",
            }
        )
    layout = base_layout(
        f"Compute leverage over {esc(scaling.baseline)} (ρ > 1: less compute for the same loss)",
        "training FLOPs",
        "ρ = C_baseline / C",
        380,
    )
    layout["xaxis"]["type"] = "log"
    legend_below(layout, data)
    layout["shapes"] = [
        {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": 1, "y1": 1, "line": {"color": "#999", "dash": "dash"}}
    ]
    return {"data": data, "layout": layout, "meta": {"baseline": scaling.baseline}}


def sweeps_payload(analysis: GroupAnalysis, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Every figure of the sweeps page plus the notes on parts that could not be fitted."""
    lr_fig, notes = lr_figure(analysis, records)
    figures: dict[str, dict[str, Any]] = {"lr": lr_fig}
    transfer, n2 = transfer_figures(analysis)
    scaling, n3 = scaling_figures(analysis.scaling, records)
    figures.update(transfer)
    figures.update(scaling)
    return {"figures": figures, "notes": notes + n2 + n3, "nonfinite_colour": NONFINITE_COLOUR}
