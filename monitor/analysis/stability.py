"""Transferable stability: is each indicator bounded and non-increasing as the model grows?

The paper's headline claim (spec section 4) is that under HyperP every stability indicator
(attention Z, router Z, branch RMS, outlier %, MaxVio) stays bounded and does not increase with
scale. This module turns a group of runs at several scales into that verdict, per indicator, for
two summaries of each run's series: its peak (the largest value over steps) and its final value.

Rules, for each summary ordered by scale:
- bounded: every value is finite. A NaN or infinite peak is a training fact and breaks stability.
- non-increasing: each value is at most the previous scale's value plus
  ``rtol * |previous| + atol`` (default rtol 5%: plateaus within noise pass).
  Outlier ratios also have an absolute floor, :data:`ABS_FLOOR` (a single element is not a trend).
  The rise must also be larger than :data:`NOISE_K` times the run-to-run spread at the smaller scale
  (when several runs share a scale, the spread of their values is the noise a rise is read against;
  a spread at the larger scale is no excuse: one seed blowing up there is the break).
  Outlier ratios must, moreover, reach a meaningful level, :data:`LEVEL`, and grow by a clear
  factor, :data:`GROWTH` (2e-6 -> 3.2e-5, a few tens of elements per million, is not a break).
- ``breaks_at`` is the first scale that is non-finite or exceeds the previous one beyond tolerance.
When several runs share a scale (seeds, LRs), the worst of them (largest, non-finite first) stands
for the scale. An indicator seen at fewer than two scales is ``insufficient_scales`` unless it is
already non-finite.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from hyperwatch.hooks.schema import SchemaError, decode_value
from hyperwatch.monitor.analysis._common import AnalysisError, jsonable

DEFAULT_RTOL = 0.05

ABS_FLOOR: dict[str, float] = {"attention_outlier_ratio": 1e-5, "mlp_outlier_ratio": 1e-5}
"""The smallest absolute increase that counts, per indicator, whatever ``atol`` asks for less.

