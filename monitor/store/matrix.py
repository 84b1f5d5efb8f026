"""A layer matrix (``Store.layer_matrix``): each layer's max per bucket over steps [lo, hi], NaN marking
a bucket that holds a NaN, for every layer of one metric name.

Buckets narrower than a rollup block (the run page's case: 1,000 steps in a few hundred buckets)
are read in two statements for all the name's layers together, the chunk and segment rows and the
hot points, each row decoded once to columns (:func:`monitor.store.chunks.steps_values`: no tokens,
no Python object per point) and reduced by numpy over whole columns. The numbers are those of the
per-layer algorithm (:func:`_per_layer`, which still reads wide buckets: rollups,
:func:`monitor.store.downsample.bucket_extremes`): each bucket's largest value, NaN if the bucket
holds one; between equal values (0.0 and -0.0) the earlier step's.

The rows' ``min``/``max`` columns are not read here: below a block's width a segment (256 to 1,024
steps) never lies in one bucket, and the at most 15 chunks of a series' tail decode in one numpy
view with their neighbours; wide buckets read the rollups (one row per segment) instead.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from sqlalchemy import text
from sqlalchemy.engine import Connection

from hyperwatch.monitor.store import chunks
from hyperwatch.monitor.store import downsample as ds
from hyperwatch.monitor.store.models import CHUNK_ROWS, CHUNK_STEPS, ROLLUP_LEVELS, SEGMENT_CHUNKS, hot_relation

Rows = list[list[float | None]]
MAX_SLOTS = 2_000_000
"""Most (layer, step) slots read in one go (columns of ~16 B each): a longer run's narrow read takes its
layers in groups, after the ends of each layer (``downsample.step_range``) fixed the buckets."""
_NAME = "run_id = :run_id AND name_id = :name_id AND layer >= :la AND layer <= :lb"


def read(
    conn: Connection, base: dict[str, Any], latest: dict[int, int], buckets: int
) -> tuple[int, int, int, Rows] | None:
    """(lo, bucket width, buckets, one row per layer of ``latest``, sorted) or None when no layer has a
    point in ``base``'s [start, end]. ``base``: run_id, name_id, start, end; ``latest``: layer -> its
    latest step (``series_latest``)."""
    layers = sorted(latest)
    if not layers:
        return None
    start, end = base["start"], base["end"]
    top = min(end, max(latest.values()))
    narrow = top < start or (
        -(-(top - start + 1) // buckets) < min(ROLLUP_LEVELS.values()) and (top - start + 1) * len(layers) <= MAX_SLOTS
    )
    if narrow:
        cols = columns(conn, base, layers)
        if cols is None:
            return None
        li, steps, values = cols
        lo, hi = int(steps.min()), int(steps.max())
        w = -(-(hi - lo + 1) // buckets)
        if w < min(ROLLUP_LEVELS.values()):
            n = (hi - lo) // w + 1
            return lo, w, n, _reduce(li, steps, values, lo, w, n, len(layers))
    ends = [e for e in (ds.step_range(conn, {**base, "layer": la}) for la in layers) if e is not None]
    if not ends:
        return None
    lo, hi = min(e[0][0] for e in ends), max(e[1][0] for e in ends)
    w = -(-(hi - lo + 1) // buckets)
    n = (hi - lo) // w + 1
    if w >= min(ROLLUP_LEVELS.values()):
        return lo, w, n, [_per_layer(conn, {**base, "layer": la}, lo, hi, w, n) for la in layers]
    rows: Rows = []
    per = max(1, MAX_SLOTS // (hi - lo + 1))  # layers read together: their columns stay under MAX_SLOTS
    for i in range(0, len(layers), per):
        group = layers[i : i + per]
        cols = columns(conn, {**base, "start": lo, "end": hi}, group)
        if cols is None:
            rows += [[None] * n for _ in group]
        else:
            rows += _reduce(*cols, lo, w, n, len(group))
    return lo, w, n, rows


def columns(
    conn: Connection, base: dict[str, Any], layers: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(index in ``layers``, step, value with NaN) of every point of those layers (sorted) of the name in
    [start, end], sorted by layer then step: the chunk and segment rows in one statement, the hot points
    in another; None when there is none."""
    start, end = base["start"], base["end"]
    p = {
        **base,
        "la": layers[0],
        "lb": layers[-1],
        "ca": start // CHUNK_STEPS // SEGMENT_CHUNKS * SEGMENT_CHUNKS,
        "cs": start // CHUNK_STEPS,
        "cb": end // CHUNK_STEPS,
    }
    # the rows that can hold [start, end]: from start's chunk on, and the segment of start's range, keyed
    # by the range's first chunk (a row keyed between them is a 16-step chunk wholly before start)
    sql = (
        f"SELECT layer, chunk, data FROM {CHUNK_ROWS} WHERE {_NAME} AND (chunk = :ca OR chunk >= :cs) AND chunk <= :cb"
    )
    found = conn.execute(text(sql), p).all()
    rows = [(int(c), bytes(d)) for _la, c, d in found]
    at, steps, values = chunks.steps_values(rows)
    li = np.asarray([la for la, _c, _d in found], dtype=np.int64)[at] if len(at) else at
    hot_rel = hot_relation(conn.dialect.name)
    sql = f"SELECT layer, step, value FROM {hot_rel} WHERE {_NAME} AND step >= :start AND step <= :end"
    hot = conn.execute(text(sql), p).all()
    if hot:
        hl, hs, hv = zip(*hot)
        li = np.concatenate((li, np.asarray(hl, dtype=np.int64)))
        steps = np.concatenate((steps, np.asarray(hs, dtype=np.int64)))
        values = np.concatenate((values, np.asarray(hv, dtype=np.float64)))  # NULL (NaN's SQL form) -> NaN
    index = np.full(layers[-1] + 2, -1, dtype=np.int64)  # layer -> its row; -1: not asked for
    index[layers] = np.arange(len(layers))
    li = index[np.clip(li, 0, layers[-1] + 1)]
    keep = (steps >= start) & (steps <= end) & (li >= 0)
    if not keep.any():
        return None
    li, steps, values = li[keep], steps[keep], values[keep]
    order = np.lexsort((steps, li))
    return li[order], steps[order], values[order]


