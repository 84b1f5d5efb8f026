"""Power laws y = a x^b (+ c): recovery of known laws, leave-one-out error, refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hyperwatch.monitor.analysis import AnalysisError, fit_power_law

TOKENS = np.array([1.3e9, 2.6e9, 5.2e9, 1.04e10, 2.08e10, 4.16e10, 8.32e10])


def test_exact_power_law_is_recovered_in_original_units() -> None:
    y = 0.02 * (TOKENS / 1.04e10) ** -0.32  # the paper's LR-vs-tokens transfer law
    fit = fit_power_law(TOKENS, y)
    assert fit.converged and fit.c is None
    assert fit.b == pytest.approx(-0.32, rel=1e-8)
    assert fit.a == pytest.approx(0.02 * 1.04e10**0.32, rel=1e-7)
    assert fit.loo_mape == pytest.approx(0.0, abs=1e-6)
    assert fit.predict([1.04e10])[0] == pytest.approx(0.02, rel=1e-9)


def test_noisy_power_law_recovers_exponent_within_tolerance() -> None:
    rng = np.random.default_rng(42)
    y = 0.02 * (TOKENS / 1.04e10) ** -0.32 * (1 + rng.normal(0.0, 0.01, TOKENS.size))
    fit = fit_power_law(TOKENS, y)
    # 1% noise over 6 octaves: the exponent is known to about +-0.01.
    assert fit.b == pytest.approx(-0.32, abs=0.015)
    assert fit.predict([1.04e10])[0] == pytest.approx(0.02, rel=0.02)
    assert 0.0 < fit.loo_mape < 3.0
    assert fit.b_stderr > 0.0


def test_fit_is_least_squares_in_linear_space_not_loglog() -> None:
    rng = np.random.default_rng(3)
    y = 5.0 * TOKENS**-0.2 * (1 + rng.normal(0.0, 0.05, TOKENS.size))
    fit = fit_power_law(TOKENS, y)
    slope, intercept = np.polyfit(np.log(TOKENS), np.log(y), 1)
    sse_fit = float(np.sum((fit.predict(TOKENS) - y) ** 2))
    sse_loglog = float(np.sum((math.exp(intercept) * TOKENS**slope - y) ** 2))
    assert sse_fit < sse_loglog
    assert fit.b != pytest.approx(slope, rel=1e-6)


def test_leave_one_out_mape_matches_a_hand_refit() -> None:
    rng = np.random.default_rng(5)
    x = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    y = 3.0 * x**0.5 * (1 + rng.normal(0.0, 0.02, x.size))
    fit = fit_power_law(x, y)
    errors = []
    for i in range(x.size):
        keep = np.arange(x.size) != i
        sub = fit_power_law(x[keep], y[keep])
        errors.append(abs(sub.predict([x[i]])[0] - y[i]) / y[i])
        assert fit.loo_predictions[i] == pytest.approx(sub.predict([x[i]])[0], rel=1e-9)
    assert fit.loo_mape == pytest.approx(100 * np.mean(errors), rel=1e-9)


def test_irreducible_term_is_recovered() -> None:
    x = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0])
    rng = np.random.default_rng(9)
    y = 2.0 * x**-0.7 + 1.5 + rng.normal(0.0, 0.001, x.size)
    fit = fit_power_law(x, y, irreducible=True)
    assert fit.converged
    assert fit.a == pytest.approx(2.0, rel=0.02)
    assert fit.b == pytest.approx(-0.7, abs=0.03)
    assert fit.c == pytest.approx(1.5, abs=0.01)
    assert fit.to_json()["form"] == "a*x^b + c"


def test_two_points_fit_exactly_and_leave_one_out_is_undefined() -> None:
    fit = fit_power_law([8.0, 16.0], [0.02, 0.02 / math.sqrt(2)])
    assert fit.b == pytest.approx(-0.5, rel=1e-9)
    assert math.isnan(fit.loo_mape)
    assert "undefined" in (fit.note or "")
    assert fit.to_json()["loo_mape"] == "NaN"


@pytest.mark.parametrize(
    ("x", "y", "irreducible", "field", "text"),
    [
        ([1.0, 0.0, 2.0], [1.0, 2.0, 3.0], False, "x", "positive, finite x"),
        ([1.0, -2.0, 3.0], [1.0, 2.0, 3.0], False, "x", "positive, finite x"),
        ([1.0, 2.0, 3.0], [1.0, math.nan, 3.0], False, "y", "finite y"),
        ([1.0, 2.0, 3.0], [1.0, -2.0, 3.0], False, "y", "both signs"),
        ([1.0], [1.0], False, "x", "1 distinct x values"),
        ([1.0, 2.0], [1.0, 2.0], True, "x", "3 parameters"),
        ([1.0, 2.0], [1.0], False, "y", "give one y per x"),
    ],
)
def test_bad_input_is_refused(x: list[float], y: list[float], irreducible: bool, field: str, text: str) -> None:
    with pytest.raises(AnalysisError, match=text) as info:
        fit_power_law(x, y, irreducible=irreducible)
    assert info.value.field == field
