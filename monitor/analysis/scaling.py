"""Scaling laws L = A * C^(-b) + C0 and the compute-efficiency leverage of one method over another.

The paper fits final loss against training FLOPs C as L = A * C^(-b) + C0, or as L = A * C^(-b)
when a method has fewer than 5 points (three parameters on four points would be interpolation).
A saturating law is sensitive to its starting values, so the fit runs from a grid of starts (b
over typical exponents, C0 over fractions of the smallest loss, A by linear least squares given
the other two) and keeps the smallest squared error; ``converged`` says whether that best start's
optimizer reported convergence, and ``n_starts_at_best`` how many starts reached the same error
(within 0.01%): when it is small the data leave the law poorly determined.

FLOPs span 1e15..1e22, so C is divided by its geometric mean inside the fit (``flops_scale``);
``A`` is reported in the original units, where it may be a large number.

Bounds of the saturating fit: A >= 0, 0 <= b <= 10 and 0 <= C0 <= min(L): loss falls with compute
towards a floor below every observed loss. ``at_bounds`` names the parameters that ended on one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from hyperwatch.monitor.analysis._common import (
    AnalysisError,
    FloatArray,
    Floats,
    as_float_array,
    jsonable,
    r_squared,
    require_same_length,
)

FLOOR_MIN_POINTS = 5
"""The paper fits the floor C0 only from this many points on."""

_B_STARTS = (0.03, 0.1, 0.2, 0.4, 1.0)
_FLOOR_FRACTIONS = (0.0, 0.5, 0.9, 0.99)
_B_MAX = 10.0
_TOL = 1e-12


@dataclass(frozen=True)
class ScalingLawFit:
    """L = a * C^(-b) + c0, the paper's A and C0 (``c0`` is None for the form without a floor)."""

    a: float
    b: float
    c0: float | None
    flops_scale: float
    a_normalised: float
    r2: float
    sse: float
    n_points: int
    converged: bool
    n_starts: int
    n_starts_converged: int
    n_starts_at_best: int
    at_bounds: tuple[str, ...] = ()
    excluded_flops: tuple[float, ...] = ()

    def predict(self, flops: float | Floats) -> FloatArray:
        c = np.asarray(flops, dtype=np.float64)
        return self.a_normalised * (c / self.flops_scale) ** (-self.b) + (self.c0 or 0.0)  # type: ignore[no-any-return]

    def flops_to_reach(self, loss: float) -> tuple[float, str | None]:
        """The FLOPs at which this law reaches ``loss``; (NaN, reason) when it never does."""
        floor = self.c0 or 0.0
        if not math.isfinite(loss):
            return math.nan, f"the target loss is {loss}"
        if loss <= floor:
            return (
                math.nan,
                f"loss {loss:.6g} is at or below this law's floor C0 = {floor:.6g}; it is never reached",
            )
        if self.b <= 0.0 or self.a_normalised <= 0.0:
            return math.nan, f"this law does not decrease with compute (A = {self.a:.4g}, b = {self.b:.4g})"
        log_ratio = -(math.log(loss - floor) - math.log(self.a_normalised)) / self.b
        return self.flops_scale * math.exp(min(log_ratio, 700.0)), None

    def to_json(self) -> dict[str, Any]:
        return jsonable(
            {
                "A": self.a,
                "b": self.b,
                "C0": self.c0,
                "form": "A*C^-b + C0" if self.c0 is not None else "A*C^-b",
                "flops_scale": self.flops_scale,
                "r2": self.r2,
                "sse": self.sse,
                "n_points": self.n_points,
                "converged": self.converged,
                "n_starts": self.n_starts,
                "n_starts_converged": self.n_starts_converged,
                "n_starts_at_best": self.n_starts_at_best,
                "at_bounds": list(self.at_bounds),
                "excluded_flops": list(self.excluded_flops),
            }
        )


def _starts(x: FloatArray, loss: FloatArray, floor: bool) -> list[list[float]]:
    if not floor:
        slope, intercept = np.polyfit(np.log(x), np.log(loss), 1)
        return [[math.exp(intercept), -float(slope)]]
    starts = []
    for b0 in _B_STARTS:
        z = x ** (-b0)
        for frac in _FLOOR_FRACTIONS:
            c0 = frac * float(loss.min())
            a0 = float(np.sum((loss - c0) * z) / np.sum(z * z))
            starts.append([max(a0, 1e-12), b0, c0])
    return starts


