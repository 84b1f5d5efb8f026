"""Forecast an indicator at a size not trained yet, from a group's smaller runs, with an honest band.

The model is a power law with multiplicative noise, one point per size::

    ln y = a + b ln x + e,   e ~ N(0, sigma^2) independently per size

fitted by ordinary least squares on (u = ln x, ln y). Unlike the transfer laws of :mod:`.powerlaw`
(least squares on y itself, as the paper fits them), a forecast needs relative errors and a
prediction interval; the classical one is exact under the model::

    ln y0 in  a + b u0  +-  t(n - 2, (1 + level) / 2) * s * sqrt(1 + 1/n + (u0 - mean u)^2 / S_uu)

with s the residual standard deviation on n - 2 degrees of freedom (at least :data:`SIGMA_FLOOR`). The leverage term
``(u0 - mean u)^2 / S_uu`` widens the band the farther the target lies from the sizes trained, and
the t quantile widens it when there are few sizes (6.3 x s at three sizes for a 90% band): the band
covers the value a new run at the target will have with probability ``level`` (checked over many
seeds in tests/monitor/analysis/test_forecast.py). It assumes the power law holds out to the target;
the sentence says how far past the data that is.

Rules that keep it honest:

- fewer than :data:`MIN_SIZES` sizes with a finite, positive value: "not enough runs", no fit;
- several runs at one size: the worst of them stands for the size (NaN, then infinity, then the
  largest), as the stability verdict does (:mod:`.stability`);
- a NaN or infinite value (a run that diverged) is a training fact: it is shown and left out of
  the fit with the reason; so is a value <= 0 (a power law never reaches it: an outlier ratio of 0);
- the crossing of the threshold is searched from the smallest size to ``horizon`` (1000) times
  the largest: "crosses at about X", "already above at the smallest size", or "not within 1000x".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np
from scipy.optimize import brentq
from scipy.stats import t as student_t

from hyperwatch.monitor.analysis._common import AnalysisError, FloatArray, Floats, as_float_array, jsonable

MIN_SIZES = 3
"""Sizes needed for a band: two give a line with no residual to measure its noise by."""
DEFAULT_LEVEL = 0.9
HORIZON = 1000.0
"""How far past the largest size a crossing is searched (x the largest size)."""
SIGMA_FLOOR = 0.1
"""The smallest noise the band assumes, in ln y (about 10%).

One run per size gives each size's peak as one draw, and between seeds of the same run it moves by
more than a smooth ladder of single runs suggests (``bench/forecast.py``, four seeds of the demo's
arms: HyperP at 157K parameters peaks at 54.6, 43.4, 54.1 and 46.5, sd 0.11 in ln, at 457K 0.03;
the baseline 0.47 and 0.33). Three or four sizes that happen to line up give residuals near 0 and
a band that claims more than one run can deliver, so the band's sigma is at least this."""
FAR = 10.0
"""A target this many times past the largest size gets a word of warning in the sentence."""

Summary = Literal["peak", "final"]
Axis = Literal["params", "flops"]
CrossingStatus = Literal["crosses", "above", "never"]

LABELS = {
    "attention_z": "attention Z",
    "router_z": "router Z",
    "attention_rms": "attention RMS",
    "mlp_rms": "MLP RMS",
    "attention_outlier_ratio": "attention outlier ratio",
    "mlp_outlier_ratio": "MLP outlier ratio",
    "max_vio": "MaxVio",
}


def label(name: str) -> str:
    return LABELS.get(name, name)


def fmt_value(v: float) -> str:
    """Three significant digits, thousands separated: 1,900 · 268 · 0.0123 · 2.5e-05 · NaN."""
    if not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    a = abs(v)
    if a == 0.0 or 1e-3 <= a < 1e3:
        return f"{v:.3g}"
    if 1e3 <= a < 1e9:
        digits = 2 - math.floor(math.log10(a))
        return f"{round(v, digits):,.0f}"
    return f"{v:.3g}"


def fmt_size(x: float, axis: Axis = "params") -> str:
    """A size as people write it: 157K, 1.3B (parameters); 3.5e+20 (FLOPs)."""
    if axis == "flops" or not math.isfinite(x):
        return f"{x:.2g}"
    x = float(f"{x:.3g}")  # 999,999.99 (an exp of a log) is 1M, not 1e+03K
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if x >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


UNIT = {"params": "params", "flops": "FLOPs"}


