"""Packing a series' sealed chunks into segments: one compressed ``metric_chunks`` row per aligned
range of ``SEGMENT_STEPS`` steps (issue 36; the blob: :mod:`monitor.store.segcodec`).

Layout, for a series whose sealed boundary (:func:`monitor.store.compact.boundary`) is ``B``:

- each whole range ``[s * SEGMENT_STEPS, (s + 1) * SEGMENT_STEPS)`` below ``B`` is one segment row
  (key: the range's first chunk; ``span`` = ``SEGMENT_CHUNKS``), and its level-2 rollup row (the
  finest level, ``ROLLUP_LEVELS``) is written with it, from the same columns;
- the open range (the one holding ``B``) is a partial segment row covering its first ``span``
  chunks, packed whenever ``B`` passes a multiple of ``PACK_STEPS`` and when the run stops running,
  then version-1 chunks of 16 steps (at most 15 after a pack), then the hot points. A stopped run's
  hot points are packed into that partial segment too (its span then reaches past ``B``, revision
  0021: :mod:`monitor.store.tail`).

Rows never overlap, and every row lies inside one aligned range, so a read of chunks ``[ca, cb]``
starts at ``ca``'s range's first chunk (:mod:`monitor.store.chunks`). A pack reads every row of a
range, merges them (and a batch's late points, which win), writes one row and deletes the others,
inside the batch's transaction, under its run's lock. A late point below ``B`` lands in the segment
row covering its chunk (rewritten), or in a whole sealed range without a row (a new segment); any
other late point rewrites its version-1 chunk (:mod:`monitor.store.compact`).

Tables (revision 0015, :class:`Tables`): whole segments go to ``metric_chunks``; a running run's
partial segments (and its version-1 chunks) to ``open_chunks``, which every pack churns; a stopped
run's partial segments to ``metric_chunks``. Keys never repeat across the two: a pack deletes its
ranges' rows from both before writing. Reads see both through the view ``chunk_rows``.

Cost (issue 36's workload, 512 series): a pack at every 256th step re-encodes the open range's
points, so each point is encoded ~2.5 times over its range's life, at ~0.06 s per million points.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from sqlalchemy import text
from sqlalchemy.engine import Connection

from hyperwatch.hooks.columns import NULL_INT
from hyperwatch.monitor.store import chunks, segcodec, toast
from hyperwatch.monitor.store.bulk import bulk_write, pg_array, read_in_ranges
from hyperwatch.monitor.store.chunks import (
    CHUNK_COLUMNS,
    CHUNK_KEY,
    CHUNK_SET,
    CHUNK_SET_0014,
    CHUNK_TYPES,
    SEGMENT_COLUMNS,
    SEGMENT_TYPES,
    Cand,
    seg_floor,
)
from hyperwatch.monitor.store.models import (
    CHUNK_ROWS,
    CHUNK_STEPS,
    OPEN_CHUNKS,
    PACK_STEPS,
    ROLLUP_LEVELS,
    SEGMENT_CHUNKS,
)
from hyperwatch.monitor.store.rollups import extremes

SeriesKey = tuple[int, int]
Target = tuple[int, int, int, int]  # name_id, layer, first chunk of the range, end chunk (exclusive)
PointRow = tuple[int, int, int, int | None, float | None]
Known = dict[SeriesKey, tuple[list[tuple[int, int]], list[Cand]]]
FINEST = min(ROLLUP_LEVELS)
assert ROLLUP_LEVELS[FINEST] == SEGMENT_CHUNKS * CHUNK_STEPS, "a whole segment is one finest rollup block"

_ROLLUP_COLUMNS = (
    "run_id", "name_id", "layer", "level", "block", "n_points",
    "min_step", "min_tokens", "min_value", "max_step", "max_tokens", "max_value",
)  # fmt: skip
_ROLLUP_TYPES = ("int",) * 4 + ("bigint", "int") + ("bigint", "bigint", "float8") * 2
_ROLLUP_KEY = ("run_id", "name_id", "layer", "level", "block")
_ROLLUP_SET = ", ".join(f"{c} = excluded.{c}" for c in _ROLLUP_COLUMNS[5:])
_DELETE_PG = (
    "DELETE FROM {} AS t USING unnest(%s::int[], %s::int[], %s::bigint[], %s::bigint[]) AS r(n, l, a, b) "
    "WHERE t.run_id = %s AND t.name_id = r.n AND t.layer = r.l AND t.chunk >= r.a AND t.chunk < r.b"
)
_DELETE_SQLITE = "DELETE FROM {} WHERE run_id = ? AND name_id = ? AND layer = ? AND chunk >= ? AND chunk < ?"


@dataclass(frozen=True)
class Tables:
    """Where a pack reads a range, writes its row and deletes the range's old rows (revision 0015:
    a running run's open ranges in ``open_chunks``, what no longer changes in ``metric_chunks``)."""

    read: str = CHUNK_ROWS
    whole: str = "metric_chunks"
    partial: str = OPEN_CHUNKS
    cleared: tuple[str, ...] = ("metric_chunks", OPEN_CHUNKS)
    split: bool = True  # blobs cut at the TOAST chunk size into data_ext + data (0016, store.toast)


