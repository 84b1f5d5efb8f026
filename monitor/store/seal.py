"""Sealing chunks of appended steps on whole columns: the chunk rows with their extremes at once.

A batch of new steps only (training's pattern) that reaches a chunk's last step seals that chunk in
every series it logs: 512 chunks at once for a one-step batch of 64 layers x 8 indicators. The
general path (:func:`compact.store_sealed`, then :func:`rollups.seal_rollups`) handles anything, one
Python tuple per point; this one handles that common case on numpy columns (issue 16: ~20 ms of
Python per 512-chunk seal, every 16th batch, on either database):

- the points of the sealed chunks are the hot points taken out of the store (rows of
  ``metric_points``, pending batches on PostgreSQL) and the batch's own points below the new
  boundaries; every chunk sealed is new (no row holds its key: it lies at or past the old boundary);
- a chunk whose steps are consecutive and whose tokens are all absent or linear in the step (what
  a constant batch size gives) is packed by numpy, all chunks of one shape as one record array, in
  exactly the layout :func:`chunks.encode` writes; any other chunk goes through :func:`chunks.encode`;
- a chunk row carries its minimum and maximum with their steps (revision 0014; :func:`chunks.summary`'s
  rule: the first point in (value, step) order is the minimum, in (-value, step) order the maximum;
  NaN never wins), computed from the same columns. Segments and rollups are left to
  :mod:`monitor.store.segments` and ``seal_rollups``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy.engine import Connection

from hyperwatch.hooks.columns import NULL_INT
from hyperwatch.monitor.store import chunks
from hyperwatch.monitor.store.compact import DELETE_RANGE_SQLITE, copy_chunks, take_hot
from hyperwatch.monitor.store.models import CHUNK_STEPS
from hyperwatch.monitor.store.rollups import extremes

_FIELDS = ("ids", "layer", "step", "tokens", "value")
_EXACT = 2.0**53
_TOKENS_MAX = 2**58  # linear tokens checked in int64 without overflow: |t0 + dt * 15| stays below 2^63
_READ_SQLITE = "SELECT name_id, layer, step, tokens, value FROM metric_points WHERE run_id = ?"
_DELETE_WINDOW_SQLITE = "DELETE FROM metric_points WHERE run_id = ? AND step >= ? AND step <= ?"


CODE_LAYER_BITS = 20


def series_code(name_id: Any, layer: Any) -> Any:
    """One integer per series key (name_id, layer): layers run from -1 to MAX_LAYER (< 2^20 - 1)."""
    return (name_id << CODE_LAYER_BITS) | (layer + 1)


@dataclass(frozen=True)
class Columns:
    """Key-sorted points (name id, layer, step, tokens with NULL_INT for none, value with NaN): the
    pending points taken back (:func:`pending.take`) and the points of the chunks a batch seals."""

    ids: np.ndarray
    layer: np.ndarray
    step: np.ndarray
    tokens: np.ndarray
    value: np.ndarray

    @classmethod
    def join(cls, parts: Sequence[Columns]) -> Columns:
        """``parts`` as one, key-sorted."""
        cat = cls.concat(parts)
        order = np.lexsort((cat.step, cat.layer, cat.ids))
        return cat.take(order)

    @classmethod
    def concat(cls, parts: Sequence[Columns]) -> Columns:
        """``parts`` as one, in their order."""
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls.empty()
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in _FIELDS))

    def __len__(self) -> int:
        return len(self.step)

    @classmethod
    def empty(cls) -> Columns:
        none = np.empty(0, dtype=np.int64)
        return cls(none, none, none, none, np.empty(0, dtype=np.float64))

    @classmethod
    def of_rows(cls, rows: Sequence[tuple[Any, ...]]) -> Columns:
        """From (name_id, layer, step, tokens or None, value or None) rows."""
        if not rows:
            return cls.empty()
        # one float64 matrix (None -> NaN) costs a third of per-column lists; exact while every
        # integer is below 2^53 (float64's exact integers), else the integers are taken as they are
        grid = np.array(rows, dtype=np.float64)
        ints = grid[:, :4]
        if np.all(np.abs(ints[~np.isnan(ints)]) < _EXACT):
            i64 = np.int64
            tokens = np.where(np.isnan(grid[:, 3]), NULL_INT, grid[:, 3]).astype(i64)
            return cls(
                grid[:, 0].astype(i64),
                grid[:, 1].astype(i64),
                grid[:, 2].astype(i64),
                tokens,
                np.ascontiguousarray(grid[:, 4]),
            )
        n, la, s, t, _v = zip(*rows)
        i64 = np.int64
        tokens = np.array([NULL_INT if x is None else x for x in t], dtype=i64)
        return cls(np.array(n, i64), np.array(la, i64), np.array(s, i64), tokens, grid[:, 4].copy())

    def take(self, keep: np.ndarray) -> Columns:
        return Columns(*(getattr(self, f)[keep] for f in _FIELDS))


def seal_appended(
    conn: Connection,
    run_id: int,
    ranges: list[tuple[int, int, int, int]],
    points: Columns,
    held: Sequence[Columns] | None = None,
) -> tuple[int, int, tuple[Columns, ...] | None]:
    """Seal the chunks of an all-new-steps batch; (hot rows taken from ``metric_points``, chunks written,
    the run's hot rows left when known: SQLite).

    ``ranges``: (name_id, layer, first step, last step) of the hot rows to take, one per series whose
    boundary moved and that had points before; ``points``: every other point of the sealed chunks
    (pending ones taken back, the batch's own below the new boundaries); ``held``: every hot row of the
    run now (SQLite: those this process holds, :mod:`.held`, and the batch's own just inserted), else
    they are read.
    """
    taken, left = _take_hot(conn, run_id, ranges, held)
    cols = Columns.join([points, taken]) if len(taken) else points
    if not len(cols.step):
        return len(taken), 0, left
    chunk = cols.step // CHUNK_STEPS
    new = np.ones(len(chunk), dtype=bool)
    new[1:] = (cols.ids[1:] != cols.ids[:-1]) | (cols.layer[1:] != cols.layer[:-1]) | (chunk[1:] != chunk[:-1])
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, len(chunk)))
    rows = _chunk_rows(run_id, cols, chunk, starts, counts)
    copy_chunks(conn, rows)
    return len(taken), len(rows), left


def _take_hot(
    conn: Connection, run_id: int, ranges: list[tuple[int, int, int, int]], held: Sequence[Columns] | None
) -> tuple[Columns, tuple[Columns, ...] | None]:
    """:func:`compact.take_hot` as columns, and the run's hot rows left (None: not known).

    SQLite: the run's hot rows (``held``, or one read of them all: about the rows a one-step batch's
    seal takes anyway, since every series it logs seals at once), those a range holds taken, and one
    delete of the ranges' steps when they hold no other row, else one per range."""
    if conn.dialect.name == "postgresql":
        return Columns.of_rows(take_hot(conn, run_id, ranges)), None
    if not ranges:
        return Columns.empty(), None if held is None else tuple(held)
    hot = Columns.concat(held) if held is not None else Columns.of_rows(read_hot(conn, run_id))
    lo, hi = min(r[2] for r in ranges), max(r[3] for r in ranges)
    want = np.array(ranges, dtype=np.int64)
    keys = series_code(want[:, 0], want[:, 1])
    order = np.argsort(keys)
    keys, first, last = keys[order], want[order, 2], want[order, 3]
    mine = series_code(hot.ids, hot.layer)
    at = np.minimum(np.searchsorted(keys, mine), len(keys) - 1)
    inside = (keys[at] == mine) & (hot.step >= first[at]) & (hot.step <= last[at])
    if np.array_equal(inside, (hot.step >= lo) & (hot.step <= hi)):
        conn.exec_driver_sql(_DELETE_WINDOW_SQLITE, (run_id, lo, hi))
    else:
        conn.exec_driver_sql(DELETE_RANGE_SQLITE, [(run_id, *r) for r in ranges])
    return hot.take(inside), (hot.take(~inside),)


def read_hot(conn: Connection, run_id: int) -> list[tuple[Any, ...]]:
    """SQLite: every hot row of the run, (name_id, layer, step, tokens, value)."""
    return list(conn.exec_driver_sql(_READ_SQLITE, (run_id,)).cursor.fetchall())


def _chunk_rows(
    run_id: int, cols: Columns, chunk: np.ndarray, starts: np.ndarray, counts: np.ndarray
) -> list[tuple[Any, ...]]:
    """``CHUNK_COLUMNS`` per chunk, in key order."""
    group = np.repeat(np.arange(len(starts)), counts)
    first_step = cols.step[starts]
    dense = cols.step[starts + counts - 1] - first_step == counts - 1
    null = cols.tokens == NULL_INT
    no_tokens = np.add.reduceat(null, starts) == counts
    # linear tokens: t0 + dt * (step - s0), dt from the first two points (0 for a single point)
    t0 = cols.tokens[starts]
    second = np.minimum(starts + 1, starts + counts - 1)
    span = np.maximum(cols.step[second] - first_step, 1)
    dt = (cols.tokens[second] - t0) // span
    small = (np.abs(cols.tokens) < _TOKENS_MAX) & ~null
    fits = np.add.reduceat(small, starts) == counts
    exact = cols.tokens == t0[group] + dt[group] * (cols.step - first_step[group])
    linear = fits & (np.add.reduceat(exact, starts) == counts) & ~no_tokens
    nonfinite = (counts - np.add.reduceat(np.isfinite(cols.value), starts)).tolist()
    fast = dense & (no_tokens | linear)
    blobs: list[bytes] = [b""] * len(starts)
    flags = np.where(no_tokens, chunks.DENSE | chunks.TOK_NONE, chunks.DENSE | chunks.TOK_LINEAR)
    for n in np.unique(counts[fast]).tolist():
        for flag in np.unique(flags[fast & (counts == n)]).tolist():
            which = np.flatnonzero(fast & (counts == n) & (flags == flag))
            blobs_of = _pack(cols, starts[which], n, flag, first_step[which], t0[which], dt[which])
            for i, blob in zip(which.tolist(), blobs_of, strict=True):
                blobs[i] = blob
    ids, layers, chunk_ids = cols.ids[starts].tolist(), cols.layer[starts].tolist(), chunk[starts].tolist()
    for i in np.flatnonzero(~fast).tolist():
        a, b = int(starts[i]), int(starts[i] + counts[i])
        pts = [
            (s, None if t == NULL_INT else t, None if v != v else v)
            for s, t, v in zip(cols.step[a:b].tolist(), cols.tokens[a:b].tolist(), cols.value[a:b].tolist())
        ]
        blobs[i] = chunks.encode(chunk_ids[i], pts)[0]
    extreme = _extremes(cols, starts, counts)
    return [(run_id, ids[i], layers[i], chunk_ids[i], nonfinite[i], blobs[i], *extreme[i]) for i in range(len(starts))]


def _pack(
    cols: Columns, starts: np.ndarray, n: int, flag: int, first: np.ndarray, t0: np.ndarray, dt: np.ndarray
) -> list[bytes]:
    """Dense chunks of ``n`` points with one token form, as :func:`chunks.encode` writes them."""
    fields: list[tuple[Any, ...]] = [("version", "<u1"), ("flags", "<u1"), ("n", "<u2"), ("offset", "<u2")]
    if flag & chunks.TOK_LINEAR:
        fields += [("t0", "<i8"), ("dt", "<i8")]
    fields.append(("values", "<f8", (n,)))
    rec = np.empty(len(starts), dtype=np.dtype(fields))
    rec["version"], rec["flags"], rec["n"] = chunks.VERSION, flag, n
    rec["offset"] = first % CHUNK_STEPS
    if flag & chunks.TOK_LINEAR:
        rec["t0"], rec["dt"] = t0, dt
    rec["values"] = cols.value[starts[:, None] + np.arange(n)]
    raw, size = rec.tobytes(), rec.dtype.itemsize
    return [raw[i * size : (i + 1) * size] for i in range(len(starts))]


def _extremes(cols: Columns, starts: np.ndarray, counts: np.ndarray) -> list[tuple[Any, ...]]:
    """(min step, min value, max step, max value) of each chunk; all None for NaN alone."""
    lows, highs = extremes(cols.value, np.repeat(np.arange(len(starts)), counts), starts)
    step, value = cols.step.tolist(), cols.value.tolist()
    out: list[tuple[Any, ...]] = []
    for lo, hi in zip(lows.tolist(), highs.tolist(), strict=True):
        if value[lo] != value[lo]:  # NaN first: the chunk holds NaN alone
            out.append((None, None, None, None))
        else:
            out.append((step[lo], value[lo], step[hi], value[hi]))
    return out
