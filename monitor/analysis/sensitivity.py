"""Sensitivity of the optimal-LR fit to the number of sweep points (spec section 5).

For an n-point LR sweep, fit every k-point subset (k from 3, the quadratic's parameter count, to
n - 1) with the same procedure as the full sweep, fallbacks included, and report for each k the
mean relative error of the optimal LR and of the optimal loss against the full sweep's fit. The
answer to "how many LRs must I sweep?" is the smallest k whose errors are acceptable.

Every subset is fitted while C(n, k) is at most ``max_subsets``; beyond that a uniform random
sample of that many distinct subsets is fitted (seeded, so the result is reproducible) and the row
says ``exhaustive: false``. Subsets that cannot be fitted (fewer than 3 distinct LRs with a finite
loss) are counted in ``n_failed`` and left out of the means.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from hyperwatch.monitor.analysis._common import AnalysisError, Floats, as_float_array, jsonable, rel_error
from hyperwatch.monitor.analysis.lr import R2_THRESHOLD, LRFit, fit_optimal_lr

MIN_K = 3
DEFAULT_MAX_SUBSETS = 20_000


@dataclass(frozen=True)
class SensitivityRow:
    k: int
    n_subsets: int
    exhaustive: bool
    n_fallback: int
    n_failed: int
    mean_rel_error_lr: float
    mean_rel_error_loss: float
    max_rel_error_lr: float
    max_rel_error_loss: float

    def to_json(self) -> dict[str, Any]:
        return jsonable(self.__dict__)


@dataclass(frozen=True)
class Sensitivity:
    full_fit: LRFit
    rows: tuple[SensitivityRow, ...]

    def to_json(self) -> dict[str, Any]:
        return jsonable({"full_fit": self.full_fit, "n_points": self.full_fit.n_points, "by_k": list(self.rows)})


def _subsets(n: int, k: int, limit: int, rng: np.random.Generator) -> tuple[Iterator[tuple[int, ...]], bool]:
    if math.comb(n, k) <= limit:
        return itertools.combinations(range(n), k), True
    seen: set[tuple[int, ...]] = set()
    while len(seen) < limit:
        seen.add(tuple(sorted(rng.choice(n, size=k, replace=False).tolist())))
    return iter(sorted(seen)), False


def lr_sensitivity(
    lrs: Floats,
    losses: Floats,
    max_subsets: int = DEFAULT_MAX_SUBSETS,
    seed: int = 0,
    r2_threshold: float = R2_THRESHOLD,
) -> Sensitivity:
    """Mean relative error of optimal LR and loss of k-point subsets against the full sweep's fit.

    Runs with a non-finite loss are left out of the full fit (as :func:`fit_optimal_lr` does) and
    of the subsets. Raises :class:`AnalysisError` when fewer than 4 finite points remain (there
    would be no k between 3 and n - 1).
    """
    if isinstance(max_subsets, bool) or not isinstance(max_subsets, int) or max_subsets < 1:
        raise AnalysisError("max_subsets", f"must be a positive integer, got {max_subsets!r}")
    lr = as_float_array(lrs, "lr")
    loss = as_float_array(losses, "loss")
    full = fit_optimal_lr(lr, loss, r2_threshold)
    finite = np.isfinite(loss)
    lr, loss = lr[finite], loss[finite]
    n = lr.size
    if n <= MIN_K:
        raise AnalysisError(
            "lr",
            f"{n} points with a finite loss; sensitivity needs at least {MIN_K + 1} (subsets of {MIN_K} to n-1 points)",
        )
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(MIN_K, n):
        subsets, exhaustive = _subsets(n, k, max_subsets, rng)
        err_lr: list[float] = []
        err_loss: list[float] = []
        n_fallback = n_failed = n_total = 0
        for idx in subsets:
            n_total += 1
            sel = np.asarray(idx)
            try:
                fit = fit_optimal_lr(lr[sel], loss[sel], r2_threshold)
            except AnalysisError:
                n_failed += 1
                continue
            n_fallback += int(fit.method != "quadratic")
            err_lr.append(rel_error(fit.optimal_lr, full.optimal_lr))
            err_loss.append(rel_error(fit.optimal_loss, full.optimal_loss))
        rows.append(
            SensitivityRow(
                k=k,
                n_subsets=n_total,
                exhaustive=exhaustive,
                n_fallback=n_fallback,
                n_failed=n_failed,
                mean_rel_error_lr=float(np.mean(err_lr)) if err_lr else math.nan,
                mean_rel_error_loss=float(np.mean(err_loss)) if err_loss else math.nan,
                max_rel_error_lr=max(err_lr, default=math.nan),
                max_rel_error_loss=max(err_loss, default=math.nan),
            )
        )
    return Sensitivity(full_fit=full, rows=tuple(rows))
