"""Shared pieces of the analysis package: the error type, input checks and JSON encoding.

Everything here depends on numpy and the standard library only (plus ``hooks.schema`` for the
wire convention of non-finite numbers), so the CLI, the service and the web pages can share it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from hyperwatch.hooks.schema import encode_value

FloatArray = npt.NDArray[np.float64]
Floats = Sequence[float] | npt.NDArray[Any]
"""What the fits accept as a column of numbers: a list of floats or any numeric numpy array."""


class AnalysisError(ValueError):
    """Input that a fit cannot use; the message names the input and the fix.

    ``field`` is the name of the offending input (a column, an argument, a record key), so the
    API can turn it into a 4xx response naming the same field.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.detail = message


def as_float_array(values: Floats, field: str) -> FloatArray:
    """A 1-D float64 array of ``values``; rejects anything that is not a flat list of numbers."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise AnalysisError(field, f"must be a list of numbers ({exc}); convert the values to floats") from exc
    if arr.ndim != 1:
        raise AnalysisError(field, f"must be a flat list of numbers, got an array of shape {arr.shape}")
    return arr


def require_same_length(a: FloatArray, b: FloatArray, name_a: str, name_b: str) -> None:
    if a.shape != b.shape:
        raise AnalysisError(
            name_b,
            f"has {b.size} values but {name_a} has {a.size}; give one {name_b} per {name_a}",
        )


def jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON data; non-finite floats become "NaN"/"Infinity"/"-Infinity".

    ``json.dumps(jsonable(x), allow_nan=False)`` therefore never fails on a NaN and never writes
    the non-standard bare ``NaN`` literal.
    """
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return encode_value(float(obj))
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [jsonable(v) for v in obj.tolist()]
    if hasattr(obj, "to_json"):
        return obj.to_json()
    raise TypeError(f"cannot convert {type(obj).__name__} to JSON")


def rel_error(estimate: float, reference: float) -> float:
    """|estimate - reference| / |reference| (inf when the reference is 0 and they differ)."""
    if estimate == reference:
        return 0.0
    if reference == 0.0:
        return math.inf
    return abs(estimate - reference) / abs(reference)


def r_squared(y: FloatArray, y_hat: FloatArray) -> float:
    """Coefficient of determination; NaN when y has no variance (R^2 is undefined then)."""
    ss_res = float(np.sum((y - y_hat) ** 2))
    ss_tot = float(np.sum((y - np.mean(y)) ** 2))
    if ss_tot == 0.0:
        return math.nan
    return 1.0 - ss_res / ss_tot
