"""Sensitivity of the optimal LR to the sweep size: k-subsets against the full fit."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hyperwatch.monitor.analysis import AnalysisError, lr_sensitivity


def bowl(u: np.ndarray) -> np.ndarray:
    """An exact parabola in u = ln(lr) with its vertex at u = 0 (lr = 1) and loss 3."""
    return 0.1 * u**2 + 3.0


def test_hand_computed_errors_for_a_four_point_sweep() -> None:
    # u = -3, -2, -1, 2: every 3-subset contains both sides of the vertex except {-3, -2, -1},
    # whose vertex (u = 0) is outside its range: it falls back to its best point u = -1.
    u = np.array([-3.0, -2.0, -1.0, 2.0])
    result = lr_sensitivity(np.exp(u), bowl(u))
    assert result.full_fit.method == "quadratic"
    assert result.full_fit.optimal_lr == pytest.approx(1.0, rel=1e-12)
    (row,) = result.rows
    assert (row.k, row.n_subsets, row.exhaustive, row.n_fallback, row.n_failed) == (3, 4, True, 1, 0)
    assert row.mean_rel_error_lr == pytest.approx((1 - math.exp(-1)) / 4, rel=1e-9)
    assert row.mean_rel_error_loss == pytest.approx((0.1 / 3.0) / 4, rel=1e-9)
    assert row.max_rel_error_lr == pytest.approx(1 - math.exp(-1), rel=1e-9)


def test_every_k_from_three_to_n_minus_one_with_all_subsets() -> None:
    rng = np.random.default_rng(11)
    u = np.linspace(-3.0, 3.0, 8)
    result = lr_sensitivity(np.exp(u), bowl(u) + rng.normal(0.0, 0.003, u.size))
    assert [r.k for r in result.rows] == [3, 4, 5, 6, 7]
    assert [r.n_subsets for r in result.rows] == [math.comb(8, k) for k in range(3, 8)]
    assert all(r.exhaustive for r in result.rows)
    # More points, closer to the full fit: the error with 7 points is below the error with 3.
    assert result.rows[-1].mean_rel_error_lr < result.rows[0].mean_rel_error_lr
    out = result.to_json()
    assert out["n_points"] == 8 and len(out["by_k"]) == 5


def test_subsets_are_sampled_beyond_the_limit_and_say_so() -> None:
    u = np.linspace(-3.0, 3.0, 9)
    result = lr_sensitivity(np.exp(u), bowl(u), max_subsets=20, seed=3)
    by_k = {r.k: r for r in result.rows}
    assert by_k[3].n_subsets == 20 and not by_k[3].exhaustive  # C(9, 3) = 84 > 20
    assert by_k[8].n_subsets == 9 and by_k[8].exhaustive  # C(9, 8) = 9 <= 20
    again = lr_sensitivity(np.exp(u), bowl(u), max_subsets=20, seed=3)
    assert again.rows == result.rows


def test_subsets_without_three_distinct_lrs_count_as_failed() -> None:
    lrs = np.exp(np.array([-1.0, -1.0, 0.0, 1.0, 1.0]))
    result = lr_sensitivity(lrs, bowl(np.log(lrs)))
    k3 = result.rows[0]
    # Subsets of 3 drawn from {a, a, b, c, c} with fewer than 3 distinct values: {a,a,b}, {a,a,c},
    # {b,c,c}, {a,c,c} = 1 + 2 + 1 + 2 = 6 of the 10.
    assert (k3.n_subsets, k3.n_failed) == (10, 6)


def test_too_few_points_are_refused() -> None:
    with pytest.raises(AnalysisError, match="at least 4") as info:
        lr_sensitivity([0.01, 0.02, 0.04, 0.08], [3.0, 2.9, 2.95, math.nan])
    assert info.value.field == "lr"


def test_max_subsets_is_validated() -> None:
    with pytest.raises(AnalysisError, match="max_subsets"):
        lr_sensitivity([0.01, 0.02, 0.04, 0.08], [3.0, 2.9, 2.95, 3.1], max_subsets=0)
