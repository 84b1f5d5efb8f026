"""The forecast over training: where a run larger than its group's others should be at each fraction.

While the larger run trains, it is compared with what the smaller runs predict for its size *at the
same fraction of training*: at each fraction f of a grid, each smaller run's peak up to f (the rule
of the stability verdicts: a run's points whose (step + 1) / total_steps <= f), fitted across sizes
(:func:`.forecast.fit_log_linear`, the same band as the group's forecast) and evaluated at the larger
run's size. The grid starts at the verdicts' :data:`MIN_FRACTION` (early steps say little: every
size starts at the same Z) and a fraction needs :data:`.forecast.MIN_SIZES` smaller sizes that
reached it. Between grid points the band is interpolated linearly.

The alert (:func:`band_exits`) compares the larger run's value at each logged step with the upper
edge of the band of the peak at that step's fraction: a value above it means the run's peak is
above the band too. It fires once per episode: at a step above the edge whose previous logged step
was not (a non-finite value is left to the detectors' own ``nonfinite_value`` rule and changes no
episode).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from hyperwatch.monitor.analysis._common import FloatArray, jsonable
from hyperwatch.monitor.analysis.forecast import (
    DEFAULT_LEVEL,
    MIN_SIZES,
    SIGMA_FLOOR,
    fit_log_linear,
    fmt_size,
    fmt_value,
    label,
    size_points,
)

MIN_FRACTION = 0.1
"""Where the band over training starts (the stability verdicts wait for the same fraction)."""
GRID = np.round(np.arange(MIN_FRACTION, 1.0 + 1e-9, 0.02), 6)
_EPS = 1e-9

Standing = Literal["inside", "above", "below", "nonfinite", "waiting"]


@dataclass(frozen=True)
class Trajectory:
    """One run's line of an indicator against its fraction of training."""

    run: str
    size: float
    fraction: FloatArray
    value: FloatArray
    progress: float

    @classmethod
    def of(
        cls, run: str, size: float, steps: Sequence[int], values: Sequence[float], total_steps: int, progress: float
    ) -> Trajectory:
        fraction = (np.asarray(steps, dtype=np.float64) + 1.0) / float(total_steps)
        return cls(run, size, fraction, np.asarray(values, dtype=np.float64), progress)

    @property
    def running_peak(self) -> FloatArray:
        """The peak up to each point; a NaN stays (np.maximum propagates it): the peak is NaN from there."""
        return np.maximum.accumulate(self.value) if self.value.size else self.value

    def reached(self, fractions: FloatArray) -> npt.NDArray[np.bool_]:
        """Whether the run has a point at or before each fraction and has trained that far."""
        idx = np.searchsorted(self.fraction, fractions + _EPS, side="right") - 1
        return np.asarray((idx >= 0) & (fractions <= self.progress + _EPS))

    def peaks_at(self, fractions: FloatArray) -> FloatArray:
        """The peak up to each fraction (NaN where the run has not got that far, or its peak is NaN)."""
        out = np.full(fractions.shape, np.nan)
        ok = self.reached(fractions)
        if ok.any():
            idx = np.searchsorted(self.fraction, fractions + _EPS, side="right") - 1
            out[ok] = self.running_peak[idx[ok]]
        return out


@dataclass(frozen=True)
class TrackBand:
    """The forecast band of the peak at ``size`` over the fraction-of-training grid (NaN: no band there)."""

    name: str
    size: float
    level: float
    fraction: FloatArray
    predicted: FloatArray
    lower: FloatArray
    upper: FloatArray
    n_sizes: npt.NDArray[np.int64]

    def at(self, f: float) -> tuple[float, float, float] | None:
        """(predicted, lower, upper) at fraction ``f``, linear between grid points; None before the grid
        or where there is no band (too few smaller sizes got that far)."""
        if f < self.fraction[0] - _EPS:
            return None
        vals = [float(np.interp(f, self.fraction, a)) for a in (self.predicted, self.lower, self.upper)]
        if not all(math.isfinite(v) for v in vals):
            return None
        return vals[0], vals[1], vals[2]

    def sizes_at(self, f: float) -> int:
        """Smaller sizes the band at ``f`` stands on (those of the grid point at or before it)."""
        j = int(np.searchsorted(self.fraction, f + _EPS, side="right")) - 1
        return int(self.n_sizes[min(max(j, 0), len(self.fraction) - 1)])

    def to_json(self) -> dict[str, Any]:
        return jsonable(
            {
                "fraction": self.fraction,
                "predicted": [None if math.isnan(v) else v for v in self.predicted.tolist()],
                "lower": [None if math.isnan(v) else v for v in self.lower.tolist()],
                "upper": [None if math.isnan(v) else v for v in self.upper.tolist()],
                "n_sizes": self.n_sizes,
            }
        )