An outlier ratio is a count of elements over a count of elements: at 0 at one scale and one
element in 10^6 at the next, the rule above would say "breaks" on a single element (seen in the
demo's HyperP arm). A Gaussian's 5-sigma tail is 5.7e-7; 1e-5 (ten elements per million) is well
above that noise and far below the 1e-4..1e-3 ratios of a model whose outliers grow."""

LEVEL: dict[str, float] = {"attention_outlier_ratio": 1e-4, "mlp_outlier_ratio": 1e-4}
"""The value a rise must reach to count as a break, per indicator: one element in 10^4. A Gaussian's
5-sigma tail is 5.7e-7, 175x below; a model whose outliers grow reaches 1e-4..1e-3 (the demo's
baseline arm: 3.8e-6 at d=2, 1.3e-4 at d=4)."""

GROWTH: dict[str, float] = {"attention_outlier_ratio": 2.0, "mlp_outlier_ratio": 2.0}
"""The factor over the smaller size's value a rise must reach to count as a break, per indicator."""

NOISE_K = 2.0
"""A rise counts only when larger than this many times the run-to-run spread at the smaller scale."""

Verdict = Literal["transferable", "breaks", "insufficient_scales"]


@dataclass(frozen=True)
class SeriesVerdict:
    """One summary (peak or final) of one indicator across scales."""

    scales: tuple[float, ...]
    values: tuple[float, ...]
    bounded: bool
    non_increasing: bool
    breaks_at: float | None
    reason: str | None

    def to_json(self) -> dict[str, Any]:
        return jsonable(self.__dict__)


@dataclass(frozen=True)
class IndicatorVerdict:
    name: str
    peak: SeriesVerdict
    final: SeriesVerdict
    verdict: Verdict
    breaks_at: float | None
    runs: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return jsonable(self.__dict__)


@dataclass(frozen=True)
class StabilityReport:
    indicators: tuple[IndicatorVerdict, ...]
    rtol: float
    atol: float

    @property
    def transferable(self) -> bool:
        return bool(self.indicators) and all(i.verdict == "transferable" for i in self.indicators)

    def to_json(self) -> dict[str, Any]:
        return jsonable(
            {
                "transferable": self.transferable,
                "rtol": self.rtol,
                "atol": self.atol,
                "indicators": {i.name: i for i in self.indicators},
            }
        )


def _worst(values: Sequence[float]) -> float:
    """The value that stands for a scale: NaN before infinity before the largest finite value."""
    if any(math.isnan(v) for v in values):
        return math.nan
    return max(values)


def _spread(values: Sequence[float]) -> float:
    """The run-to-run noise at one scale: max - min of its runs' finite values (0 for one run)."""
    finite = [v for v in values if math.isfinite(v)]
    return max(finite) - min(finite) if len(finite) > 1 else 0.0


def _judge(
    scales: list[float],
    values: list[float],
    rtol: float,
    atol: float,
    noise: Sequence[float] | None = None,
    level: float = -math.inf,
    growth: float = 1.0,
) -> SeriesVerdict:
    finite = [math.isfinite(v) for v in values]
    noise = noise or [0.0] * len(values)

    def rises(i: int) -> bool:
        before, v = values[i - 1], values[i]
        margin = rtol * abs(before) + atol + NOISE_K * noise[i - 1]
        return v > before + margin and v >= level and (before <= 0 or v >= growth * before)

    increases = {i for i in range(1, len(values)) if finite[i - 1] and finite[i] and rises(i)}
    breaks_at: float | None = None
    reason: str | None = None
    for i, (s, v) in enumerate(zip(scales, values, strict=True)):
        if not finite[i]:
            breaks_at, reason = s, f"value {v} at scale {s:g} is not finite"
            break
        if i in increases:
            breaks_at = s
            reason = (
                f"{v:.6g} at scale {s:g} exceeds {values[i - 1]:.6g} at scale {scales[i - 1]:g} "
                "by more than the tolerance and the run-to-run spread"
                + (f", reaches {level:g} and grows {growth:g}x or more" if level > -math.inf else "")
            )
            break
    return SeriesVerdict(tuple(scales), tuple(values), all(finite), not increases, breaks_at, reason)


def _decode_series(raw: Any, where: str) -> list[float]:
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
        raise AnalysisError(where, "must be a list of values over steps (numbers or 'NaN'/'Infinity'/'-Infinity')")
    if not raw:
        raise AnalysisError(where, "is empty; give at least one value or leave the indicator out")
    try:
        return [decode_value(v, where) for v in raw]
    except SchemaError as exc:
        raise AnalysisError(exc.field, str(exc)[len(exc.field) + 2 :]) from exc


def stability_verdict(
    records: Sequence[Mapping[str, Any]], rtol: float = DEFAULT_RTOL, atol: float = 0.0
) -> StabilityReport:
    """Verdict per indicator from ``records`` = [{"run", "scale", "indicators": {name: [values]}}].

    ``scale`` is any positive size measure (parameters, depth, FLOPs); values are per logging step,
    numbers or the wire strings for non-finite values. Raises :class:`AnalysisError` naming the
    record and field for malformed input.
    """
    if not (math.isfinite(rtol) and rtol >= 0.0):
        raise AnalysisError("rtol", f"must be a finite number >= 0, got {rtol}; the default is {DEFAULT_RTOL}")
    if not (math.isfinite(atol) and atol >= 0.0):
        raise AnalysisError("atol", f"must be a finite number >= 0, got {atol}")
    if not records:
        raise AnalysisError("records", "no runs given; pass runs at two or more scales")
    # name -> scale -> [(run, peak, final)]
    table: dict[str, dict[float, list[tuple[str, float, float]]]] = {}
    for i, rec in enumerate(records):
        where = f"records[{i}]"
        if not isinstance(rec, Mapping):
            raise AnalysisError(where, f"must be an object with run, scale and indicators; got {type(rec).__name__}")
        missing = [k for k in ("run", "scale", "indicators") if k not in rec]
        if missing:
            raise AnalysisError(where, f"is missing {missing}; each run needs run, scale and indicators")
        run = rec["run"]
        if not isinstance(run, str) or not run:
            raise AnalysisError(f"{where}.run", f"must be a non-empty string, got {run!r}")
        scale = rec["scale"]
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (math.isfinite(scale) and scale > 0):
            raise AnalysisError(f"{where}.scale", f"must be a positive finite number (params, depth...), got {scale!r}")
        indicators = rec["indicators"]
        if not isinstance(indicators, Mapping):
            raise AnalysisError(f"{where}.indicators", "must be an object {name: [values over steps]}")
        for name, raw in indicators.items():
            series = _decode_series(raw, f"{where}.indicators.{name}")
            peak = float(np.max(series))  # NaN propagates: a NaN anywhere makes the peak NaN
            table.setdefault(str(name), {}).setdefault(float(scale), []).append((run, peak, series[-1]))

    verdicts = []
    for name in sorted(table):
        by_scale = table[name]
        scales = sorted(by_scale)
        peaks = [_worst([p for _, p, _ in by_scale[s]]) for s in scales]
        finals = [_worst([f for _, _, f in by_scale[s]]) for s in scales]
        tol = max(atol, ABS_FLOOR.get(name, 0.0))
        level, growth = LEVEL.get(name, -math.inf), GROWTH.get(name, 1.0)
        peak_noise = [_spread([p for _, p, _ in by_scale[s]]) for s in scales]
        final_noise = [_spread([f for _, _, f in by_scale[s]]) for s in scales]
        peak_v = _judge(scales, peaks, rtol, tol, peak_noise, level, growth)
        final_v = _judge(scales, finals, rtol, tol, final_noise, level, growth)
        breaks = [b for b in (peak_v.breaks_at, final_v.breaks_at) if b is not None]
        verdict: Verdict
        if breaks:
            verdict = "breaks"
        elif len(scales) < 2:
            verdict = "insufficient_scales"
        else:
            verdict = "transferable"
        runs = tuple(r for s in scales for r, _, _ in by_scale[s])
        verdicts.append(IndicatorVerdict(name, peak_v, final_v, verdict, min(breaks) if breaks else None, runs))
    return StabilityReport(tuple(verdicts), rtol, atol)
