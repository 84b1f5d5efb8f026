"""The forecast's fit and band on synthetic power laws: exact recovery, coverage near the nominal level
over many seeds, the band widening away from the data, the threshold crossing, and the edge cases
(one or two sizes, NaN peaks, zeros, a non-monotone indicator, bad input)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hyperwatch.monitor.analysis import AnalysisError
from hyperwatch.monitor.analysis.forecast import SIGMA_FLOOR, fit_log_linear, fmt_size, fmt_value, forecast

SIZES = [1.5e5, 4.5e5, 1.0e6, 2.0e6, 3.3e6]


def law(x: float | np.ndarray, a: float = 0.02, b: float = 0.7) -> float | np.ndarray:
    return a * np.asarray(x) ** b


def test_an_exact_power_law_is_recovered_and_its_band_is_the_noise_floor() -> None:
    ys = [float(law(x)) for x in SIZES]
    f = forecast("attention_z", SIZES, ys, [f"r{i}" for i in range(5)], target=1e8, threshold=1000.0)
    assert f.fit is not None and f.reason is None
    assert f.fit.slope == pytest.approx(0.7, abs=1e-12) and math.exp(f.fit.intercept) == pytest.approx(0.02)
    assert f.fit.residual_sigma == pytest.approx(0.0, abs=1e-9) and f.fit.sigma == SIGMA_FLOOR
    assert f.predicted == pytest.approx(float(law(1e8)), rel=1e-9)
    u = np.log(SIZES)
    half = f.fit.t * SIGMA_FLOOR * math.sqrt(1 + 1 / 5 + (math.log(1e8) - u.mean()) ** 2 / np.sum((u - u.mean()) ** 2))
    assert (f.lower, f.upper) == pytest.approx((f.predicted * math.exp(-half), f.predicted * math.exp(half)))
    bare = forecast("attention_z", SIZES, ys, [f"r{i}" for i in range(5)], target=1e8, threshold=1000.0,
                    sigma_floor=0.0)  # fmt: skip
    assert bare.lower == pytest.approx(bare.predicted, rel=1e-6) and bare.upper == pytest.approx(bare.predicted)
    # 0.02 x^0.7 = 1000 at x = (5e4)^(1/0.7); without noise the band's edges cross there too
    assert f.crossing is not None and f.crossing.status == "crosses"
    assert f.crossing.size == pytest.approx(5e4 ** (1 / 0.7), rel=1e-9)
    assert f.crossing.earliest is not None and f.crossing.latest is not None
    assert f.crossing.earliest < f.crossing.size < f.crossing.latest
    assert bare.crossing is not None and bare.crossing.earliest == pytest.approx(f.crossing.size, rel=1e-6)
    assert bare.crossing.latest == pytest.approx(f.crossing.size, rel=1e-6)


@pytest.mark.parametrize(("n_sizes", "level", "far"), [(3, 0.9, 1.0), (4, 0.9, 30.0), (6, 0.8, 10.0), (8, 0.95, 100.0)])
def test_the_band_covers_a_new_run_at_its_nominal_level(n_sizes: int, level: float, far: float) -> None:
    """Over many seeds of a noisy power law (log-normal noise, sigma 0.25), the value of a new run at
    the target falls inside the band about ``level`` of the time, inside the data or far past it
    (the t band itself: no noise floor; with it, below)."""
    rng = np.random.default_rng(2026 + n_sizes)
    sizes = np.geomspace(1e6, 1e8, n_sizes)
    target = 1e8 * far if far > 1 else math.sqrt(1e6 * 1e8)
    seeds, inside = 3000, 0
    for _ in range(seeds):
        ys = law(sizes) * np.exp(rng.normal(0.0, 0.25, n_sizes))
        truth = float(law(target)) * math.exp(rng.normal(0.0, 0.25))
        f = forecast("attention_z", sizes.tolist(), ys.tolist(), [str(i) for i in range(n_sizes)], target=target,
                     level=level, sigma_floor=0.0)  # fmt: skip
        assert f.lower is not None and f.upper is not None
        inside += f.lower <= truth <= f.upper
    rate = inside / seeds
    se = math.sqrt(level * (1 - level) / seeds)
    assert abs(rate - level) < 4 * se, f"coverage {rate:.3f} for a nominal {level}"


@pytest.mark.parametrize("noise", [0.03, 0.3])
def test_with_the_noise_floor_the_band_covers_at_least_its_level(noise: float) -> None:
    """The floor only widens the band: below it (noise 0.03) coverage rises above the level, far above
    it (0.3) the floor seldom applies and coverage stays at the level."""
    rng = np.random.default_rng(11)
    sizes = np.geomspace(1e6, 1e8, 4)
    inside = 0
    for _ in range(2000):
        ys = law(sizes) * np.exp(rng.normal(0.0, noise, 4))
        truth = float(law(1e9)) * math.exp(rng.normal(0.0, noise))
        f = forecast("attention_z", sizes.tolist(), ys.tolist(), list("abcd"), target=1e9)
        assert f.lower is not None and f.upper is not None
        inside += f.lower <= truth <= f.upper
    rate = inside / 2000
    assert rate > 0.99 if noise < SIGMA_FLOOR else rate == pytest.approx(0.9, abs=0.03)


def test_the_band_widens_away_from_the_data_and_with_fewer_sizes() -> None:
    rng = np.random.default_rng(7)
    ys = (law(np.array(SIZES)) * np.exp(rng.normal(0, 0.1, len(SIZES)))).tolist()
    fit = fit_log_linear(SIZES, ys)
    centre = math.exp(np.mean(np.log(SIZES)))
    widths = []
    for x in (centre, 10 * max(SIZES), 100 * max(SIZES), 1000 * max(SIZES)):
        _, lo, hi = fit.band([x])
        widths.append(math.log(hi[0] / lo[0]))  # the band in ln y
    assert widths == sorted(widths) and widths[-1] > 2 * widths[0]
    three = fit_log_linear(SIZES[:3], ys[:3])
    assert three.t > 6.0 > fit.t  # t on 1 degree of freedom at 90%: 6.31


@pytest.mark.parametrize("n", [1, 2])
def test_one_or_two_sizes_are_not_enough_runs(n: int) -> None:
    f = forecast("attention_z", SIZES[:n], [100.0] * n, ["a", "b"][:n], target=1e9, threshold=1000.0)
    assert f.fit is None and f.predicted is None and f.crossing is None and f.curve() is None
    assert f.reason == f"not enough runs: {n} size{'s' if n > 1 else ''} with a finite, positive peak (need 3)"
    assert "not enough runs" in f.sentence()


def test_runs_at_one_size_count_once_and_the_worst_stands_for_it() -> None:
    f = forecast("attention_z", [1e6, 1e6, 1e6, 2e6], [100.0, 300.0, 200.0, 400.0], ["a", "b", "c", "d"])
    assert f.fit is None and "2 sizes" in (f.reason or "")
    assert [(p.size, p.value, p.runs) for p in f.points] == [(1e6, 300.0, ("a", "b", "c")), (2e6, 400.0, ("d",))]


def test_a_nan_peak_is_shown_and_left_out_of_the_fit() -> None:
    ys = [float(law(x)) for x in SIZES]
    ys[2] = math.nan
    f = forecast("attention_z", SIZES, ys, [f"d{i}" for i in range(5)], target=1e8, threshold=1000.0)
    nan = [p for p in f.points if not p.used]
    assert len(nan) == 1 and nan[0].runs == ("d2",) and math.isnan(nan[0].value)
    assert nan[0].reason is not None and nan[0].reason.startswith("peak is NaN: the run diverged")
    assert f.fit is not None and f.fit.n == 4 and f.fit.slope == pytest.approx(0.7)
    assert "left out: d2 (peak is NaN)" in f.sentence()
    body = f.to_json()
    json.dumps(body, allow_nan=False)  # NaN travels as the string "NaN", never a bare literal
    assert body["points"][2]["value"] == "NaN" and body["points"][2]["used"] is False
    # a run with a NaN among runs at the same size: NaN stands for the size
    g = forecast("attention_z", [1e6, 1e6, 2e6, 4e6], [100.0, math.nan, 200.0, 300.0], ["a", "b", "c", "d"])
    assert math.isnan(g.points[0].value) and g.fit is None
    # too few finite sizes left: not enough runs, and says which were left out
    h = forecast("attention_z", SIZES[:3], [1.0, math.inf, 2.0], ["a", "b", "c"])
    assert h.fit is None and h.sentence() == (
        "peak attention Z: not enough runs: 2 sizes with a finite, positive peak (need 3); "
        "left out: b (peak is Infinity)."
    )


def test_a_zero_value_cannot_sit_on_a_power_law() -> None:
    f = forecast("mlp_outlier_ratio", SIZES[:4], [0.0, 1e-4, 2e-4, 4e-4], ["a", "b", "c", "d"])
    assert f.points[0].reason == "peak is 0: a power law never reaches 0 or below"
    assert f.fit is not None and f.fit.n == 3


def test_a_non_monotone_indicator_gets_a_wide_band_and_an_uncertain_crossing() -> None:
    sizes = [1e6, 2e6, 4e6, 8e6]
    f = forecast("attention_z", sizes, [100.0, 400.0, 150.0, 500.0], list("abcd"), target=1e9, threshold=1000.0)
    assert f.fit is not None and f.lower is not None and f.upper is not None
    assert f.upper / f.lower > 1000  # the zig-zag leaves the slope unknown: the band says so
    for x, y in zip(sizes, [100.0, 400.0, 150.0, 500.0], strict=True):  # and holds every size trained
        _, lo, hi = f.fit.band([x])
        assert lo[0] < y < hi[0]
    assert f.crossing is not None and f.crossing.latest is None  # the lower edge never gets there
    assert "beyond 1,000x the largest size fitted" in f.sentence()


def test_crossing_above_already_and_never() -> None:
    above = forecast("attention_z", SIZES, [2000.0 * (x / 1e5) ** 0.1 for x in SIZES], list("abcde"), threshold=1000)
    assert above.crossing is not None and above.crossing.status == "above" and above.crossing.size is None
    assert "already above 1,000 at the smallest size fitted (150K params)" in above.sentence()
    falling = forecast("attention_z", SIZES, [55.0, 44.0, 38.0, 35.0, 33.0], list("abcde"), threshold=1000, target=1e9)
    assert falling.crossing is not None and falling.crossing.status == "never"
    assert falling.crossing.earliest is None and falling.crossing.horizon == pytest.approx(3.3e9)
    assert "does not cross 1,000 within 1,000x the largest size fitted" in falling.sentence()
    slow = forecast("attention_z", SIZES, [float(law(x, 0.02, 0.2)) for x in SIZES], list("abcde"), threshold=1000)
    assert slow.crossing is not None and slow.crossing.status == "never"  # 0.02 x^0.2 = 1000 at 3.1e23 > 3.3e9


def test_the_sentence_names_the_prediction_band_and_crossing() -> None:
    ys = [268.0, 560.0, 1079.0]
    f = forecast("attention_z", SIZES[:3], ys, ["d2", "d3", "d4"], target=3.3e6, threshold=1000.0)
    assert f.predicted is not None and f.lower is not None and f.upper is not None and f.crossing is not None
    assert f.sentence() == (
        f"peak attention Z: {fmt_value(f.predicted)} predicted at 3.3M params (90% band {fmt_value(f.lower)}-"
        f"{fmt_value(f.upper)}), crosses 1,000 at about {fmt_size(f.crossing.size or 0)} "
        f"(band {fmt_size(f.crossing.earliest or 0)}-{fmt_size(f.crossing.latest or 0)})."
    )
    far = forecast("attention_rms", SIZES[:3], ys, ["a", "b", "c"], target=1e9, axis="params")
    assert "; 1,000x past the largest size fitted, if the power law holds that far)" in far.sentence()
    assert "no threshold to cross (set attention_rms_limit on the group)" in far.sentence()


def test_bad_input_names_the_field() -> None:
    with pytest.raises(AnalysisError) as exc:
        forecast("attention_z", [1e6, -1.0, 3e6], [1.0, 2.0, 3.0], list("abc"))
    assert exc.value.field == "sizes[1]"
    with pytest.raises(AnalysisError) as exc:
        forecast("attention_z", SIZES[:3], [1.0, 2.0, 3.0], list("abc"), target=math.nan)
    assert exc.value.field == "target"
    with pytest.raises(AnalysisError) as exc:
        forecast("attention_z", SIZES[:3], [1.0, 2.0, 3.0], list("abc"), level=1.5)
    assert exc.value.field == "level"
    with pytest.raises(AnalysisError) as exc:
        forecast("attention_z", SIZES[:3], [1.0, 2.0], list("abc"))
    assert exc.value.field == "values"


def test_number_words() -> None:
    assert [fmt_value(v) for v in (1900.4, 268.2, 0.01234, 2.5e-5, 41_123_456.0, math.nan)] == [
        "1,900", "268", "0.0123", "2.5e-05", "41,100,000", "NaN"]  # fmt: skip
    assert [fmt_size(x) for x in (156_544, 999_999.9999, 1.3e9, 3.3e6)] == ["157K", "1M", "1.3B", "3.3M"]
    assert fmt_size(3.5e20, "flops") == "3.5e+20"
