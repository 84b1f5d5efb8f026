"""Scaling analysis: the paper's fits, shared by the service, the web pages and ``hyperwatch fit``.

This package depends on numpy, scipy and the standard library only (and ``hooks.schema`` for the
wire spelling of non-finite numbers), so every consumer can import it without a web stack.

- :func:`fit_optimal_lr`: quadratic in log(lr), observed-best fallback (:mod:`.lr`)
- :func:`fit_power_law`: y = a x^b (+ c) in linear space, leave-one-out MAPE (:mod:`.powerlaw`)
- :func:`fit_scaling_law`, :func:`leverage`, :func:`compare_methods`: L = A C^-b + C0 (:mod:`.scaling`)
- :func:`lr_sensitivity`: k-subset errors of an LR sweep (:mod:`.sensitivity`)
- :func:`stability_verdict`: transferable stability across scales (:mod:`.stability`)
- :func:`fit_group`: all of the above for a group of stored runs (:mod:`.group`)
- :func:`.forecast.forecast`: an indicator at a size not trained yet, with its prediction band and
  threshold crossing (:mod:`.forecast`); the band over training of a larger run (:mod:`.forecast_track`)

Every result is a frozen dataclass with ``to_json()``; bad input raises :class:`AnalysisError`.
"""

from hyperwatch.monitor.analysis._common import AnalysisError, jsonable
from hyperwatch.monitor.analysis.csvio import CSVError, Table, read_csv
from hyperwatch.monitor.analysis.group import GroupAnalysis, RunPoint, SweepFit, TransferLaw, fit_group, parse_run
from hyperwatch.monitor.analysis.lr import R2_THRESHOLD, LRFit, fit_optimal_lr
from hyperwatch.monitor.analysis.powerlaw import PowerLawFit, fit_power_law
from hyperwatch.monitor.analysis.scaling import (
    FLOOR_MIN_POINTS,
    LeveragePoint,
    ScalingComparison,
    ScalingLawFit,
    compare_methods,
    fit_scaling_law,
    leverage,
)
from hyperwatch.monitor.analysis.sensitivity import Sensitivity, SensitivityRow, lr_sensitivity
from hyperwatch.monitor.analysis.stability import IndicatorVerdict, SeriesVerdict, StabilityReport, stability_verdict

__all__ = [
    "FLOOR_MIN_POINTS",
    "R2_THRESHOLD",
    "AnalysisError",
    "CSVError",
    "GroupAnalysis",
    "IndicatorVerdict",
    "LRFit",
    "LeveragePoint",
    "PowerLawFit",
    "RunPoint",
    "ScalingComparison",
    "ScalingLawFit",
    "Sensitivity",
    "SensitivityRow",
    "SeriesVerdict",
    "StabilityReport",
    "SweepFit",
    "Table",
    "TransferLaw",
    "compare_methods",
    "fit_group",
    "fit_optimal_lr",
    "fit_power_law",
    "fit_scaling_law",
    "jsonable",
    "leverage",
    "lr_sensitivity",
    "parse_run",
    "read_csv",
    "stability_verdict",
]
