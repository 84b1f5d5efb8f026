"""Transfer laws: power laws y = a * x^b (optionally + c) fitted in linear space.

The paper fits its transfer laws (optimal LR vs training tokens, exponent about -0.32; optimal LR
vs batch size; optimal loss vs MoE sparsity) by nonlinear least squares on y itself, not by a
straight line in log-log space: the straight line weighs relative errors, the paper's fit weighs
absolute ones. The log-log line is only the starting point of ``scipy.optimize.curve_fit``.

x and y are rescaled by their typical sizes before fitting (x by its geometric mean, y by its
largest magnitude) so that token counts near 1e10 and LRs near 1e-3 give a well-conditioned
problem; ``a`` and ``c`` are reported in the original units.

The law's out-of-sample error is the leave-one-out mean absolute percentage error: refit without
each point, predict it, and average |prediction - y| / |y| (in percent).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import OptimizeWarning, curve_fit

from hyperwatch.monitor.analysis._common import (
    AnalysisError,
    FloatArray,
    Floats,
    as_float_array,
    jsonable,
    r_squared,
    require_same_length,
)


@dataclass(frozen=True)
class PowerLawFit:
    """y = a * x^b (+ c when ``c`` is not None).

    ``loo_mape`` is in percent; NaN when leave-one-out is impossible (as many points as parameters)
    or a leave-one-out refit failed (``note`` says which). ``converged`` is False when no start of
    curve_fit converged and the log-log line is reported instead.
    """

    a: float
    b: float
    c: float | None
    b_stderr: float
    r2: float
    loo_mape: float
    loo_predictions: tuple[float, ...]
    n_points: int
    converged: bool
    note: str | None = None

    def predict(self, x: Floats) -> FloatArray:
        xs = as_float_array(x, "x")
        with np.errstate(over="ignore", invalid="ignore"):
            return self.a * xs**self.b + (self.c or 0.0)

    def to_json(self) -> dict[str, Any]:
        return jsonable(
            {
                "a": self.a,
                "b": self.b,
                "c": self.c,
                "form": "a*x^b + c" if self.c is not None else "a*x^b",
                "b_stderr": self.b_stderr,
                "r2": self.r2,
                "loo_mape": self.loo_mape,
                "loo_predictions": list(self.loo_predictions),
                "n_points": self.n_points,
                "converged": self.converged,
                "note": self.note,
            }
        )


def _pure(x: FloatArray, a: float, b: float) -> FloatArray:
    return a * x**b  # type: ignore[no-any-return]


def _with_floor(x: FloatArray, a: float, b: float, c: float) -> FloatArray:
    return a * x**b + c  # type: ignore[no-any-return]


def _loglog_start(x: FloatArray, r: FloatArray) -> tuple[float, float] | None:
    """(a, b) of the straight line through (ln x, ln |r|), or None when r changes sign or is 0."""
    if not (np.all(r > 0) or np.all(r < 0)):
        return None
    slope, intercept = np.polyfit(np.log(x), np.log(np.abs(r)), 1)
    return float(np.sign(r[0]) * math.exp(intercept)), float(slope)


def _fit_normalised(xn: FloatArray, yn: FloatArray, irreducible: bool) -> tuple[FloatArray, float, bool]:
    """Best (params, var(b), converged) over the starts; xn, yn already rescaled."""
    if irreducible:
        lo, hi = float(yn.min()), float(yn.max())
        span = hi - lo if hi > lo else max(abs(lo), 1.0)
        floors = [0.0] + [lo - f * span for f in (0.01, 0.1, 0.3, 1.0, 3.0)]
        floors += [hi + f * span for f in (0.01, 0.1, 0.3, 1.0, 3.0)]
        starts = []
        for c0 in floors:
            ab = _loglog_start(xn, yn - c0)
            if ab is not None:
                starts.append([ab[0], ab[1], c0])
        model: Any = _with_floor
    else:
        ab = _loglog_start(xn, yn)
        assert ab is not None  # checked by the caller: y has one sign
        starts = [[ab[0], ab[1]]]
        model = _pure
    best: tuple[float, FloatArray, float] | None = None
    for p0 in starts:
        try:
            with warnings.catch_warnings(), np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                warnings.simplefilter("ignore", OptimizeWarning)
                popt, pcov = curve_fit(model, xn, yn, p0=p0, maxfev=10_000)
        except (RuntimeError, ValueError):
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            sse = float(np.sum((model(xn, *popt) - yn) ** 2))
        if math.isfinite(sse) and (best is None or sse < best[0]):
            best = (sse, np.asarray(popt, dtype=np.float64), float(np.asarray(pcov)[1, 1]))
    if best is not None:
        return best[1], best[2], True
    # No start converged: report the best starting line, flagged as not converged.
    return np.asarray(starts[0], dtype=np.float64), math.nan, False


def _fit_params(x: FloatArray, y: FloatArray, irreducible: bool) -> tuple[float, float, float | None, float, bool]:
    """(a, b, c, var_b, converged) in original units."""
    x_scale = math.exp(float(np.mean(np.log(x))))
    y_scale = float(np.max(np.abs(y)))
    if y_scale == 0.0:
        raise AnalysisError("y", "every y value is 0; a power law needs non-zero data")
    p, var_b, converged = _fit_normalised(x / x_scale, y / y_scale, irreducible)
    a = float(p[0]) * y_scale * x_scale ** (-float(p[1]))
    c = float(p[2]) * y_scale if irreducible else None
    return a, float(p[1]), c, var_b, converged


def fit_power_law(
    x: Floats,
    y: Floats,
    irreducible: bool = False,
) -> PowerLawFit:
    """Fit y = a * x^b (or a * x^b + c with ``irreducible``) by least squares on y.

    Raises :class:`AnalysisError` when x is not positive and finite, y is not finite, there are
    fewer distinct x than parameters, or (without the irreducible term) y is zero or changes sign.
    """
    xa = as_float_array(x, "x")
    ya = as_float_array(y, "y")
    require_same_length(xa, ya, "x", "y")
    bad_x = [float(v) for v in xa if not (math.isfinite(v) and v > 0.0)]
    if bad_x:
        raise AnalysisError("x", f"a power law needs positive, finite x; got {bad_x[:5]}: remove or fix those rows")
    bad_y = [float(v) for v in ya if not math.isfinite(v)]
    if bad_y:
        raise AnalysisError("y", f"a power law needs finite y; got {bad_y[:5]}: remove or fix those rows")
    n_params = 3 if irreducible else 2
    n_distinct = int(np.unique(xa).size)
    if n_distinct < n_params:
        raise AnalysisError(
            "x",
            f"{n_distinct} distinct x values for a law with {n_params} parameters; give at least {n_params}",
        )
    if not irreducible and not (np.all(ya > 0) or np.all(ya < 0)):
        raise AnalysisError(
            "y",
            "y = a*x^b has one sign and is never 0, but y contains zeros or both signs; "
            "fit with the irreducible term (y = a*x^b + c; --irreducible on the command line) or check the column",
        )
    a, b, c, var_b, converged = _fit_params(xa, ya, irreducible)
    with np.errstate(over="ignore", invalid="ignore"):
        fitted = a * xa**b + (c or 0.0)
    r2 = r_squared(ya, fitted)

    loo, note = _leave_one_out(xa, ya, irreducible, n_params)
    with np.errstate(divide="ignore", invalid="ignore"):
        loo_mape = float(100.0 * np.mean(np.abs(loo - ya) / np.abs(ya))) if loo.size else math.nan
    if not converged:
        note = "curve_fit did not converge from any start; a, b are the log-log starting line"
    return PowerLawFit(
        a=a,
        b=b,
        c=c,
        b_stderr=math.sqrt(var_b) if math.isfinite(var_b) and var_b >= 0 else math.nan,
        r2=r2,
        loo_mape=loo_mape,
        loo_predictions=tuple(float(v) for v in loo),
        n_points=int(xa.size),
        converged=converged,
        note=note,
    )


def _leave_one_out(x: FloatArray, y: FloatArray, irreducible: bool, n_params: int) -> tuple[FloatArray, str | None]:
    """Predictions of each point by the law fitted to the others (NaN where a refit is impossible)."""
    n = x.size
    preds = np.full(n, math.nan)
    failed: list[int] = []
    for i in range(n):
        keep = np.arange(n) != i
        xk, yk = x[keep], y[keep]
        if np.unique(xk).size < n_params:
            failed.append(i)
            continue
        try:
            a, b, c, _, _ = _fit_params(xk, yk, irreducible)
        except AnalysisError:
            failed.append(i)
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            preds[i] = a * x[i] ** b + (c or 0.0)
    if len(failed) == n:
        return preds, f"leave-one-out needs more than {n_params} distinct x values; loo_mape is undefined"
    if failed:
        return preds, f"leave-one-out refit impossible without points {failed}; loo_mape is NaN"
    return preds, None