@dataclass(frozen=True)
class SizePoint:
    """One size: the value that stands for it, its runs, and why it is left out of the fit (if it is)."""

    size: float
    value: float
    runs: tuple[str, ...]
    reason: str | None = None

    @property
    def used(self) -> bool:
        return self.reason is None

    def to_json(self) -> dict[str, Any]:
        return jsonable(
            {"size": self.size, "value": self.value, "runs": self.runs, "used": self.used, "reason": self.reason}
        )


@dataclass(frozen=True)
class LogLinearFit:
    """ln y = intercept + slope * ln x with its prediction band (see the module doc)."""

    intercept: float
    slope: float
    sigma: float
    residual_sigma: float
    n: int
    mean_u: float
    s_uu: float
    level: float
    t: float
    r2: float

    def band(self, x: Floats) -> tuple[FloatArray, FloatArray, FloatArray]:
        """(predicted, lower, upper) at sizes ``x`` (the median of y and the ``level`` band around it)."""
        u = np.log(as_float_array(x, "x"))
        centre = self.intercept + self.slope * u
        half = self.t * self.sigma * np.sqrt(1.0 + 1.0 / self.n + (u - self.mean_u) ** 2 / self.s_uu)
        return np.exp(centre), np.exp(centre - half), np.exp(centre + half)

    def to_json(self) -> dict[str, Any]:
        return jsonable(
            {
                "form": "y = coefficient * x^exponent, ln-normal noise",
                "exponent": self.slope,
                "coefficient": math.exp(self.intercept),
                "sigma_log": self.sigma,
                "residual_sigma_log": self.residual_sigma,
                "r2": self.r2,
                "n_sizes": self.n,
                "dof": self.n - 2,
                "t": self.t,
                "level": self.level,
            }
        )


@lru_cache(maxsize=256)
def _t_quantile(level: float, dof: int) -> float:
    """The two-sided ``level`` quantile of Student's t (cached: scipy's ppf costs ~0.1 ms a call)."""
    return float(student_t.ppf(0.5 + level / 2.0, dof))


def fit_log_linear(
    sizes: Floats, values: Floats, level: float = DEFAULT_LEVEL, sigma_floor: float = SIGMA_FLOOR
) -> LogLinearFit:
    """The fit through (size, value) pairs, one per size, all finite and positive (checked by the caller);
    the band's sigma is the residuals' or ``sigma_floor``, whichever is larger (see :data:`SIGMA_FLOOR`)."""
    u = np.log(as_float_array(sizes, "sizes"))
    v = np.log(as_float_array(values, "values"))
    n = int(u.size)
    mean_u = float(u.mean())
    s_uu = float(np.sum((u - mean_u) ** 2))
    slope = float(np.sum((u - mean_u) * (v - v.mean())) / s_uu)
    intercept = float(v.mean() - slope * mean_u)
    resid = v - (intercept + slope * u)
    sse = float(np.sum(resid**2))
    sst = float(np.sum((v - v.mean()) ** 2))
    residual = math.sqrt(sse / (n - 2))
    t = _t_quantile(level, n - 2)
    r2 = 1.0 - sse / sst if sst > 0 else math.nan
    return LogLinearFit(intercept, slope, max(residual, sigma_floor), residual, n, mean_u, s_uu, level, t, r2)


@dataclass(frozen=True)
class Crossing:
    """Where the forecast reaches ``threshold``, searched from the smallest size to ``horizon``.

    ``status``: "crosses" at ``size`` (the fitted curve), "above" (the curve is at or above the
    threshold at the smallest size already), "never" (not before ``horizon``). ``earliest`` and
    ``latest`` are where the band's upper and lower edges reach it (the smallest size when they
    already do there; None when not before ``horizon``).
    """

    status: CrossingStatus
    size: float | None
    earliest: float | None
    latest: float | None
    horizon: float

    def to_json(self) -> dict[str, Any]:
        return jsonable(self.__dict__)


def _first_reach(edge: Any, lo: float, hi: float, level: float) -> float | None:
    """The smallest u in [lo, hi] where ``edge(u) >= level`` (lo if already there), else None."""
    grid = np.linspace(lo, hi, 513)
    above = np.flatnonzero(edge(grid) >= level)
    if above.size == 0:
        return None
    i = int(above[0])
    if i == 0:
        return lo
    return float(brentq(lambda u: float(edge(np.array([u]))[0]) - level, grid[i - 1], grid[i]))


