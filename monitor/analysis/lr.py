"""Optimal learning rate of a sweep: a quadratic in log(lr), with the paper's fallbacks.

The paper (spec section 5) fits the final loss of an LR sweep as

    loss(u) = c2 * u^2 + c1 * u + c0,    u = ln(lr)

and takes the vertex u* = -c1 / (2 c2) as the optimal LR and loss(u*) as the optimal loss. The fit
is only trusted when it is good and its answer is inside the data: when R^2 < 0.99, when the
parabola opens downward (c2 <= 0, the vertex is a maximum) or when the vertex lies outside the
swept LR range, the result falls back to the observed best point and says why.

Runs whose loss is NaN or infinite (diverged at a large LR) are training facts, not noise: they
cannot enter a least-squares fit, so they are left out of it and listed in ``excluded_lrs``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from hyperwatch.monitor.analysis._common import (
    AnalysisError,
    FloatArray,
    Floats,
    as_float_array,
    jsonable,
    r_squared,
    require_same_length,
)

R2_THRESHOLD = 0.99
"""The paper's goodness-of-fit threshold below which the observed best point is reported."""

_N_PARAMS = 3


@dataclass(frozen=True)
class LRFit:
    """The optimal LR of one sweep.

    ``optimal_lr``/``optimal_loss`` are what to report: the vertex when ``method`` is
    ``"quadratic"``, the observed best point when it is ``"observed_best"`` (``reason`` says why).
    ``vertex_lr``/``vertex_loss`` are the parabola's vertex whatever the method (NaN when c2 <= 0).
    ``coefficients`` are (c2, c1, c0) of loss = c2*u^2 + c1*u + c0 with u = ln(lr).
    """

    optimal_lr: float
    optimal_loss: float
    method: Literal["quadratic", "observed_best"]
    reason: str | None
    r2: float
    n_points: int
    coefficients: tuple[float, float, float]
    vertex_lr: float
    vertex_loss: float
    lr_range: tuple[float, float]
    excluded_lrs: tuple[float, ...] = ()

    def to_json(self) -> dict[str, Any]:
        c2, c1, c0 = self.coefficients
        return jsonable(
            {
                "optimal_lr": self.optimal_lr,
                "optimal_loss": self.optimal_loss,
                "method": self.method,
                "reason": self.reason,
                "r2": self.r2,
                "n_points": self.n_points,
                "coefficients": {"c2": c2, "c1": c1, "c0": c0},
                "vertex_lr": self.vertex_lr,
                "vertex_loss": self.vertex_loss,
                "lr_range": list(self.lr_range),
                "excluded_lrs": list(self.excluded_lrs),
            }
        )


def _quadratic(u: FloatArray, y: FloatArray) -> tuple[float, float, float, float]:
    """Least-squares parabola on centred u: returns (d2, d1, d0, m), y = d2 v^2 + d1 v + d0, v = u - m."""
    m = float(np.mean(u))
    v = u - m
    design = np.stack([v * v, v, np.ones_like(v)], axis=1)
    (d2, d1, d0), *_ = np.linalg.lstsq(design, y, rcond=None)
    return float(d2), float(d1), float(d0), m


def fit_optimal_lr(
    lrs: Floats,
    losses: Floats,
    r2_threshold: float = R2_THRESHOLD,
) -> LRFit:
    """Fit loss vs ln(lr) with a quadratic; fall back to the observed best when it is not trusted.

    Raises :class:`AnalysisError` when the input cannot be fitted at all: lengths differ, an LR is
    not positive and finite, fewer than 3 distinct LRs, or no loss is finite.
    """
    lr = as_float_array(lrs, "lr")
    loss = as_float_array(losses, "loss")
    require_same_length(lr, loss, "lr", "loss")
    if not 0.0 < r2_threshold <= 1.0:
        raise AnalysisError("r2_threshold", f"must be in (0, 1], got {r2_threshold}; the paper uses 0.99")
    bad = [float(x) for x in lr if not (math.isfinite(x) and x > 0.0)]
    if bad:
        raise AnalysisError("lr", f"every learning rate must be positive and finite, got {bad[:5]}; fix those rows")
    if np.unique(lr).size < _N_PARAMS:
        raise AnalysisError(
            "lr",
            f"{np.unique(lr).size} distinct learning rates; a quadratic in log(lr) has {_N_PARAMS} "
            f"parameters, so sweep at least {_N_PARAMS} distinct values",
        )
    finite = np.isfinite(loss)
    if not finite.any():
        raise AnalysisError("loss", "no finite loss in the sweep (every run diverged); nothing to fit")
    excluded = tuple(float(x) for x in lr[~finite])
    lr_f, loss_f = lr[finite], loss[finite]
    lr_range = (float(lr_f.min()), float(lr_f.max()))
    best = int(np.argmin(loss_f))
    observed = (float(lr_f[best]), float(loss_f[best]))

    if np.unique(lr_f).size < _N_PARAMS:
        reason = (
            f"only {np.unique(lr_f).size} distinct learning rates have a finite loss; the quadratic needs {_N_PARAMS}"
        )
        return LRFit(
            optimal_lr=observed[0],
            optimal_loss=observed[1],
            method="observed_best",
            reason=reason,
            r2=math.nan,
            n_points=int(lr_f.size),
            coefficients=(math.nan, math.nan, math.nan),
            vertex_lr=math.nan,
            vertex_loss=math.nan,
            lr_range=lr_range,
            excluded_lrs=excluded,
        )

    u = np.log(lr_f)
    d2, d1, d0, m = _quadratic(u, loss_f)
    r2 = r_squared(loss_f, d2 * (u - m) ** 2 + d1 * (u - m) + d0)
    coefficients = (d2, d1 - 2.0 * d2 * m, d2 * m * m - d1 * m + d0)
    if d2 > 0.0:
        v_star = -d1 / (2.0 * d2)
        vertex_lr = math.exp(m + v_star)
        vertex_loss = d0 - d1 * d1 / (4.0 * d2)
    else:
        vertex_lr = vertex_loss = math.nan

    reasons: list[str] = []
    if not d2 > 0.0:
        reasons.append(f"the parabola opens downward or is flat (c2 = {d2:.4g} <= 0), so it has no minimum")
    if not r2 >= r2_threshold:
        reasons.append(f"R^2 = {r2:.4f} is below {r2_threshold}")
    # A vertex on the edge of the range (to rounding) counts as inside.
    if d2 > 0.0 and not (lr_range[0] * (1 - 1e-9) <= vertex_lr <= lr_range[1] * (1 + 1e-9)):
        reasons.append(
            f"the vertex lr {vertex_lr:.4g} lies outside the swept range [{lr_range[0]:.4g}, {lr_range[1]:.4g}]"
        )
    trusted = not reasons
    return LRFit(
        optimal_lr=vertex_lr if trusted else observed[0],
        optimal_loss=vertex_loss if trusted else observed[1],
        method="quadratic" if trusted else "observed_best",
        reason=None if trusted else "; ".join(reasons),
        r2=r2,
        n_points=int(lr_f.size),
        coefficients=coefficients,
        vertex_lr=vertex_lr,
        vertex_loss=vertex_loss,
        lr_range=lr_range,
        excluded_lrs=excluded,
    )
