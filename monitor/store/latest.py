"""Each series' latest step and value: ``series_latest`` and, on PostgreSQL, the run's pending rows.

Until 2026-12-01 every batch rewrote the ``series_latest`` row of each series it held: 512 rows a
one-step batch of issue 36's workload, 1.2 ms of the statement itself and the WAL the commit then
flushes. Side by side in one process the store took 5.56 ms a plain batch with that update and 3.65
without it (``monitor/store/README.md``, "the lever left"). Now a batch that goes to ``point_batches``
(:mod:`.pending`: new steps only, sealing nothing; 15 of 16 in steady training) leaves the rows of the
series it already had as they were; a new series still gets its row. So on PostgreSQL the table is
exact up to the run's pending rows, and the latest of a series is the newer of its row and its newest
pending element (:func:`newest_pending`, merged by :func:`overlay`). When pending rows are taken back
(any batch that does not go to ``point_batches``: it seals a chunk, or re-sends or back-fills a step),
their series' rows are brought up to date first (:func:`write_taken`), in the same transaction.

Readers of the latest *value* or *step* merge (the writer's cache miss, the live pages, the run's
series list, the layer matrix, the detectors' windows, ``/metrics``, the summaries, learning's
latest loss). Readers of *boundaries* do not need to: a pending batch never crosses a chunk's edge, so
``(latest + 1) // CHUNK_STEPS`` is the same from the row as from the pending rows, and a boundary read
as ``latest // width`` (downsampling) is at most one block conservative (it reads that block's points
instead of its rollup row: the same answer). SQLite keeps no pending rows: nothing changes there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from sqlalchemy.engine import Connection

from hyperwatch.monitor.store import pending
from hyperwatch.monitor.store.bulk import Float8Array, Int4Array, Int8Array
from hyperwatch.monitor.store.models import PENDING_DIALECTS
from hyperwatch.monitor.store.seal import Columns, series_code

Key = tuple[int, int, int]  # run id, name id, layer (as stored: RUN_LEVEL_LAYER for none)
Newest = dict[Key, tuple[int, float | None]]  # -> step, value as SQL gives it (NaN as None)

UPDATE_LATEST_PG = (
    "UPDATE series_latest AS t SET step = u.step, value = nullif(u.value, 'NaN') "
    "FROM unnest(%s::int[], %s::int[], %s::bigint[], %s::float8[]) AS u(name_id, layer, step, value) "
    "WHERE t.run_id = %s AND t.name_id = u.name_id AND t.layer = u.layer AND u.step >= t.step"
)
"""Series that already have their row: a plain UPDATE from binary arrays (~0.6 ms cheaper on PostgreSQL
than the upsert's conflict probe for 512 rows; NaN travels as NaN and is stored as NULL); a row that
holds a later step keeps it."""


def newest_pending(conn: Connection, run_ids: Iterable[int], name_ids: Iterable[int] | None = None) -> Newest:
    """Per series of ``run_ids`` (of ``name_ids`` only, when given) with pending points: its newest
    pending step and the value there. Empty where the database keeps no pending rows (SQLite)."""
    runs = sorted({int(r) for r in run_ids})
    names = None if name_ids is None else sorted({int(n) for n in name_ids})
    if conn.dialect.name not in PENDING_DIALECTS or not runs or names == []:
        return {}
    run, cols = pending.peek(conn, runs, names)
    order = np.lexsort((cols.step, cols.layer, cols.ids, run))  # by series, then step: each series' last is its newest
    run, cols = run[order], cols.take(order)
    last = np.ones(len(run), dtype=bool)
    last[:-1] = (run[1:] != run[:-1]) | (cols.ids[1:] != cols.ids[:-1]) | (cols.layer[1:] != cols.layer[:-1])
    keys = zip(run[last].tolist(), cols.ids[last].tolist(), cols.layer[last].tolist(), strict=True)
    found = zip(cols.step[last].tolist(), cols.value[last].tolist(), strict=True)
    return {key: (s, None if v != v else v) for key, (s, v) in zip(keys, found, strict=True)}


def overlay(key: Key, step: int, value: float | None, newest: Newest) -> tuple[int, float | None]:
    """A series' (step, SQL value) from its ``series_latest`` row, or its newest pending one if later."""
    found = newest.get(key)
    return found if found is not None and found[0] > step else (step, value)


def write_taken(conn: Connection, run_id: int, taken: Columns, own: np.ndarray) -> None:
    """Pending points taken back (key-sorted: :meth:`Columns.join`): each of their series' rows brought
    to its last taken step, unless the row holds a later one (PostgreSQL; SQLite takes nothing). ``own``:
    the codes (:func:`seal.series_code`) of the series the batch writes itself at a later step, left
    out: a second new version of a row in one transaction would not fit the room its page keeps (0018)."""
    if not len(taken):
        return
    last = np.ones(len(taken), dtype=bool)
    last[:-1] = (taken.ids[1:] != taken.ids[:-1]) | (taken.layer[1:] != taken.layer[:-1])
    last &= ~np.isin(series_code(taken.ids, taken.layer), own)
    if not last.any():
        return
    update_rows(conn, run_id, taken.ids[last], taken.layer[last], taken.step[last], taken.value[last])


def update_rows(
    conn: Connection, run_id: int, ids: np.ndarray, layer: np.ndarray, step: np.ndarray, value: np.ndarray
) -> None:
    """PostgreSQL: the rows of these series (they exist) brought to these steps and values, unless a row
    holds a later step (:data:`UPDATE_LATEST_PG`)."""
    params = (Int4Array(ids), Int4Array(layer), Int8Array(step), Float8Array(value), run_id)
    conn.exec_driver_sql(UPDATE_LATEST_PG, params)


def latest_steps(conn: Connection, run_id: int) -> tuple[dict[int, int], dict[int, float]]:
    """Every series of the run: its code (:func:`seal.series_code`) -> its latest stored step, and -> the
    value stored there (NaN for NULL): its ``series_latest`` row merged with its pending points."""
    mark = "%s" if conn.dialect.name == "postgresql" else "?"
    found = conn.exec_driver_sql(
        f"SELECT name_id, layer, step, value FROM series_latest WHERE run_id = {mark}", (run_id,)
    ).cursor.fetchall()
    newest = newest_pending(conn, [run_id])
    steps: dict[int, int] = {}
    values: dict[int, float] = {}
    for n, la, s, v in found:
        s, v = overlay((run_id, n, la), s, v, newest)
        code = series_code(n, la)
        steps[code], values[code] = s, math.nan if v is None else float(v)
    return steps, values
