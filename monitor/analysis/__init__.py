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

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from hyperwatch.monitor.analysis.stability import (
        IndicatorVerdict,
        SeriesVerdict,
        StabilityReport,
        stability_verdict,
    )

_HOME = {
    "AnalysisError": "hyperwatch.monitor.analysis._common",
    "jsonable": "hyperwatch.monitor.analysis._common",
    "CSVError": "hyperwatch.monitor.analysis.csvio",
    "Table": "hyperwatch.monitor.analysis.csvio",
    "read_csv": "hyperwatch.monitor.analysis.csvio",
    "GroupAnalysis": "hyperwatch.monitor.analysis.group",
    "RunPoint": "hyperwatch.monitor.analysis.group",
    "SweepFit": "hyperwatch.monitor.analysis.group",
    "TransferLaw": "hyperwatch.monitor.analysis.group",
    "fit_group": "hyperwatch.monitor.analysis.group",
    "parse_run": "hyperwatch.monitor.analysis.group",
    "R2_THRESHOLD": "hyperwatch.monitor.analysis.lr",
    "LRFit": "hyperwatch.monitor.analysis.lr",
    "fit_optimal_lr": "hyperwatch.monitor.analysis.lr",
    "PowerLawFit": "hyperwatch.monitor.analysis.powerlaw",
    "fit_power_law": "hyperwatch.monitor.analysis.powerlaw",
    "FLOOR_MIN_POINTS": "hyperwatch.monitor.analysis.scaling",
    "LeveragePoint": "hyperwatch.monitor.analysis.scaling",
    "ScalingComparison": "hyperwatch.monitor.analysis.scaling",
    "ScalingLawFit": "hyperwatch.monitor.analysis.scaling",
    "compare_methods": "hyperwatch.monitor.analysis.scaling",
    "fit_scaling_law": "hyperwatch.monitor.analysis.scaling",
    "leverage": "hyperwatch.monitor.analysis.scaling",
    "Sensitivity": "hyperwatch.monitor.analysis.sensitivity",
    "SensitivityRow": "hyperwatch.monitor.analysis.sensitivity",
    "lr_sensitivity": "hyperwatch.monitor.analysis.sensitivity",
    "IndicatorVerdict": "hyperwatch.monitor.analysis.stability",
    "SeriesVerdict": "hyperwatch.monitor.analysis.stability",
    "StabilityReport": "hyperwatch.monitor.analysis.stability",
    "stability_verdict": "hyperwatch.monitor.analysis.stability",
}
"""Where each public name lives: loaded on first use, so ``hyperwatch fit --help`` and the modules
that need only numpy (``.lr``, ``.stability``) import no scipy."""


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


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