def track_band(
    name: str,
    trajectories: Sequence[Trajectory],
    size: float,
    level: float = DEFAULT_LEVEL,
    grid: FloatArray = GRID,
    sigma_floor: float = SIGMA_FLOOR,
) -> TrackBand:
    """The band of ``name``'s peak at ``size`` over ``grid`` from the smaller runs' ``trajectories``."""
    n = len(grid)
    predicted, lower, upper = (np.full(n, np.nan) for _ in range(3))
    counts = np.zeros(n, dtype=np.int64)
    peaks = [t.peaks_at(grid) for t in trajectories]
    reached = [t.reached(grid) for t in trajectories]
    for j in range(n):
        # a run that got this far takes part with its peak (a NaN one is shown as left out by size_points)
        members = [(t.size, p[j], t.run) for t, p, r in zip(trajectories, peaks, reached, strict=True) if r[j]]
        if not members:
            continue
        points = size_points([m[0] for m in members], [m[1] for m in members], [m[2] for m in members])
        used = [p for p in points if p.used]
        counts[j] = len(used)
        if len(used) < MIN_SIZES:
            continue
        fit = fit_log_linear([p.size for p in used], [p.value for p in used], level, sigma_floor)
        c, lo, hi = fit.band([size])
        predicted[j], lower[j], upper[j] = c[0], lo[0], hi[0]
    return TrackBand(name, size, level, np.asarray(grid, dtype=np.float64), predicted, lower, upper, counts)


@dataclass(frozen=True)
class Position:
    """Where the larger run stands now: its peak so far against the band at its fraction of training."""

    fraction: float
    peak: float
    value: float
    band: tuple[float, float, float] | None
    standing: Standing

    def to_json(self) -> dict[str, Any]:
        predicted, lower, upper = self.band if self.band is not None else (None, None, None)
        return jsonable(
            {
                "fraction": self.fraction,
                "peak": self.peak,
                "value": self.value,
                "predicted": predicted,
                "lower": lower,
                "upper": upper,
                "standing": self.standing,
            }
        )


def position(band: TrackBand, run: Trajectory) -> Position | None:
    """The run's standing at its latest point (None when it has no point)."""
    if not run.value.size:
        return None
    f, peak, value = float(run.fraction[-1]), float(run.running_peak[-1]), float(run.value[-1])
    at = band.at(f)
    standing: Standing
    if not math.isfinite(peak):
        standing = "nonfinite"
    elif at is None:
        standing = "waiting"
    else:
        standing = "above" if peak > at[2] else ("below" if peak < at[1] else "inside")
    return Position(f, peak, value, at, standing)


def position_sentence(band: TrackBand, pos: Position | None, unit_size: str) -> str:
    """ "peak attention Z at 42% of training: 640 so far, inside the 90% band 380-900 forecast for
    1.9M params from 4 smaller runs (predicted 590)." """
    head = f"peak {label(band.name)}"
    if pos is None:
        return f"{head}: no point yet."
    at = f"{head} at {pos.fraction:.0%} of training: {fmt_value(pos.peak)} so far"
    if pos.standing == "nonfinite":
        return f"{at} (the run diverged)."
    if pos.band is None:
        if pos.fraction < band.fraction[0]:
            return f"{at}; the forecast band starts at {band.fraction[0]:.0%} of training."
        n = band.sizes_at(pos.fraction)
        return f"{at}; no band here: {n} smaller size(s) got this far (need {MIN_SIZES})."
    predicted, lower, upper = pos.band
    n = band.sizes_at(pos.fraction)
    return (
        f"{at}, {pos.standing} the {band.level:.0%} band {fmt_value(lower)}-{fmt_value(upper)} forecast for "
        f"{fmt_size(band.size)} {unit_size} from {n} smaller sizes (predicted {fmt_value(predicted)})."
    )


def band_exits(
    band: TrackBand,
    total_steps: int,
    steps: Sequence[int],
    values: Sequence[float],
    before: tuple[int, float] | None = None,
) -> list[tuple[int, float, float]]:
    """(step, value, upper edge) where the run's value leaves the band upward, once per episode.

    ``steps``/``values`` are the run's logged steps in ascending order with its value there (over
    layers as the band's runs were aggregated); ``before`` the logged step just before them, which
    says whether an episode is already under way.
    """
    out: list[tuple[int, float, float]] = []

    def above(step: int, value: float) -> bool | None:
        if not math.isfinite(value):
            return None
        at = band.at((step + 1) / total_steps)
        return at is not None and value > at[2]

    inside_episode = bool(before is not None and above(*before))
    for step, value in zip(steps, values, strict=True):
        now = above(step, value)
        if now is None:
            continue
        if now and not inside_episode:
            at = band.at((step + 1) / total_steps)
            assert at is not None
            out.append((step, value, at[2]))
        inside_episode = now
    return out
