"""Pending batches (PostgreSQL): a batch of new steps stored as one row per metric name, not one per point.

Why (issue 16, measured on this machine): a 512-point batch written as 512 ``metric_points`` rows
cost 2.7 ms of the database's time, half of it the foreign-key check each row makes, the rest 512
heap and index entries and their WAL; and 16 batches later the same rows were deleted again when
their chunk sealed (:mod:`monitor.store.compact`). Written as 8 rows of arrays (one per metric
name: its layers, steps, tokens and values) the batch costs ~0.3 ms, and the chunk that seals
later takes the 16 batches' rows back in one ``DELETE`` by the run's key.

The invariant the reads rely on is unchanged: each stored key lives in exactly one place, and every
point of a series at or past its sealed boundary is *hot*. Hot points are now the rows of
``metric_points`` and the elements of ``point_batches``; the view ``hot_points`` (migration 0006) is
their union, with the same columns (tokens -1 -> NULL, NaN -> NULL, as the rows store them), and
every read of hot points reads it (:func:`models.hot_relation`). A batch goes to ``point_batches`` only
when every one of its points is a new step of its series (past the series' latest, so no key can
exist anywhere) and it seals no chunk. Any other batch of the run first takes the run's pending
rows back (:func:`take`): the points of the chunks it seals go into those chunks, the rest become
ordinary ``metric_points`` rows, so an overwrite or a late step then finds its key where the
one-row-per-point path expects it. All of it happens under the run's lock (:mod:`monitor.store.ingest`).

With steady training (every series logged at every step) a chunk seals at every 16th step for all
series at once: 15 batches are appended as pending rows, the 16th takes them back into chunks, and
no point ever becomes a ``metric_points`` row.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from sqlalchemy.engine import Connection

from hyperwatch.monitor.store.bulk import Float8Array, Int2Array, Int8Array, array_values, register_array_bytes
from hyperwatch.monitor.store.seal import Columns

_ARRAY_OIDS = (1005, 1016, 1022)  # int2[], int8[], float8[]
_TAKE = "DELETE FROM point_batches WHERE run_id = %s RETURNING run_id, name_id, layer, step, tokens, value"
_PEEK = "SELECT run_id, name_id, layer, step, tokens, value FROM point_batches WHERE run_id = ANY(%s)"


@lru_cache(maxsize=32)
def _append_sql(rows: int) -> str:
    one = "(%s, %s, %s, %s, %s, %s, %s)"
    return "INSERT INTO point_batches (run_id, name_id, token, layer, step, tokens, value) VALUES " + ", ".join(
        [one] * rows
    )


def append(
    conn: Connection,
    run_id: int,
    token: int,
    ids: np.ndarray,
    layer: np.ndarray,
    step: np.ndarray,
    tokens: np.ndarray,
    value: np.ndarray,
) -> None:
    """Store key-sorted new points as one row per name (``token``: the run's ingest token of this batch).

    Tokens travel with -1 for none and values with NaN as NaN; ``hot_points`` reads both as NULL.
    """
    cuts = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    starts = np.concatenate(([0], cuts)).tolist()
    ends = [*cuts.tolist(), len(ids)]
    params: list[object] = []
    for a, b in zip(starts, ends, strict=True):
        params += (
            run_id,
            int(ids[a]),
            token,
            Int2Array(layer[a:b]),
            Int8Array(step[a:b]),
            Int8Array(tokens[a:b]),
            Float8Array(value[a:b]),
        )
    conn.exec_driver_sql(_append_sql(len(starts)), tuple(params))


def take(conn: Connection, run_id: int) -> Columns:
    """Delete the run's pending rows and return their points (none: empty columns)."""
    _runs, cols = _points(conn, _TAKE, (run_id,))
    return Columns.join([cols]) if len(cols) else cols


def peek(conn: Connection, run_ids: list[int], name_ids: list[int] | None) -> tuple[np.ndarray, Columns]:
    """The pending points of ``run_ids`` (of ``name_ids`` only, when given), as they are stored: each
    point's run id, and the points (not sorted)."""
    if name_ids is None:
        return _points(conn, _PEEK, (run_ids,))
    return _points(conn, _PEEK + " AND name_id = ANY(%s)", (run_ids, name_ids))


def _points(conn: Connection, sql: str, params: tuple[object, ...]) -> tuple[np.ndarray, Columns]:
    """Rows of (run_id, name_id, layer[], step[], tokens[], value[]) read in binary, as one run id per
    point and the points' columns."""
    raw = conn.connection.dbapi_connection
    assert raw is not None
    with raw.cursor(binary=True) as cur:  # type: ignore[call-arg,attr-defined]
        register_array_bytes(cur, _ARRAY_OIDS)
        cur.execute(sql, params)
        found = cur.fetchall()
    if not found:
        return np.empty(0, dtype=np.int64), Columns.empty()
    layers = [array_values(r[2], "int2").astype(np.int64) for r in found]
    sizes = [len(la) for la in layers]
    runs = np.repeat(np.array([r[0] for r in found], dtype=np.int64), sizes)
    ids = np.repeat(np.array([r[1] for r in found], dtype=np.int64), sizes)
    step = np.concatenate([array_values(r[3], "int8") for r in found])
    tokens = np.concatenate([array_values(r[4], "int8") for r in found])
    value = np.concatenate([array_values(r[5], "float8") for r in found])
    return runs, Columns(ids, np.concatenate(layers), step, tokens, value)
