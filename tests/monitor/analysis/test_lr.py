"""Optimal LR of a sweep: exact vertex, recovery under noise, and each fallback."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hyperwatch.monitor.analysis import AnalysisError, fit_optimal_lr

LRS = 2.0 ** -np.arange(3, 12)  # 0.125 ... 0.00049, a typical base-2 sweep


def parabola(lr: np.ndarray, opt_lr: float, opt_loss: float, curvature: float = 0.05) -> np.ndarray:
    return curvature * (np.log(lr) - math.log(opt_lr)) ** 2 + opt_loss


def test_perfect_parabola_gives_its_exact_vertex() -> None:
    fit = fit_optimal_lr(LRS, parabola(LRS, 0.013, 2.875))
    assert fit.method == "quadratic" and fit.reason is None
    assert fit.optimal_lr == pytest.approx(0.013, rel=1e-10)
    assert fit.optimal_loss == pytest.approx(2.875, rel=1e-12)
    assert fit.r2 == pytest.approx(1.0, abs=1e-12)
    c2, c1, c0 = fit.coefficients
    u = math.log(0.013)
    assert (c2, c1, c0) == pytest.approx((0.05, -2 * 0.05 * u, 0.05 * u * u + 2.875), rel=1e-9)


def test_noisy_sweep_recovers_the_optimum_within_tolerance() -> None:
    rng = np.random.default_rng(1234)
    loss = parabola(LRS, 0.008, 3.1, curvature=0.08) + rng.normal(0.0, 0.002, LRS.size)
    fit = fit_optimal_lr(LRS, loss)
    assert fit.method == "quadratic"
    # 0.002 nats of noise on a 0.08-curvature bowl: the vertex moves by a few percent at most.
    assert fit.optimal_lr == pytest.approx(0.008, rel=0.05)
    assert fit.optimal_loss == pytest.approx(3.1, abs=0.005)
    assert fit.r2 > 0.99


def test_poor_fit_falls_back_to_observed_best() -> None:
    # A V shape with a kink is not a parabola in log(lr): R^2 < 0.99.
    u = np.log(LRS)
    loss = 3.0 + 0.3 * np.abs(u - math.log(0.01)) + 0.05 * np.sin(7 * u)
    fit = fit_optimal_lr(LRS, loss)
    assert fit.r2 < 0.99
    assert fit.method == "observed_best"
    assert "R^2" in (fit.reason or "")
    best = int(np.argmin(loss))
    assert (fit.optimal_lr, fit.optimal_loss) == (LRS[best], loss[best])


def test_downward_parabola_falls_back() -> None:
    loss = -parabola(LRS, 0.01, -5.0)  # a maximum at 0.01
    fit = fit_optimal_lr(LRS, loss)
    assert fit.method == "observed_best"
    assert "no minimum" in (fit.reason or "")
    assert math.isnan(fit.vertex_lr)
    assert fit.optimal_loss == loss.min()


def test_vertex_outside_the_swept_range_falls_back() -> None:
    loss = parabola(LRS, 1.0, 2.5)  # optimum far above the largest swept lr 0.125
    fit = fit_optimal_lr(LRS, loss)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.vertex_lr == pytest.approx(1.0, rel=1e-9)
    assert fit.method == "observed_best"
    assert "outside the swept range" in (fit.reason or "")
    assert fit.optimal_lr == LRS.max()


def test_custom_threshold_controls_the_fallback() -> None:
    rng = np.random.default_rng(7)
    loss = parabola(LRS, 0.01, 3.0) + rng.normal(0.0, 0.03, LRS.size)
    fit = fit_optimal_lr(LRS, loss, r2_threshold=0.5)
    assert fit.r2 < 0.99
    assert fit.method == "quadratic"
    assert fit_optimal_lr(LRS, loss).method == "observed_best"


def test_diverged_runs_are_excluded_and_listed() -> None:
    lrs = np.append(LRS, [0.5, 1.0])
    loss = np.append(parabola(LRS, 0.01, 3.0), [math.nan, math.inf])
    fit = fit_optimal_lr(lrs, loss)
    assert fit.method == "quadratic"
    assert fit.optimal_lr == pytest.approx(0.01, rel=1e-9)
    assert fit.n_points == LRS.size
    assert fit.excluded_lrs == (0.5, 1.0)
    assert fit.lr_range == (LRS.min(), LRS.max())
    assert fit.to_json()["excluded_lrs"] == [0.5, 1.0]


def test_too_few_finite_points_falls_back_with_reason() -> None:
    fit = fit_optimal_lr([0.01, 0.02, 0.04], [3.0, 2.9, math.nan])
    assert fit.method == "observed_best"
    assert "2 distinct learning rates" in (fit.reason or "")
    assert (fit.optimal_lr, fit.optimal_loss) == (0.02, 2.9)
    assert fit.to_json()["r2"] == "NaN"


@pytest.mark.parametrize(
    ("lrs", "losses", "field", "text"),
    [
        ([0.01, 0.02], [3.0, 2.9], "lr", "at least 3"),
        ([0.01, 0.01, 0.02, 0.02], [3.0, 2.9, 2.8, 2.7], "lr", "2 distinct"),
        ([0.01, -0.02, 0.04], [3.0, 2.9, 3.1], "lr", "positive and finite"),
        ([0.01, 0.02, 0.04], [3.0, 2.9], "loss", "give one loss per lr"),
        ([0.01, 0.02, 0.04], [math.nan, math.nan, math.inf], "loss", "no finite loss"),
    ],
)
def test_unfittable_input_is_refused(lrs: list[float], losses: list[float], field: str, text: str) -> None:
    with pytest.raises(AnalysisError, match=text) as info:
        fit_optimal_lr(lrs, losses)
    assert info.value.field == field


def test_threshold_is_validated() -> None:
    with pytest.raises(AnalysisError, match="r2_threshold"):
        fit_optimal_lr(LRS, parabola(LRS, 0.01, 3.0), r2_threshold=1.5)