RUNNING = Tables()
STOPPED = replace(RUNNING, partial="metric_chunks")
"""A run that stopped: its open ranges' partial segments are final until it runs again."""
ONE_TABLE = Tables("metric_chunks", "metric_chunks", "metric_chunks", ("metric_chunks",), split=False)
"""Revision 0014's layout (its migration packs through :func:`pack`)."""


def crossed(keys: Sequence[SeriesKey], before: Sequence[int], after: Sequence[int]) -> list[Target]:
    """The ranges to pack after sealed boundaries moved from ``before`` to ``after`` (step multiples of
    16): every whole range the move completes, and the open range when a multiple of ``PACK_STEPS``
    was passed inside it."""
    out: list[Target] = []
    for (n, la), eb, ea in zip(keys, before, after, strict=True):
        if ea // PACK_STEPS <= eb // PACK_STEPS:
            continue
        cb, ce = eb // CHUNK_STEPS, ea // CHUNK_STEPS
        for c0 in range(seg_floor(cb), ce, SEGMENT_CHUNKS):
            end = min(c0 + SEGMENT_CHUNKS, ce)
            if (
                end == c0 + SEGMENT_CHUNKS
                or (end * CHUNK_STEPS) // PACK_STEPS > max(cb, c0) * CHUNK_STEPS // PACK_STEPS
            ):
                out.append((n, la, c0, end))
    return out


def open_ranges(conn: Connection, run_id: int) -> list[Target]:
    """Every open range of the run with rows in ``open_chunks``."""
    sql = (
        f"SELECT DISTINCT c.name_id, c.layer, s.step FROM {OPEN_CHUNKS} c JOIN series_latest s "
        "ON s.run_id = c.run_id AND s.name_id = c.name_id AND s.layer = c.layer WHERE c.run_id = :r"
    )
    out: set[Target] = set()
    for n, la, latest in conn.execute(text(sql), {"r": run_id}):
        end = (int(latest) + 1) // CHUNK_STEPS
        if end > seg_floor(end):
            out.add((int(n), int(la), seg_floor(end), end))
    return sorted(out)