def crossing(fit: LogLinearFit, threshold: float, smallest: float, largest: float, horizon: float) -> Crossing:
    lo, hi = math.log(smallest), math.log(largest * horizon)
    level = math.log(threshold)
    centre = fit.intercept + fit.slope * lo
    if centre >= level:
        status: CrossingStatus = "above"
        size = None
    elif fit.slope > 0 and (level - fit.intercept) / fit.slope <= hi:
        status, size = "crosses", math.exp((level - fit.intercept) / fit.slope)
    else:
        status, size = "never", None

    def upper(u: FloatArray) -> FloatArray:
        return np.log(fit.band(np.exp(u))[2])

    def lower(u: FloatArray) -> FloatArray:
        return np.log(fit.band(np.exp(u))[1])

    early, late = _first_reach(upper, lo, hi, level), _first_reach(lower, lo, hi, level)
    return Crossing(
        status,
        size,
        None if early is None else math.exp(early),
        None if late is None else math.exp(late),
        largest * horizon,
    )


@dataclass(frozen=True)
class Forecast:
    """One summary (peak or final) of one indicator, forecast across sizes (see the module doc)."""

    name: str
    summary: Summary
    axis: Axis
    level: float
    points: tuple[SizePoint, ...]
    fit: LogLinearFit | None
    reason: str | None
    target: float | None
    predicted: float | None
    lower: float | None
    upper: float | None
    threshold: float | None
    crossing: Crossing | None
    threshold_key: str | None = None

    @property
    def used(self) -> list[SizePoint]:
        return [p for p in self.points if p.used]

    @property
    def extrapolation(self) -> float | None:
        """The target over the largest size fitted (> 1: past the data)."""
        used = self.used
        if self.target is None or not used:
            return None
        return self.target / max(p.size for p in used)

    def curve(self, n: int = 60) -> dict[str, list[float]] | None:
        """The fitted curve and band on a log grid covering the data, the target and the crossing."""
        if self.fit is None:
            return None
        sizes = [p.size for p in self.used]
        right = [max(sizes), self.target or 0.0]
        if self.crossing is not None and self.crossing.size is not None:
            right.append(self.crossing.size)
        x = np.geomspace(min(sizes) / 1.5, max(right) * 1.5, n)
        centre, lo, hi = self.fit.band(x)
        return {"size": x.tolist(), "predicted": centre.tolist(), "lower": lo.tolist(), "upper": hi.tolist()}

    def sentence(self) -> str:
        return describe(self)

    def to_json(self) -> dict[str, Any]:
        return jsonable(
            {
                "name": self.name,
                "summary": self.summary,
                "axis": self.axis,
                "level": self.level,
                "points": self.points,
                "fit": self.fit,
                "reason": self.reason,
                "target": self.target,
                "predicted": self.predicted,
                "lower": self.lower,
                "upper": self.upper,
                "extrapolation": self.extrapolation,
                "threshold": self.threshold,
                "crossing": self.crossing,
                "curve": self.curve(),
                "sentence": self.sentence(),
            }
        )