def _reduce(li: np.ndarray, steps: np.ndarray, values: np.ndarray, lo: int, w: int, n: int, count: int) -> Rows:
    """One row per layer: each bucket's max over its non-NaN values (the earlier step's between equal
    ones), NaN where the bucket holds a NaN, None where it holds no point."""
    cell = li * n + (steps - lo) // w  # non-decreasing: sorted by layer, then step
    real = ~np.isnan(values)
    out = np.full(count * n, np.nan)
    filled = np.zeros(count * n, dtype=bool)
    rc, rv = cell[real], values[real]
    if len(rc):
        starts = np.flatnonzero(np.concatenate(([True], rc[1:] != rc[:-1])))
        top = np.maximum.reduceat(rv, starts)
        for j in np.flatnonzero(top == 0).tolist():  # 0.0 == -0.0: the earlier step's sign, as a sort would give
            stop = starts[j + 1] if j + 1 < len(starts) else len(rv)
            seg = rv[starts[j] : stop]
            top[j] = seg[np.flatnonzero(seg == 0)[0]]
        out[rc[starts]] = top
        filled[rc[starts]] = True
    nan_cells = cell[~real]
    out[nan_cells] = np.nan
    filled[nan_cells] = True
    rows: Rows = []
    for i in range(count):
        row: list[float | None] = out[i * n : (i + 1) * n].tolist()
        for j in np.flatnonzero(~filled[i * n : (i + 1) * n]).tolist():
            row[j] = None
        rows.append(row)
    return rows


def _per_layer(conn: Connection, p: dict[str, Any], lo: int, hi: int, w: int, n: int) -> list[float | None]:
    """One layer's row read on its own: the rollups for wide buckets (a block counts in the bucket of its
    first step), then every NaN/Inf point in the bucket of its own step."""
    row: list[float | None] = [None] * n
    for b, slot in ds.bucket_extremes(conn, p, lo, hi, w, ("max",)).items():
        v = slot["max"][2]
        row[b] = math.nan if v is None else float(v)
    for s, _t, v in ds.nonfinite(conn, p, lo, hi):
        b = (s - lo) // w
        cell = row[b]
        if v is None or cell is None or not math.isnan(cell):
            row[b] = math.nan if v is None else max(v, cell if cell is not None else -math.inf)
    return row