def pack(
    conn: Connection,
    run_id: int,
    targets: Sequence[Target],
    extra: Mapping[tuple[int, int, int], list[PointRow]] = {},
    tables: Tables = RUNNING,
    sealed: bool = True,
) -> Known:
    """Pack every row of each target range into one segment row (``extra``: points per target (name,
    layer, first chunk) that win over the stored ones). Writes the finest rollup row of each whole
    range; returns what the ranges given ``extra`` hold now (the rollups of late writes). ``sealed``
    False: the ranges reach past their series' sealed boundary (a stopped run's last steps,
    :mod:`monitor.store.tail`), so none is whole and none gets a rollup row."""
    if not targets:
        return {}
    found = read_in_ranges(
        conn, run_id, "t.chunk, t.data", tables.read, "chunk", "", [(n, la, a, b - 1) for n, la, a, b in targets]
    )
    at, steps, tokens, values, stored = _target_columns(targets, found, extra)
    starts = np.flatnonzero(np.r_[True, at[1:] != at[:-1]]) if len(at) else np.empty(0, dtype=np.int64)
    ends = np.r_[starts[1:], len(at)]
    lows, highs = extremes(values, np.repeat(np.arange(len(starts)), ends - starts), starts)
    nonfinite = (ends - starts - np.add.reduceat(np.isfinite(values), starts)).tolist() if len(at) else []
    rows: dict[str, list[tuple[Any, ...]]] = {tables.whole: [], tables.partial: []}
    rollup_rows: list[tuple[Any, ...]] = []
    known: Known = {}
    cut = toast.split_size(conn) if tables.split else 0
    for g, (t, a, b) in enumerate(zip(at[starts].tolist(), starts.tolist(), ends.tolist(), strict=True)):
        n, la, c0, end = targets[t]
        pts = steps[a:b], tokens[a:b], values[a:b]
        blob = segcodec.encode(c0 * CHUNK_STEPS, end - c0, *pts)
        lo, hi = int(lows[g]) - a, int(highs[g]) - a
        if math.isnan(pts[2][lo]):  # NaN alone
            summary: tuple[Any, ...] = (None,) * 4
            lo_hi: tuple[int | None, int | None] = (None, None)
        else:
            summary = (int(pts[0][lo]), float(pts[2][lo]), int(pts[0][hi]), float(pts[2][hi]))
            lo_hi = (lo, hi)
        whole = sealed and end - c0 == SEGMENT_CHUNKS
        data, ext = toast.split(blob, cut)
        row = (run_id, n, la, c0, nonfinite[g], data, *summary) + ((ext,) if tables.split else ())
        rows[tables.whole if whole else tables.partial].append(row)
        if whole:
            rollup_rows.append((run_id, n, la, FINEST, c0 // SEGMENT_CHUNKS, b - a, *_rollup(*pts, *lo_hi)))
        if (n, la, c0) in extra:
            known[(n, la)] = ([(c0, end - 1)], chunks.to_cands(*pts))
    for table in tables.cleared:
        delete(conn, run_id, [targets[t] for t in stored], table)
    cols, types, set_clause = (
        (SEGMENT_COLUMNS, SEGMENT_TYPES, CHUNK_SET) if tables.split else (CHUNK_COLUMNS, CHUNK_TYPES, CHUNK_SET_0014)
    )
    for table, written in rows.items():
        bulk_write(conn, table, cols, types, written, CHUNK_KEY, set_clause)
    bulk_write(conn, "metric_rollups", _ROLLUP_COLUMNS, _ROLLUP_TYPES, rollup_rows, _ROLLUP_KEY, _ROLLUP_SET)
    return known


def late_targets(
    conn: Connection, run_id: int, late: Sequence[tuple[int, int, int]], before: Mapping[SeriesKey, int]
) -> dict[tuple[int, int, int], Target]:
    """Which late chunks (name, layer, chunk below the boundary ``before`` sealed) belong to a segment
    row: one whose span holds them, or a whole sealed range (which gets one); chunk -> its range."""
    if not late:
        return {}
    firsts = sorted({(n, la, seg_floor(c)) for n, la, c in late})
    spans: dict[tuple[int, int, int], int] = {}
    for n, la, c, blob in read_in_ranges(
        conn, run_id, "t.chunk, t.data", CHUNK_ROWS, "chunk", "", [(n, la, c0, c0) for n, la, c0 in firsts]
    ):
        if segcodec.is_segment(bytes(blob[:1])):
            spans[(int(n), int(la), int(c))] = segcodec.span(bytes(blob[:8]))
    out: dict[tuple[int, int, int], Target] = {}
    for n, la, c in late:
        c0 = seg_floor(c)
        sealed = (before[(n, la)] + 1) // CHUNK_STEPS >= c0 + SEGMENT_CHUNKS
        span = SEGMENT_CHUNKS if sealed else spans.get((n, la, c0), 0)
        if c < c0 + span:
            out[(n, la, c)] = (n, la, c0, c0 + max(span, spans.get((n, la, c0), 0)))
    return out


def delete(conn: Connection, run_id: int, targets: Sequence[Target], table: str) -> None:
    """Delete every row of ``table`` in the target ranges."""
    if not targets:
        return
    if conn.dialect.name == "postgresql":
        types = ("int", "int", "bigint", "bigint")
        params = (*(pg_array(col, t) for col, t in zip(zip(*targets), types, strict=True)), run_id)
        conn.exec_driver_sql(_DELETE_PG.format(table), params)
    else:
        conn.exec_driver_sql(_DELETE_SQLITE.format(table), [(run_id, *t) for t in targets])


def _columns(rows: Sequence[PointRow]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    steps = np.array([r[2] for r in rows], dtype=np.int64)
    tokens = np.array([NULL_INT if r[3] is None else r[3] for r in rows], dtype=np.int64)
    values = np.array([np.nan if r[4] is None else r[4] for r in rows], dtype=np.float64)
    return steps, tokens, values


def _target_columns(
    targets: Sequence[Target], found: Sequence[tuple[Any, ...]], extra: Mapping[tuple[int, int, int], list[PointRow]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """(target index, step, tokens, value) of every point the targets' ranges hold now, sorted by target
    and step: the stored rows' points (all rows decoded at once: :func:`chunks.columns_of_rows`) and
    ``extra``'s, a later chunk's point winning a step two rows hold and ``extra``'s winning over both;
    and the indexes of the targets that have stored rows."""
    index = {t[:3]: i for i, t in enumerate(targets)}
    rows: list[tuple[int, bytes]] = []
    owners: list[int] = []
    for n, la, c, blob in found:
        rows.append((int(c), bytes(blob)))
        owners.append(index[(int(n), int(la), seg_floor(int(c)))])
    row_target = np.array(owners, dtype=np.int64)
    row_chunk = np.array([c for c, _b in rows], dtype=np.int64)
    at, steps, tokens, values = chunks.columns_of_rows(rows)
    target, rank = row_target[at], row_chunk[at]
    late = [(index[key], pts) for key, pts in extra.items() if pts and key in index]
    if late:
        cols = [_columns(pts) for _t, pts in late]
        target = np.concatenate([target, *(np.full(len(c[0]), t, dtype=np.int64) for (t, _p), c in zip(late, cols))])
        rank = np.concatenate([rank, np.full(sum(len(c[0]) for c in cols), np.iinfo(np.int64).max)])
        steps, tokens, values = (
            np.concatenate([col, *(c[i] for c in cols)]) for i, col in enumerate((steps, tokens, values))
        )
    order = np.lexsort((rank, steps, target))
    target, steps, tokens, values = target[order], steps[order], tokens[order], values[order]
    last = np.ones(len(steps), dtype=bool)  # the last of each (target, step): the winner
    last[:-1] = (steps[1:] != steps[:-1]) | (target[1:] != target[:-1])
    return target[last], steps[last], tokens[last], values[last], sorted(set(owners))


def _rollup(
    steps: np.ndarray, tokens: np.ndarray, values: np.ndarray, lo: int | None, hi: int | None
) -> tuple[Any, ...]:
    if lo is None or hi is None:
        return (None,) * 6

    def point(i: int) -> tuple[Any, ...]:
        t = int(tokens[i])
        return int(steps[i]), None if t == NULL_INT else t, float(values[i])

    return (*point(lo), *point(hi))
