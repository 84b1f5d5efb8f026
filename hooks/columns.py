"""A batch's points as numpy columns: how the service's hot path holds a batch (issue 16).

The wire format stays :class:`hooks.schema.Batch` (one JSON object per point). The service parses
it straight into one array per field instead of one Python object per point, and validates,
deduplicates and writes whole columns at once; :class:`PointColumns` is that form, shared by
whoever produces a batch (the ingest route, :meth:`PointColumns.from_points`) and whoever
consumes it (the store, the detectors).

Nulls of the integer columns are :data:`NULL_INT` (-1): a run-level point has no layer, a point
may have no token count, and neither can be negative on the wire. Values keep NaN and +-Inf as
IEEE values.

The same columns are also a compact HTTP body, ``Content-Type: application/vnd.hyperwatch.columns``
(:func:`encode_body`, :func:`decode_body`), which the HTTP sink sends when the service reads it.
Little-endian, 36 bytes per point against ~94 in JSON, and no per-point parsing on either side::

    b"HWC1"  uint32 points  uint32 header bytes (a multiple of 8 from the start of the body)
    header   UTF-8 JSON {"batch_id": .., "run": .., "names": [distinct names]}, space-padded
    int64 step[n]  float64 value[n]  int64 layer[n]  int64 tokens[n]  int32 name_index[n]

The header's fields follow the JSON wire format's rules; ``layer``/``tokens`` use -1 for none.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hyperwatch.hooks.schema import (
    MAX_LAYER,
    MAX_POINTS_PER_BATCH,
    MAX_STEP,
    Point,
    SchemaError,
    validate_name,
    validate_run_name,
)

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


COLUMNS_MEDIA_TYPE = "application/vnd.hyperwatch.columns"
_MAGIC = b"HWC1"
_HEAD = struct.Struct("<4sII")
_BYTES_PER_POINT = 4 * 8 + 4
_BATCH_ID = re.compile(r"[A-Za-z0-9_-]{8,64}")
# (column, little-endian dtype, lowest, highest) in body order; the bounds of the integer columns
_LAYOUT: tuple[tuple[str, str, int | None, int | None], ...] = (
    ("step", "<i8", 0, MAX_STEP),
    ("value", "<f8", None, None),
    ("layer", "<i8", NULL_INT, MAX_LAYER),
    ("tokens", "<i8", NULL_INT, MAX_STEP),
    ("name_index", "<i4", 0, None),
)


def encode_body(batch_id: str, run: str, columns: PointColumns) -> bytes:
    """The columns body of a batch (see the module doc)."""
    header = json.dumps({"batch_id": batch_id, "run": run, "names": list(columns.names)}).encode()
    header += b" " * (-(_HEAD.size + len(header)) % 8)
    parts = [_HEAD.pack(_MAGIC, len(columns), len(header)), header]
    parts += [np.ascontiguousarray(getattr(columns, name), dtype=dtype).tobytes() for name, dtype, _, _ in _LAYOUT]
    return b"".join(parts)


def decode_body(body: bytes) -> tuple[str, str, PointColumns]:
    """(batch_id, run, columns) of a columns body; a :class:`SchemaError` names the first bad field.

    Checks everything the JSON form checks: the batch id, the run name, every name, and the range
    of every integer of every point (vectorised; the message names the first bad point).
    """
    if len(body) < _HEAD.size or body[:4] != _MAGIC:
        raise SchemaError("body", f"a {COLUMNS_MEDIA_TYPE} body starts with {_MAGIC!r}; send JSON otherwise")
    _, n, head = _HEAD.unpack_from(body)
    if n > MAX_POINTS_PER_BATCH:
        raise SchemaError("points", f"has {n} points; the limit is {MAX_POINTS_PER_BATCH} per batch")
    want = _HEAD.size + head + n * _BYTES_PER_POINT
    if len(body) != want:
        raise SchemaError("body", f"{n} points and a {head}-byte header take {want} bytes, got {len(body)}")
    try:
        meta = json.loads(body[_HEAD.size : _HEAD.size + head])
    except (ValueError, RecursionError) as exc:
        raise SchemaError("header", f"must be UTF-8 JSON {{batch_id, run, names}}: {exc}") from exc
    if not isinstance(meta, dict) or set(meta) != {"batch_id", "run", "names"}:
        raise SchemaError("header", "must be a JSON object with exactly batch_id, run and names")
    batch_id, names = meta["batch_id"], meta["names"]
    if not isinstance(batch_id, str) or not _BATCH_ID.fullmatch(batch_id):
        raise SchemaError("batch_id", f"must be 8-64 characters of letters, digits, _ or -; got {batch_id!r}")
    run = validate_run_name(meta["run"])
    if not isinstance(names, list) or len(set(map(str, names))) != len(names):
        raise SchemaError("names", "must be a list of distinct metric names")
    for i, name in enumerate(names):
        validate_name(name, f"names.{i}")
    cols: dict[str, np.ndarray] = {}
    offset = _HEAD.size + head
    for name, dtype, lo, hi in _LAYOUT:
        col = np.frombuffer(body, dtype=dtype, count=n, offset=offset)
        offset += col.nbytes
        hi = len(names) - 1 if name == "name_index" else hi
        if lo is not None and hi is not None:
            bad = np.flatnonzero((col < lo) | (col > hi))
            if bad.size:
                i = int(bad[0])
                raise SchemaError(f"points.{i}.{name}", f"must be between {lo} and {hi}, got {int(col[i])}")
        cols[name] = col.astype(np.int32 if name == "name_index" else col.dtype.newbyteorder("="), copy=False)
    return batch_id, run, PointColumns(tuple(names), **cols)
