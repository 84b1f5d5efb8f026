"""A stopped run's last, unsealed steps folded into its segments, and put back when it writes again (issue 36).

While a run trains, each series' steps from its sealed boundary ``B`` on (:func:`compact.boundary`: at
most 15 steps) are hot rows: ``metric_points``, and on PostgreSQL the pending arrays of
``point_batches``. When the run stops nothing seals them, so they would stay hot rows for good: a
row per point with its key and header (~60 bytes on SQLite, ~100 with its index entry on PostgreSQL)
where a segment spends ~5. On the real-hooks fixture of ``bench/storage.py`` (runs of 200 steps,
50-point series) they were 12% of SQLite's bytes.

:func:`seal_stopped` (at each stop: a status other than running) moves them into the
partial segment of their series' open range in ``metric_chunks``, packed with the open range in one
write, whose span then reaches past ``B`` (never a whole segment, never a rollup row: the range is not sealed).
Readers need nothing: every read of points takes the chunk rows and the hot rows of its range
together, and every reader of extremes takes the open range's chunk rows with their own min and max.

The writers assume the layout of a running run (every point at or past ``B`` hot), so before a
stopped run is written again its folded tails are put back (:func:`unfold`): a batch that reaches a
stopped run (a late flush) unfolds its own series, which then stay hot until the run's next stop, and
a run whose status returns to running gets all of them back. A folded row is told by its span: it
covers the chunk ``B // CHUNK_STEPS`` of its series' latest step. ``bench/stop_cost.py --against <the tree
before>`` (512 series stopped at step 300, then 40 one-step batches; ms, SQLite / PostgreSQL): the stop
87-88 / 95-98 against 45-47 / 53-56; the first batch after it 117-122 / 163-171 against 4 / 4-5; the next
ones 3.8 / 4.5-5.2 against 2.9 / 2.5-2.7 (each reads its series' newest segment row to see whether it is
folded). Folding again after each such batch made every one cost 190-230 ms, so it waits for the next stop.

Both change the run's hot rows, so both give the run a new ingest token: a process that holds the
run's hot rows or latest steps as of the old token (:mod:`.held`, :class:`ingest.LatestSteps`)
reads them again.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np
from sqlalchemy.engine import Connection

from hyperwatch.monitor.store import pending, segcodec, segments
from hyperwatch.monitor.store.bulk import bulk_write, read_in_ranges
from hyperwatch.monitor.store.chunks import seg_floor
from hyperwatch.monitor.store.compact import boundary
from hyperwatch.monitor.store.ingest import new_token
from hyperwatch.monitor.store.latest import latest_steps, write_taken
from hyperwatch.monitor.store.models import CHUNK_STEPS, PENDING_DIALECTS
from hyperwatch.monitor.store.points import (
    _POINT_COLUMNS,
    _POINT_KEY,
    _POINT_SET,
    _POINT_TYPES,
    _point_rows,
    layer_of,
)
from hyperwatch.monitor.store.seal import CODE_LAYER_BITS, Columns, read_hot

_TAKE_PG = "DELETE FROM metric_points WHERE run_id = %s RETURNING name_id, layer, step, tokens, value"
_DELETE_SQLITE = "DELETE FROM metric_points WHERE run_id = ?"
_NEW_TOKEN = "UPDATE runs SET ingest_token = {mark} WHERE id = {mark}"


def seal_stopped(conn: Connection, run_id: int, fold: bool = True) -> int:
    """A run that is not running (its row locked): each series' open range (its partial segment, 16-step
    chunks) and, with ``fold``, its hot points packed into one row of ``metric_chunks`` at once, so no
    row is written twice; the number of hot points moved. Without ``fold`` (points that reached the run
    after it stopped) the series they touched keep their last steps hot until its next stop: a batch
    that would unfold and fold them again costs ~30x a plain one."""
    hot = _take_hot(conn, run_id) if fold else Columns.empty()
    ends = {(n, la, c0): end for n, la, c0, end in segments.open_ranges(conn, run_id)}
    extra: dict[tuple[int, int, int], list[Any]] = defaultdict(list)
    for row, c in zip(_point_rows(hot, slice(None)), (hot.step // CHUNK_STEPS).tolist(), strict=True):
        key = (row[0], row[1], seg_floor(c))
        extra[key].append(row)
        ends[key] = max(ends.get(key, 0), c + 1)
    targets = [(n, la, c0, end) for (n, la, c0), end in sorted(ends.items())]
    segments.pack(conn, run_id, targets, extra, tables=segments.STOPPED, sealed=False)
    if len(hot):
        _new_token(conn, run_id)
    return len(hot)


def _take_hot(conn: Connection, run_id: int) -> Columns:
    """Every hot point of the run, deleted from the hot tables (key-sorted)."""
    pg = conn.dialect.name in PENDING_DIALECTS
    taken = pending.take(conn, run_id) if pg else Columns.empty()
    if len(taken):  # the rows of series_latest that lag behind the pending rows (revision 0020) caught up
        write_taken(conn, run_id, taken, np.empty(0, dtype=np.int64))
    if pg:
        rows = conn.exec_driver_sql(_TAKE_PG, (run_id,)).cursor.fetchall()
    else:
        rows = read_hot(conn, run_id)
        if rows:
            conn.exec_driver_sql(_DELETE_SQLITE, (run_id,))
    return Columns.join([taken, Columns.of_rows(rows)])


def unfold(conn: Connection, run_id: int, steps: Mapping[int, int] | None = None, new_token: bool = True) -> int:
    """Put the run's folded points (those at or past their series' sealed boundary) back into
    ``metric_points``, the rest of each folded segment repacked; the number of points put back.
    ``steps``: only these series (:func:`seal.series_code` -> latest step: a batch's own, as its writer
    knows them; the writers need no other series unfolded), else all of the run's, read. ``new_token``
    False: the caller's batch swapped the run's token already."""
    if steps is None:
        steps = latest_steps(conn, run_id)[0]
    if not steps:
        return 0
    firsts = {}
    for code, latest in steps.items():
        edge = boundary(latest) // CHUNK_STEPS
        firsts[(code >> CODE_LAYER_BITS, layer_of(code))] = (seg_floor(edge), edge)
    ranges = [(n, la, c0, c0) for (n, la), (c0, _e) in firsts.items()]
    found = read_in_ranges(conn, run_id, "t.chunk, t.data", segments.CHUNK_ROWS, "chunk", "", ranges)
    hot: list[tuple[Any, ...]] = []
    cut, below = [], {}
    for n, la, c0, data in found:
        n, la, c0, blob = int(n), int(la), int(c0), bytes(data)
        edge = firsts[(n, la)][1]
        if not segcodec.is_segment(blob) or c0 + segcodec.span(blob) <= edge:
            continue
        s, t, v = segcodec.decode(c0 * CHUNK_STEPS, blob)
        cut.append((n, la, c0, c0 + segcodec.span(blob)))
        cols = Columns(np.full(len(s), n), np.full(len(s), la), s, t, v)
        keep = s < edge * CHUNK_STEPS
        hot += [(run_id, *r) for r in _point_rows(cols, ~keep)]
        if keep.any():
            below[(n, la, c0)] = _point_rows(cols, keep)
    if not cut:
        return 0
    segments.delete(conn, run_id, cut, segments.STOPPED.partial)  # a folded row is a stopped run's partial segment
    back = [(n, la, c0, firsts[(n, la)][1]) for (n, la, c0) in below]
    segments.pack(conn, run_id, back, below, tables=segments.STOPPED)
    if hot:
        bulk_write(conn, "metric_points", _POINT_COLUMNS, _POINT_TYPES, hot, _POINT_KEY, _POINT_SET)
    if new_token:
        _new_token(conn, run_id)
    return len(hot)


def _new_token(conn: Connection, run_id: int) -> None:
    mark = "%s" if conn.dialect.name == "postgresql" else "?"
    conn.exec_driver_sql(_NEW_TOKEN.format(mark=mark), (new_token(), run_id))
