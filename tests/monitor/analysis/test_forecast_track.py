"""The band over training of a run larger than its group's others, and the alert's episode rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hyperwatch.monitor.analysis.forecast import fit_log_linear
from hyperwatch.monitor.analysis.forecast_track import (
    GRID,
    MIN_FRACTION,
    Trajectory,
    band_exits,
    position,
    position_sentence,
    track_band,
)

SIZES = (1e6, 2e6, 4e6, 8e6)
STEPS = 100


def z(size: float, fraction: float) -> float:
    """A Z that grows over training and with size: 5 x^0.25 x (1 + fraction)."""
    return 5.0 * size**0.25 * (1.0 + fraction)


def trajectory(size: float, progress: float = 1.0, noise: float = 0.0, seed: int = 0) -> Trajectory:
    rng = np.random.default_rng(seed)
    steps = list(range(round(STEPS * progress)))
    values = [z(size, (s + 1) / STEPS) * math.exp(rng.normal(0, noise)) if noise else z(size, (s + 1) / STEPS)
              for s in steps]  # fmt: skip
    return Trajectory.of(f"d{size:g}", size, steps, values, STEPS, progress)


def test_the_peak_at_a_fraction_follows_the_verdicts_cut() -> None:
    t = Trajectory.of("r", 1e6, [0, 1, 2, 3], [5.0, 9.0, 7.0, math.nan], total_steps=4, progress=1.0)
    # points at fractions .25 .5 .75 1: the peak up to f counts the points with (step + 1) / 4 <= f
    got = t.peaks_at(np.array([0.1, 0.25, 0.6, 0.75, 1.0]))
    assert np.isnan(got[0]) and got[1:4].tolist() == [5.0, 9.0, 9.0] and np.isnan(got[4])  # NaN stays the peak
    half = Trajectory.of("r", 1e6, [0, 1], [5.0, 9.0], total_steps=4, progress=0.5)
    assert half.reached(np.array([0.5, 0.75])).tolist() == [True, False]


def test_the_band_at_each_fraction_is_the_fit_of_the_smaller_runs_peaks_there() -> None:
    runs = [trajectory(s, noise=0.05, seed=i) for i, s in enumerate(SIZES)]
    band = track_band("attention_z", runs, 64e6, level=0.9)
    assert band.fraction[0] == pytest.approx(MIN_FRACTION) and band.fraction[-1] == pytest.approx(1.0)
    j = int(np.argmin(abs(GRID - 0.5)))
    peaks = [t.peaks_at(np.array([GRID[j]]))[0] for t in runs]
    fit = fit_log_linear(SIZES, peaks, 0.9)
    c, lo, hi = fit.band([64e6])
    assert (band.predicted[j], band.lower[j], band.upper[j]) == pytest.approx((c[0], lo[0], hi[0]))
    assert band.n_sizes.tolist() == [4] * len(GRID)
    assert band.predicted[-1] > band.predicted[0]  # the band grows over training as Z does


def test_the_band_over_training_covers_a_larger_runs_peak_at_its_level() -> None:
    """Over seeds of noisy runs, a 64M run's peak up to each fraction lies inside the band forecast
    from 1M..8M about 90% of the time (averaged over the grid; the t band itself, without the floor)."""
    rates = []
    for seed in range(120):
        runs = [trajectory(s, noise=0.05, seed=10 * seed + i) for i, s in enumerate(SIZES)]
        band = track_band("attention_z", runs, 64e6, level=0.9, sigma_floor=0.0)
        truth = trajectory(64e6, noise=0.05, seed=10 * seed + 9).peaks_at(GRID)
        rates.append(np.mean((band.lower < truth) & (truth < band.upper)))
    assert float(np.mean(rates)) == pytest.approx(0.9, abs=0.03)
    # between grid points: linear; before the grid: no band
    assert band.at(0.05) is None
    mid = band.at(float((GRID[3] + GRID[4]) / 2))
    assert mid is not None and mid[0] == pytest.approx((band.predicted[3] + band.predicted[4]) / 2)


def test_fractions_reached_by_too_few_sizes_have_no_band() -> None:
    runs = [trajectory(1e6), trajectory(2e6), trajectory(4e6, progress=0.5)]
    band = track_band("attention_z", runs, 16e6)
    assert band.at(0.4) is not None and band.at(0.7) is None
    assert band.sizes_at(0.4) == 3 and band.sizes_at(0.7) == 2
    # a NaN peak leaves a size out from there on
    nan = Trajectory.of("nan", 4e6, [0, 30, 60], [10.0, math.nan, 12.0], STEPS, 1.0)
    band = track_band("attention_z", [trajectory(1e6), trajectory(2e6), nan], 16e6)
    assert band.at(0.2) is not None and band.at(0.5) is None


def test_the_larger_runs_standing_and_its_sentence() -> None:
    band = track_band("attention_z", [trajectory(s) for s in SIZES[:3]], 8e6, level=0.9)
    inside = trajectory(8e6, progress=0.42)
    pos = position(band, inside)
    assert pos is not None and pos.standing == "inside" and pos.fraction == pytest.approx(0.42)
    text = position_sentence(band, pos, "params")
    assert text.startswith(f"peak attention Z at 42% of training: {pos.peak:.3g} so far, inside the 90% band")
    assert text.endswith(f"forecast for 8M params from 3 smaller sizes (predicted {pos.band[0]:.3g}).")  # type: ignore[index]
    hot = Trajectory.of("hot", 8e6, list(range(42)), [10 * z(8e6, (s + 1) / STEPS) for s in range(42)], STEPS, 0.42)
    assert position(band, hot).standing == "above"  # type: ignore[union-attr]
    early = Trajectory.of("early", 8e6, [0, 1, 2], [1.0, 2.0, 3.0], STEPS, 0.03)
    waiting = position(band, early)
    assert waiting is not None and waiting.standing == "waiting"
    assert position_sentence(band, waiting, "params").endswith("the forecast band starts at 10% of training.")
    diverged = Trajectory.of("nan", 8e6, [10, 11], [1.0, math.nan], STEPS, 0.12)
    assert position(band, diverged).standing == "nonfinite"  # type: ignore[union-attr]


def test_an_alert_fires_once_per_episode_above_the_band() -> None:
    band = track_band("attention_z", [trajectory(s) for s in SIZES[:3]], 8e6)
    upper = {s: band.at((s + 1) / STEPS)[2] for s in range(10, 60)}  # type: ignore[index]
    steps = list(range(20, 40))
    above = {22, 23, 24, 30, 31}  # two episodes; step 27 is NaN (changes nothing)
    values = [upper[s] * (1.5 if s in above else 0.8) for s in steps]
    values[steps.index(27)] = math.nan
    exits = band_exits(band, STEPS, steps, values)
    assert [s for s, _, _ in exits] == [22, 30]
    assert exits[0][1] == pytest.approx(1.5 * upper[22]) and exits[0][2] == pytest.approx(upper[22])
    # the episode was already under way before this batch: no alert at its first step
    under_way = band_exits(band, STEPS, steps[2:], values[2:], before=(21, 2 * upper[21]))  # the batch starts at 22
    assert [s for s, _, _ in under_way] == [30]
    assert [s for s, _, _ in band_exits(band, STEPS, steps[2:], values[2:], before=(21, upper[21] / 2))] == [22, 30]
    # a NaN between two steps above the band does not end the episode
    assert band_exits(band, STEPS, [40, 41, 42], [2 * upper[40], math.nan, 2 * upper[42]]) == [
        (40, 2 * upper[40], upper[40])
    ]
    # before the band starts nothing fires, whatever the value
    assert band_exits(band, STEPS, [0, 1, 2], [1e9, 1e9, 1e9]) == []
