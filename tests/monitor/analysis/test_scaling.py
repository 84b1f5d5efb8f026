"""Scaling laws L = A C^-b + C0, their multi-start fit, and compute-efficiency leverage."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hyperwatch.monitor.analysis import AnalysisError, compare_methods, fit_scaling_law, leverage

FLOPS = np.logspace(15, 22, 8)  # the range the paper's ladders span


def law(c: np.ndarray, a: float, b: float, c0: float) -> np.ndarray:
    return a * c**-b + c0


def test_exact_law_is_recovered_with_a_in_original_units() -> None:
    fit = fit_scaling_law(FLOPS, law(FLOPS, 400.0, 0.15, 1.8))
    assert fit.converged and fit.c0 is not None
    assert fit.a == pytest.approx(400.0, rel=1e-6)
    assert fit.b == pytest.approx(0.15, rel=1e-6)
    assert fit.c0 == pytest.approx(1.8, rel=1e-6)
    assert fit.n_starts > 1 and fit.n_starts_converged >= 1
    assert fit.predict(1e18) == pytest.approx(law(np.array(1e18), 400.0, 0.15, 1.8), rel=1e-9)


def test_noisy_law_is_recovered_within_tolerance() -> None:
    rng = np.random.default_rng(2026)
    loss = law(FLOPS, 400.0, 0.15, 1.8) * (1 + rng.normal(0.0, 0.002, FLOPS.size))
    fit = fit_scaling_law(FLOPS, loss)
    # 0.2% loss noise over 7 decades: b within 5%, the floor within 0.05 nats.
    assert fit.b == pytest.approx(0.15, rel=0.05)
    assert fit.c0 == pytest.approx(1.8, abs=0.05)
    assert fit.r2 > 0.999


@pytest.mark.parametrize(("a", "b", "c0"), [(40.0, 0.08, 2.9), (1e4, 0.3, 0.5), (400.0, 0.15, 0.0)])
def test_laws_of_different_shapes_are_recovered_from_every_start(a: float, b: float, c0: float) -> None:
    # A floor close to the losses, a steep law and a law without floor: the grid of starts, on the
    # normalised FLOPs, agrees on the same minimum.
    fit = fit_scaling_law(FLOPS, law(FLOPS, a, b, c0))
    assert fit.b == pytest.approx(b, rel=1e-4)
    assert fit.c0 == pytest.approx(c0, abs=1e-4)
    assert fit.sse < 1e-12
    assert fit.n_starts_at_best == fit.n_starts
    assert ("C0" in fit.at_bounds) == (c0 == 0.0)


def test_fewer_than_five_points_use_the_law_without_floor() -> None:
    c = FLOPS[:4]
    fit = fit_scaling_law(c, 50.0 * c**-0.1)
    assert fit.c0 is None
    assert fit.to_json()["C0"] is None and fit.to_json()["form"] == "A*C^-b"
    assert fit.a == pytest.approx(50.0, rel=1e-6)
    assert fit.b == pytest.approx(0.1, rel=1e-6)


def test_floor_can_be_forced_either_way() -> None:
    loss = law(FLOPS, 400.0, 0.15, 1.8)
    assert fit_scaling_law(FLOPS, loss, floor=False).c0 is None
    assert fit_scaling_law(FLOPS[:4], loss[:4], floor=True).c0 is not None


def test_diverged_points_are_excluded_and_listed() -> None:
    loss = law(FLOPS, 400.0, 0.15, 1.8)
    loss[2] = math.nan
    fit = fit_scaling_law(FLOPS, loss)
    assert fit.n_points == 7
    assert fit.excluded_flops == (FLOPS[2],)
    assert fit.b == pytest.approx(0.15, rel=1e-5)


def test_leverage_equals_the_hand_computed_value() -> None:
    base = fit_scaling_law(FLOPS, law(FLOPS, 400.0, 0.15, 1.8))
    method = fit_scaling_law(FLOPS, law(FLOPS, 300.0, 0.15, 1.8))
    # 400 C_base^-0.15 = 300 C*^-0.15  =>  rho = C_base / C* = (4/3)^(1/0.15) at every budget.
    expected = (4.0 / 3.0) ** (1.0 / 0.15)
    points = leverage(method, base, [1e17, 1e20])
    for p in points:
        assert p.reason is None
        assert p.rho == pytest.approx(expected, rel=1e-5)
        assert p.baseline_flops == pytest.approx(expected * p.flops, rel=1e-5)


def test_leverage_without_floor_matches_the_closed_form() -> None:
    c = FLOPS[:4]
    base = fit_scaling_law(c, 60.0 * c**-0.1)
    method = fit_scaling_law(c, 50.0 * c**-0.12)
    budget = 1e18
    target = 50.0 * budget**-0.12
    expected = (target / 60.0) ** (-1 / 0.1) / budget
    assert leverage(method, base, [budget])[0].rho == pytest.approx(expected, rel=1e-5)


def test_leverage_is_nan_with_reason_below_the_baseline_floor() -> None:
    base = fit_scaling_law(FLOPS, law(FLOPS, 400.0, 0.15, 2.5))
    method = fit_scaling_law(FLOPS, law(FLOPS, 400.0, 0.15, 1.0))
    point = leverage(method, base, [1e22])[0]  # method reaches ~1.2 nats; the baseline never goes below 2.5
    assert math.isnan(point.rho) and math.isnan(point.baseline_flops)
    assert "floor" in (point.reason or "")
    assert point.to_json()["rho"] == "NaN"


def test_compare_methods_reduces_budgets_to_their_best_run() -> None:
    base = law(FLOPS, 400.0, 0.15, 1.8)
    better = law(FLOPS, 300.0, 0.15, 1.8)
    methods = ["muon"] * 8 + ["hyperp"] * 8 + ["hyperp"] * 8
    flops = np.concatenate([FLOPS, FLOPS, FLOPS])
    losses = np.concatenate([base, better, better + 0.3])  # a worse LR at every budget
    cmp = compare_methods(methods, flops, losses, baseline="muon")
    assert cmp.n_reduced == 8
    assert set(cmp.fits) == {"muon", "hyperp"} and set(cmp.leverage) == {"hyperp"}
    rhos = [p.rho for p in cmp.leverage["hyperp"]]  # type: ignore[union-attr]
    assert rhos == pytest.approx([(4.0 / 3.0) ** (1 / 0.15)] * 8, rel=1e-5)
    out = cmp.to_json()
    assert out["methods"]["hyperp"]["b"] == pytest.approx(0.15, rel=1e-5)


def test_compare_methods_reports_an_unfittable_method_and_keeps_the_rest() -> None:
    methods = ["muon"] * 8 + ["tiny"]
    flops = np.append(FLOPS, 1e18)
    losses = np.append(law(FLOPS, 400.0, 0.15, 1.8), 3.0)
    cmp = compare_methods(methods, flops, losses, baseline="muon")
    assert isinstance(cmp.fits["tiny"], str) and "1 distinct budgets" in cmp.fits["tiny"]
    assert cmp.to_json()["methods"]["tiny"]["error"].startswith("method 'tiny'")


def test_unknown_baseline_is_refused_naming_the_choices() -> None:
    with pytest.raises(AnalysisError, match=r"'adam' is not a method.*\['muon'\]") as info:
        compare_methods(["muon"] * 8, FLOPS, law(FLOPS, 400.0, 0.15, 1.8), baseline="adam")
    assert info.value.field == "baseline"


@pytest.mark.parametrize(
    ("flops", "losses", "field", "text"),
    [
        ([1e18, 0.0, 1e20], [3.0, 2.9, 2.8], "flops", "positive and finite"),
        ([1e18, 1e19, 1e20], [3.0, -2.9, 2.8], "loss", "positive losses"),
        ([1e18, 1e18, 1e18], [3.0, 2.9, 2.8], "flops", "1 distinct budgets"),
    ],
)
def test_bad_input_is_refused(flops: list[float], losses: list[float], field: str, text: str) -> None:
    with pytest.raises(AnalysisError, match=text) as info:
        fit_scaling_law(flops, losses)
    assert info.value.field == field