def fit_scaling_law(
    flops: Floats,
    losses: Floats,
    floor: bool | None = None,
) -> ScalingLawFit:
    """Fit L = A * C^(-b) + C0 (``floor`` True), L = A * C^(-b) (False) or choose by point count (None).

    Points whose loss is NaN or infinite (diverged runs) are left out and listed in
    ``excluded_flops``. Raises :class:`AnalysisError` when FLOPs are not positive and finite, a
    loss is not positive, or there are fewer distinct budgets than parameters.
    """
    c = as_float_array(flops, "flops")
    loss = as_float_array(losses, "loss")
    require_same_length(c, loss, "flops", "loss")
    bad = [float(v) for v in c if not (math.isfinite(v) and v > 0.0)]
    if bad:
        raise AnalysisError("flops", f"training FLOPs must be positive and finite; got {bad[:5]}: fix those rows")
    finite = np.isfinite(loss)
    excluded = tuple(float(v) for v in c[~finite])
    c, loss = c[finite], loss[finite]
    if np.any(loss <= 0.0):
        raise AnalysisError("loss", f"a scaling law needs positive losses; got {loss[loss <= 0.0][:5].tolist()}")
    if floor is None:
        floor = c.size >= FLOOR_MIN_POINTS
    n_params = 3 if floor else 2
    n_distinct = int(np.unique(c).size)
    if n_distinct < n_params:
        raise AnalysisError(
            "flops",
            f"{n_distinct} distinct budgets with a finite loss for a law with {n_params} parameters; "
            f"train at least {n_params} budgets",
        )
    scale = math.exp(float(np.mean(np.log(c))))
    x = c / scale

    def residual(p: FloatArray) -> FloatArray:
        floor_term = p[2] if floor else 0.0
        return p[0] * x ** (-p[1]) + floor_term - loss  # type: ignore[no-any-return]

    if floor:
        lower, upper = [0.0, 0.0, 0.0], [math.inf, _B_MAX, float(loss.min())]
    else:
        lower, upper = [0.0, -math.inf], [math.inf, math.inf]
    results = []
    starts = _starts(x, loss, floor)
    for p0 in starts:
        with np.errstate(over="ignore", invalid="ignore"):
            res = least_squares(
                residual, p0, bounds=(lower, upper), method="trf", ftol=_TOL, xtol=_TOL, gtol=_TOL, max_nfev=2000
            )
        sse = float(np.sum(res.fun**2))
        if math.isfinite(sse):
            results.append((sse, res))
    if not results:
        raise AnalysisError("loss", "the scaling-law fit produced no finite solution from any start; check the data")
    best = min(results, key=lambda r: r[0])
    # "Same minimum": within 0.01% of the best error, or at rounding level for data fitted exactly.
    same = best[0] * (1 + 1e-4) + 1e-12 * float(np.sum(loss**2))
    n_at_best = sum(1 for sse, _ in results if sse <= same)
    sse, res = best
    p = res.x
    at_bounds = tuple(
        name
        for name, v, lo, hi in zip(("A", "b", "C0"), p, lower, upper, strict=False)
        if any(math.isfinite(bd) and abs(v - bd) <= 1e-9 * max(1.0, abs(bd)) for bd in (lo, hi))
    )
    a_norm, b = float(p[0]), float(p[1])
    with np.errstate(over="ignore"):
        a_orig = a_norm * scale**b
    return ScalingLawFit(
        a=float(a_orig),
        b=b,
        c0=float(p[2]) if floor else None,
        flops_scale=scale,
        a_normalised=a_norm,
        r2=r_squared(loss, loss + res.fun),
        sse=sse,
        n_points=int(c.size),
        converged=bool(res.success),
        n_starts=len(starts),
        n_starts_converged=sum(int(r.success) for _, r in results),
        n_starts_at_best=n_at_best,
        at_bounds=at_bounds,
        excluded_flops=excluded,
    )


@dataclass(frozen=True)
class LeveragePoint:
    """rho = C_base / C* at one of the method's budgets C* (NaN with ``reason`` when undefined)."""

    flops: float
    loss: float
    baseline_flops: float
    rho: float
    reason: str | None

    def to_json(self) -> dict[str, Any]:
        return jsonable(
            {
                "flops": self.flops,
                "loss": self.loss,
                "baseline_flops": self.baseline_flops,
                "rho": self.rho,
                "reason": self.reason,
            }
        )