def _check_positive(value: float | None, field: str, fix: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise AnalysisError(field, f"must be a positive finite number, got {value!r}; {fix}")


def size_points(
    sizes: Sequence[float], values: Sequence[float], runs: Sequence[str], summary: Summary = "peak"
) -> list[SizePoint]:
    """One point per size, the worst run standing for it; non-finite and non-positive values carry why
    they are left out. Sizes must be positive and finite (AnalysisError naming ``sizes[i]`` otherwise)."""
    if not (len(sizes) == len(values) == len(runs)):
        raise AnalysisError("values", f"{len(values)} values, {len(sizes)} sizes, {len(runs)} runs; give one each")
    by_size: dict[float, list[tuple[str, float]]] = {}
    for i, (s, v, r) in enumerate(zip(sizes, values, runs, strict=True)):
        _check_positive(s, f"sizes[{i}]", "a run's size is its parameters or FLOPs")
        by_size.setdefault(float(s), []).append((r, float(v)))
    points = []
    for size in sorted(by_size):
        members = by_size[size]
        vals = [v for _, v in members]
        worst = math.nan if any(math.isnan(v) for v in vals) else max(vals)
        reason = None
        if not math.isfinite(worst):
            reason = f"{summary} is {fmt_value(worst)}: the run diverged (a training fact: shown, left out of the fit)"
        elif worst <= 0:
            reason = f"{summary} is {fmt_value(worst)}: a power law never reaches 0 or below"
        points.append(SizePoint(size, worst, tuple(r for r, _ in members), reason))
    return points


def forecast(
    name: str,
    sizes: Sequence[float],
    values: Sequence[float],
    runs: Sequence[str],
    *,
    summary: Summary = "peak",
    axis: Axis = "params",
    target: float | None = None,
    threshold: float | None = None,
    threshold_key: str | None = None,
    level: float = DEFAULT_LEVEL,
    horizon: float = HORIZON,
    sigma_floor: float = SIGMA_FLOOR,
) -> Forecast:
    """The forecast of ``name``'s ``summary`` (one value per run, sizes in ``axis`` units).

    Raises :class:`AnalysisError` naming the input for a size, target or threshold that is not a
    positive finite number, or a level outside (0, 1); too few sizes is not an error but a
    forecast without a fit whose ``reason`` says so.
    """
    if not (isinstance(level, float | int) and 0.0 < level < 1.0):
        raise AnalysisError("level", f"must be between 0 and 1 (exclusive), got {level!r}; 0.9 is a 90% band")
    _check_positive(target, "target", "give the size to forecast at (parameters or FLOPs)")
    _check_positive(threshold, "threshold", "set the indicator's limit on the group (e.g. attention_z_limit)")
    points = size_points(sizes, values, runs, summary)
    used = [p for p in points if p.used]
    fit = reason = cross = None
    predicted = lower = upper = None
    if len(used) < MIN_SIZES:
        reason = f"not enough runs: {len(used)} size{'' if len(used) == 1 else 's'} with a finite, positive {summary}"
        reason += f" (need {MIN_SIZES})"
    else:
        fit = fit_log_linear([p.size for p in used], [p.value for p in used], level, sigma_floor)
        if target is not None:
            centre, lo, hi = fit.band([target])
            predicted, lower, upper = float(centre[0]), float(lo[0]), float(hi[0])
        if threshold is not None:
            cross = crossing(fit, threshold, used[0].size, used[-1].size, horizon)
    return Forecast(
        name, summary, axis, level, tuple(points), fit, reason, target, predicted, lower, upper, threshold, cross,
        threshold_key,
    )  # fmt: skip


def describe(f: Forecast) -> str:
    """The forecast in one sentence, the same on the page, in the API and on the command line.

    "peak attention Z: 1,900 predicted at 1.3B params (90% band 1,200-3,000), crosses 1,000 at about
    300M (band 200M-500M)."
    """
    unit = UNIT[f.axis]
    head = f"{f.summary} {label(f.name)}"
    left_out = [f"{'/'.join(p.runs)} ({p.reason.split(':')[0]})" for p in f.points if p.reason is not None]
    tail = f"; left out: {', '.join(left_out)}" if left_out else ""
    if f.fit is None:
        return f"{head}: {f.reason}{tail}."
    parts = []
    if f.target is not None and f.predicted is not None:
        assert f.lower is not None and f.upper is not None
        band = f"{f.level:.0%} band {fmt_value(f.lower)}-{fmt_value(f.upper)}"
        far = f.extrapolation or 1.0
        if far >= FAR:
            band += f"; {far:,.0f}x past the largest size fitted, if the power law holds that far"
        parts.append(f"{fmt_value(f.predicted)} predicted at {fmt_size(f.target, f.axis)} {unit} ({band})")
    if f.threshold is None:
        key = f.threshold_key or f"{f.name}_limit"
        parts.append(f"no threshold to cross (set {key} on the group)")
    else:
        assert f.crossing is not None
        parts.append(_crossing_words(f.crossing, f.threshold, f.axis, f.used[0].size))
    return f"{head}: {', '.join(parts)}{tail}."


def _crossing_words(c: Crossing, threshold: float, axis: Axis, smallest: float) -> str:
    t = fmt_value(threshold)
    horizon = f"{HORIZON:,.0f}x the largest size fitted"

    def at(x: float | None, none: str) -> str:
        if x is None:
            return none
        return f"≤{fmt_size(x, axis)}" if x <= smallest * (1 + 1e-9) else fmt_size(x, axis)

    if c.status == "above":
        return f"already above {t} at the smallest size fitted ({fmt_size(smallest, axis)} {UNIT[axis]})"
    if c.status == "crosses":
        assert c.size is not None
        band = f"band {at(c.earliest, '?')}-{at(c.latest, f'beyond {horizon}')}"
        return f"crosses {t} at about {fmt_size(c.size, axis)} ({band})"
    if c.earliest is None:
        return f"does not cross {t} within {horizon}"
    return f"does not cross {t} within {horizon} (the band's upper edge does at {at(c.earliest, '')})"
