"""A batch's points as numpy columns: how the service's hot path holds a batch (issue 16).

The wire format stays :class:`hooks.schema.Batch` (one JSON object per point). The service parses
it straight into one array per field instead of one Python object per point, and validates,
deduplicates and writes whole columns at once; :class:`PointColumns` is that form, shared by
whoever produces a batch (the ingest route, :meth:`PointColumns.from_points`) and whoever
consumes it (the store, the detectors).

Nulls of the integer columns are :data:`NULL_INT` (-1): a run-level point has no layer, a point
may have no token count, and neither can be negative on the wire. Values keep NaN and +-Inf as
IEEE values.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hyperwatch.hooks.schema import Point

NULL_INT = -1
"""``layer`` or ``tokens`` absent (None on the wire)."""


@dataclass(frozen=True, eq=False)
class PointColumns:
    """One batch's points, field by field; ``names[name_index[i]]`` is the name of point ``i``.

    ``names`` holds each distinct name once (first-seen order), so the name checks and the name
    ids of the store cost one look-up per distinct name, not one per point.
    """

    names: tuple[str, ...]
    name_index: np.ndarray  # int32, index into names
    step: np.ndarray  # int64
    value: np.ndarray  # float64
    layer: np.ndarray  # int64, NULL_INT = run level
    tokens: np.ndarray  # int64, NULL_INT = unknown

    def __post_init__(self) -> None:
        n = len(self.step)
        if not len(self.name_index) == len(self.value) == len(self.layer) == len(self.tokens) == n:
            raise ValueError("PointColumns: every column must have one entry per point")

    def __len__(self) -> int:
        return len(self.step)

    @classmethod
    def build(
        cls,
        names: Sequence[str],
        steps: Iterable[int],
        values: Iterable[float],
        layers: Iterable[int | None],
        tokens: Iterable[int | None],
    ) -> PointColumns:
        """Columns from per-point lists (None for a missing layer or token count)."""
        distinct = tuple(dict.fromkeys(names))
        code = {n: i for i, n in enumerate(distinct)}
        return cls(
            distinct,
            np.fromiter(map(code.__getitem__, names), np.int32, len(names)),
            np.array(list(steps), dtype=np.int64).reshape(-1),
            np.array(list(values), dtype=np.float64).reshape(-1),
            _nullable(layers),
            _nullable(tokens),
        )

    @classmethod
    def from_points(cls, points: Sequence[Point]) -> PointColumns:
        return cls.build(
            [p.name for p in points],
            [p.step for p in points],
            [p.value for p in points],
            [p.layer for p in points],
            [p.tokens for p in points],
        )

    @classmethod
    def of(cls, points: Sequence[Point] | PointColumns) -> PointColumns:
        return points if isinstance(points, PointColumns) else cls.from_points(points)

    def points(self, index: Any = None) -> list[Point]:
        """The points (all, or those at ``index``: an index array or a boolean mask) as :class:`Point`."""
        sel = slice(None) if index is None else index
        names = self.names
        return [
            Point(names[c], s, v, None if la < 0 else la, None if t < 0 else t)
            for c, s, v, la, t in zip(
                self.name_index[sel].tolist(),
                self.step[sel].tolist(),
                self.value[sel].tolist(),
                self.layer[sel].tolist(),
                self.tokens[sel].tolist(),
            )
        ]


def _nullable(values: Iterable[int | None]) -> np.ndarray:
    return np.array([NULL_INT if v is None else v for v in values], dtype=np.int64).reshape(-1)