def leverage(method: ScalingLawFit, baseline: ScalingLawFit, budgets: Floats) -> list[LeveragePoint]:
    """Compute-efficiency leverage of ``method`` over ``baseline`` at each budget C*.

    The method's loss at C* is its fitted law's value L_method(C*); C_base is the FLOPs at which
    the baseline's fitted law reaches it (the closed-form inverse of the law), and rho = C_base / C*.
    rho > 1: the method needs less compute for the same loss.
    """
    points = []
    for budget in as_float_array(budgets, "budgets"):
        target = float(method.predict(float(budget)))
        c_base, reason = baseline.flops_to_reach(target)
        points.append(
            LeveragePoint(
                flops=float(budget),
                loss=target,
                baseline_flops=c_base,
                rho=c_base / float(budget) if reason is None else math.nan,
                reason=reason,
            )
        )
    return points


@dataclass(frozen=True)
class ScalingComparison:
    """Per-method scaling laws and, for every other method, its leverage over ``baseline``.

    ``fits`` holds a fit per method, or the error message when that method's fit was impossible
    (one bad method does not hide the others). ``n_reduced`` counts rows dropped because another
    row of the same method and budget had a lower loss (a budget's best run is its point).
    """

    baseline: str | None
    fits: dict[str, ScalingLawFit | str]
    leverage: dict[str, list[LeveragePoint] | str]
    n_reduced: int

    def to_json(self) -> dict[str, Any]:
        return jsonable(
            {
                "baseline": self.baseline,
                "methods": {m: _fit_or_error(f) for m, f in self.fits.items()},
                "leverage": {m: _fit_or_error(v) for m, v in self.leverage.items()},
                "n_reduced": self.n_reduced,
            }
        )


def _fit_or_error(value: Any) -> Any:
    return {"error": value} if isinstance(value, str) else jsonable(value)


def best_per_budget(flops: FloatArray, losses: FloatArray) -> tuple[FloatArray, FloatArray, int]:
    """One point per distinct budget: the lowest finite loss there (NaN if none was finite)."""
    budgets = np.unique(flops)
    best = np.empty(budgets.size)
    for i, budget in enumerate(budgets):
        at = losses[flops == budget]
        finite = at[np.isfinite(at)]
        best[i] = finite.min() if finite.size else at[0]
    return budgets, best, int(flops.size - budgets.size)


def compare_methods(
    methods: Sequence[str],
    flops: Floats,
    losses: Floats,
    baseline: str | None,
    floor: bool | None = None,
) -> ScalingComparison:
    """Fit each method's scaling law and the leverage of every other method over ``baseline``.

    ``methods``, ``flops`` and ``losses`` are parallel columns (one row per run); each method's
    point at a budget is its lowest loss there. With ``baseline`` None only the laws are fitted.
    Raises :class:`AnalysisError` when ``baseline`` is not among the methods or its own law cannot
    be fitted.
    """
    c = as_float_array(flops, "flops")
    loss = as_float_array(losses, "loss")
    names = [str(m) for m in methods]
    if len(names) != c.size:
        raise AnalysisError("method", f"has {len(names)} values but flops has {c.size}; give one method per row")
    require_same_length(c, loss, "flops", "loss")
    order = list(dict.fromkeys(names))
    if baseline is not None and baseline not in order:
        raise AnalysisError("baseline", f"{baseline!r} is not a method in the data; choose one of {order}")
    name_arr = np.asarray(names, dtype=object)
    fits: dict[str, ScalingLawFit | str] = {}
    budgets_of: dict[str, FloatArray] = {}
    n_reduced = 0
    for name in order:
        sel = name_arr == name
        budgets, best, reduced = best_per_budget(c[sel], loss[sel])
        n_reduced += reduced
        budgets_of[name] = budgets
        try:
            fits[name] = fit_scaling_law(budgets, best, floor=floor)
        except AnalysisError as exc:
            if name == baseline:
                raise AnalysisError(exc.field, f"baseline {baseline!r}: {exc.detail}") from exc
            fits[name] = f"method {name!r}: {exc}"
    lev: dict[str, list[LeveragePoint] | str] = {}
    if baseline is None:
        return ScalingComparison(baseline=None, fits=fits, leverage=lev, n_reduced=n_reduced)
    base_fit = fits[baseline]
    assert isinstance(base_fit, ScalingLawFit)  # a failed baseline fit raised above
    for name in order:
        if name == baseline:
            continue
        fit = fits[name]
        lev[name] = fit if isinstance(fit, str) else leverage(fit, base_fit, budgets_of[name])
    return ScalingComparison(baseline=baseline, fits=fits, leverage=lev, n_reduced=n_reduced)
