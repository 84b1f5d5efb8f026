"""Writing metric points: upsert, rollups, the latest-value table and batch idempotency.

Semantics (also stated in the API docs):
- a batch_id already stored is a no-op (the reply says ``duplicate: true``);
- the key of a point is (run, name, layer, step); a key sent again overwrites the stored value and
  tokens: **last write wins** (a re-sent step is a correction, e.g. a replayed spool after a crash);
- within one batch the last occurrence of a key wins.

One batch is one transaction and costs a fixed handful of statements whatever its size (see
:mod:`monitor.store.ingest` for the transaction): the run's row (locked, its progress recorded), the
batch id, the points (binary COPY of new steps, one set-based upsert for the rest), the chunks it
seals (usually none: see :mod:`monitor.store.compact`), the latest value of each series, the rollup
blocks the batch seals (usually none: see :mod:`monitor.store.rollups`; no row is rewritten by
appending steps).

The batch is handled as numpy columns from the body to the driver (:class:`SortedBatch`): no
Python object per point on the common path (issue 16).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from hyperwatch.hooks.columns import NULL_INT, PointColumns
from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store import pending, segments
from hyperwatch.monitor.store.bulk import bulk_write, copy_binary
from hyperwatch.monitor.store.compact import CHUNK_STEPS, Known, compacts, store_sealed
from hyperwatch.monitor.store.latest import update_rows, write_taken
from hyperwatch.monitor.store.models import (
    PACK_STEPS,
    PENDING_DIALECTS,
    ROLLUP_LEVELS,
    RUN_LEVEL_LAYER,
    IngestedBatchRow,
)
from hyperwatch.monitor.store.rollups import PointRow, seal_rollups
from hyperwatch.monitor.store.seal import CODE_LAYER_BITS, Columns, seal_appended, series_code

_POINT_COLUMNS = ("run_id", "name_id", "layer", "step", "tokens", "value")
_POINT_TYPES = ("int", "int", "int", "bigint", "bigint", "float8")
_POINT_KEY = ("run_id", "name_id", "layer", "step")
_POINT_SET = "tokens = excluded.tokens, value = excluded.value"
_INSERT_POINTS_SQLITE = f"INSERT INTO metric_points ({', '.join(_POINT_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?)"
_LATEST_COLUMNS = ("run_id", "name_id", "layer", "step", "value")
_LATEST_TYPES = ("int", "int", "int", "bigint", "float8")
_LATEST_KEY = ("run_id", "name_id", "layer")
_LATEST_SET = "step = excluded.step, value = excluded.value"
_LATEST_WHERE = "excluded.step >= series_latest.step"
_UPDATE_LATEST_SQLITE = (
    "UPDATE series_latest SET step = ?, value = ? WHERE run_id = ? AND name_id = ? AND layer = ? AND step <= ?"
)
SEAL_ON_COLUMNS = True
"""Seal the chunks of appended steps on numpy columns (:mod:`monitor.store.seal`); the tests turn it
off to check both paths write the same rows."""
_COLS = ("ids", "layer", "step", "tokens", "value")
_COPY_POINTS = f"COPY metric_points ({', '.join(_POINT_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
_HEX_ID = re.compile("[0-9a-f]{32}")
_CLAIM = {
    dialect: (
        f"INSERT INTO ingested_batches (batch_id, run_id, n_points, received_ms) VALUES ({m}, {m}, {m}, {m}) "
        "ON CONFLICT (run_id, batch_id) DO NOTHING RETURNING batch_id"
    )
    for dialect, m in (("postgresql", "%s"), ("sqlite", "?"))
}


def now_utc() -> datetime:
    return datetime.now(UTC)


def as_utc(ts: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; every timestamp stored is UTC."""
    if ts is None:
        return None
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


def to_sql_value(value: float) -> float | None:
    """NaN -> NULL; +-Inf and finite values as themselves (see models.py)."""
    return None if math.isnan(value) else value


def from_sql_value(value: float | None) -> float:
    return math.nan if value is None else float(value)


def sql_layer(layer: int | None) -> int:
    return RUN_LEVEL_LAYER if layer is None else layer


def api_layer(layer: int) -> int | None:
    return None if layer == RUN_LEVEL_LAYER else layer


def dialect_insert(conn: Connection, table: Any) -> Any:
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def received_ms() -> int:
    """A batch's ``received_ms``: now, in Unix milliseconds."""
    return time.time_ns() // 1_000_000


def batch_key(batch_id: str) -> bytes:
    """The stored key of a batch id (revision 0017): a 32-digit lowercase hex id (a uuid's, what the hooks
    sent before their sequence ids, revision 0019), as a 0 byte and its 16 bytes; any other id as its ASCII
    bytes, which never start with a 0 byte (ids are letters, digits, ``_`` and ``-``), so two ids never
    share a key."""
    if len(batch_id) == 32 and _HEX_ID.fullmatch(batch_id):
        return b"\x00" + bytes.fromhex(batch_id)
    return batch_id.encode("ascii")


def batch_id_of(key: bytes) -> str:
    """The batch id a stored key was made from (:func:`batch_key`'s inverse)."""
    key = bytes(key)
    return key[1:].hex() if key[:1] == b"\x00" else key.decode("ascii")


def batch_seen(conn: Connection, run_id: int, batch_id: str) -> int | None:
    """The point count of a batch already stored for the run, or None."""
    found = conn.execute(
        select(IngestedBatchRow.n_points).where(
            IngestedBatchRow.run_id == run_id, IngestedBatchRow.batch_id == batch_key(batch_id)
        )
    ).first()
    return None if found is None else int(found[0])


def claim_batch(conn: Connection, run_id: int, batch_id: str, n_points: int) -> int | None:
    """Record ``batch_id`` as stored by this transaction; None when it is new, else the first send's count.

    Batch ids are scoped per run (revision 0007): the same id sent for another run is a new batch.
    Stored compactly (revision 0017): the id as :func:`batch_key`, the time as Unix milliseconds.

    One statement for the common case; the ingest's on SQLite (on PostgreSQL ``ingest.lock_run`` claims
    in its lock statement). A concurrent send of the same id, having waited for the run's row, finds
    the first one committed (a duplicate) or rolled back (it claims it), so a batch id is never stored
    twice and never answered with a database error.
    """
    row = (batch_key(batch_id), run_id, n_points, received_ms())
    if conn.exec_driver_sql(_CLAIM[conn.dialect.name], row).cursor.fetchone():
        return None
    return batch_seen(conn, run_id, batch_id)


def last_per_key(cols: PointColumns) -> PointColumns:
    """The batch as stored: for a key (name, layer, step) sent more than once, only its last occurrence,
    the others in arrival order. What the detectors must judge (issue 25: a batch with NaN then 1.0 for
    one key stored 1.0 but raised ``nonfinite_value`` for the NaN). The batch itself when no key repeats.
    """
    n = len(cols)
    if n < 2:
        return cols
    order = np.lexsort((cols.step, cols.layer, cols.name_index))  # stable: equal keys keep arrival order
    c, la, s = cols.name_index[order], cols.layer[order], cols.step[order]
    last = np.ones(n, dtype=bool)
    last[:-1] = (c[1:] != c[:-1]) | (la[1:] != la[:-1]) | (s[1:] != s[:-1])
    if last.all():
        return cols
    keep = np.sort(order[last])
    return PointColumns(
        cols.names, cols.name_index[keep], cols.step[keep], cols.value[keep], cols.layer[keep], cols.tokens[keep]
    )


@dataclass(frozen=True, eq=False)
class SortedBatch:
    """A batch's points as the store writes them: one row per distinct key (the last occurrence of a key
    wins), sorted by (name_id, layer, step), and cut into series.

    Row columns: ``ids`` (name id), ``layer`` (-1 = run level), ``step``, ``tokens`` (NULL_INT = none),
    ``value`` (NaN kept). Series ``i`` is rows ``starts[i]:ends[i]``; ``codes[i]`` is its key as
    one integer (:func:`series_code`).
    """

    ids: np.ndarray
    layer: np.ndarray
    step: np.ndarray
    tokens: np.ndarray
    value: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    @classmethod
    def of(cls, points: Sequence[Point] | PointColumns, name_ids: dict[str, int]) -> SortedBatch:
        """One stable sort by key (equal keys keep their arrival order, so the last of each run of equal
        keys is the last occurrence), then the distinct keys."""
        cols = PointColumns.of(points)
        ids = np.array([name_ids[n] for n in cols.names], dtype=np.int64)[cols.name_index]
        layer = np.where(cols.layer == NULL_INT, RUN_LEVEL_LAYER, cols.layer)
        step = cols.step
        order = np.lexsort((step, layer, ids))
        ids, layer, step = ids[order], layer[order], step[order]
        last = np.ones(len(order), dtype=bool)
        last[:-1] = (ids[1:] != ids[:-1]) | (layer[1:] != layer[:-1]) | (step[1:] != step[:-1])
        keep = order[last]
        ids, layer, step = ids[last], layer[last], step[last]
        new = np.ones(len(ids), dtype=bool)
        new[1:] = (ids[1:] != ids[:-1]) | (layer[1:] != layer[:-1])
        starts = np.flatnonzero(new)
        ends = np.append(starts[1:], len(ids))
        return cls(ids, layer, step, cols.tokens[keep], cols.value[keep], starts, ends)

    def __len__(self) -> int:
        return len(self.step)

    @property
    def codes(self) -> np.ndarray:
        return series_code(self.ids[self.starts], self.layer[self.starts])

    def per_row(self, per_series: np.ndarray) -> np.ndarray:
        """A value per series spread over the series' rows."""
        return np.repeat(per_series, self.ends - self.starts)

    def rows(self, mask: Any = None) -> list[PointRow]:
        """(name_id, layer, step, tokens, sql value) tuples of the rows (all, or ``mask``'s): the row form."""
        return _point_rows(self, slice(None) if mask is None else mask)


def layer_of(code: int) -> int:
    """The (SQL) layer of a :func:`series_code`; its name id is ``code >> CODE_LAYER_BITS``."""
    return (code & ((1 << CODE_LAYER_BITS) - 1)) - 1


def point_rows(points: Sequence[Point] | PointColumns, name_ids: dict[str, int]) -> list[PointRow]:
    """(name_id, layer, step, tokens, sql value) per distinct key, the last occurrence winning, key-sorted."""
    cols = PointColumns.of(points)
    return SortedBatch.of(cols, name_ids).rows() if len(cols) else []


def write_points(
    conn: Connection,
    run_id: int,
    token: int,
    batch: SortedBatch,
    before: np.ndarray,
    held: Sequence[Columns] | None = None,
) -> tuple[int, np.ndarray, tuple[Columns, ...] | None]:
    """Store a claimed batch's points with their latest values, sealed chunks and rollups.

    ``token``: the run's ingest token of this batch; ``before``: each series' latest stored step (-1:
    none), read under the run's lock (see :mod:`monitor.store.ingest`); ``held``: the run's hot rows
    as of that lock, when this process holds them (:mod:`.held`, SQLite). Returns how many hot points
    were moved (deleted from ``metric_points`` or ``point_batches``: see :mod:`.hot`), each series'
    latest step after the batch, and the run's hot rows after it when known (SQLite's appended steps).
    """
    last = batch.step[batch.ends - 1]  # rows are key-sorted: a series' last row is its latest step
    after = np.maximum(last, before)
    fresh = batch.step > batch.per_row(before)  # no such key stored yet
    known: Known = {}
    moved = 0
    newer = last >= before  # the series whose row the batch brings to a later step
    if compacts(conn):
        edge_before = (before + 1) // CHUNK_STEPS * CHUNK_STEPS
        edge_after = (after + 1) // CHUNK_STEPS * CHUNK_STEPS
        hot = batch.step >= batch.per_row(edge_after)
        # most batches seal no chunk: new steps only, and no chunk to seal, make one pending row per name
        touched = (edge_after > edge_before) | (np.add.reduceat(~hot, batch.starts) > 0)
        if fresh.all() and not touched.any() and conn.dialect.name in PENDING_DIALECTS:
            pending.append(conn, run_id, token, batch.ids, batch.layer, batch.step, batch.tokens, batch.value)
            newer &= before < 0  # a new series' row only: the others' rows wait for their points (.latest)
        else:
            # the run's pending points first: those of the chunks this batch seals go into them, the
            # rest become rows, written with the batch's own new hot steps in one COPY
            taken = pending.take(conn, run_id) if conn.dialect.name in PENDING_DIALECTS else Columns.empty()
            own = series_code(batch.ids[batch.starts][newer], batch.layer[batch.starts][newer])
            write_taken(conn, run_id, taken, own)
            sealing = _sealing(batch, taken, touched, edge_after)
            _insert_points(conn, run_id, batch, hot & fresh, hot & ~fresh, (taken, ~sealing))
            moved = len(taken)
            if fresh.all() and SEAL_ON_COLUMNS:  # appended steps only: every chunk sealed is new
                old = touched & (before >= 0)
                ranges = list(
                    zip(
                        batch.ids[batch.starts][old].tolist(),
                        batch.layer[batch.starts][old].tolist(),
                        edge_before[old].tolist(),
                        (edge_after[old] - 1).tolist(),
                    )
                )
                mine = Columns(*(getattr(batch, c)[~hot] for c in _COLS))
                theirs = Columns(*(getattr(taken, c)[sealing] for c in _COLS))
                # the run's hot rows now: those held and the ones just inserted, as SQLite gives them back
                now = None if held is None else (*held, _as_stored(batch, hot))
                took, _chunks, left = seal_appended(conn, run_id, ranges, Columns.join([mine, theirs]), now)
                moved += took
                _pack(conn, run_id, batch, touched, edge_before, edge_after)
                _write_latest(conn, run_id, batch, before, newer)
                _seal_rollups(conn, run_id, batch, before, after, {}, from_level=max(ROLLUP_LEVELS))
                return moved, after, left
            if touched.any():
                ids, layers = batch.ids[batch.starts][touched].tolist(), batch.layer[batch.starts][touched].tolist()
                keys = list(zip(ids, layers))
                known, taken_rows = store_sealed(
                    conn,
                    run_id,
                    batch.rows(~hot),
                    dict(zip(keys, before[touched].tolist())),
                    dict(zip(keys, after[touched].tolist())),
                    _point_rows(taken, sealing),
                )
                moved += taken_rows
                _pack(conn, run_id, batch, touched, edge_before, edge_after)
    else:
        _insert_points(conn, run_id, batch, fresh, ~fresh)
    _write_latest(conn, run_id, batch, before, newer)
    _seal_rollups(conn, run_id, batch, before, after, known)
    return moved, after, None


def _as_stored(batch: SortedBatch, rows: np.ndarray) -> Columns:
    """The batch's ``rows`` as SQLite reads them back from ``metric_points``: NaN is NULL there (one NaN,
    whatever its bits), and a REAL with no fraction is kept as an integer (-0.0 comes back 0.0)."""
    value = batch.value[rows]
    value = np.where(np.isnan(value), np.nan, value + 0.0)
    return Columns(batch.ids[rows], batch.layer[rows], batch.step[rows], batch.tokens[rows], value)


def _pack(
    conn: Connection,
    run_id: int,
    batch: SortedBatch,
    touched: np.ndarray,
    edge_before: np.ndarray,
    edge_after: np.ndarray,
) -> None:
    """Pack the segment ranges whose sealed boundary passed a packing point (:mod:`.segments`)."""
    which = touched & (edge_after // PACK_STEPS > edge_before // PACK_STEPS)
    if not which.any():
        return
    keys = list(zip(batch.ids[batch.starts][which].tolist(), batch.layer[batch.starts][which].tolist()))
    segments.pack(conn, run_id, segments.crossed(keys, edge_before[which].tolist(), edge_after[which].tolist()))


def _seal_rollups(
    conn: Connection,
    run_id: int,
    batch: SortedBatch,
    before: np.ndarray,
    after: np.ndarray,
    known: Known,
    from_level: int = min(ROLLUP_LEVELS),
) -> None:
    """:func:`rollups.seal_rollups` (levels ``from_level`` and up) for the series that may seal or
    invalidate a block: those new to the store, whose latest step crossed a block edge of that level,
    or with a step below their sealed blocks' end (the others need nothing at any level: the widths
    nest). Usually none, or all at once."""
    first_width = ROLLUP_LEVELS[from_level]
    edge = (before + 1) // first_width
    first = batch.step[batch.starts]
    new = (before < 0) & (from_level == min(ROLLUP_LEVELS))
    busy = np.flatnonzero(new | ((after + 1) // first_width != edge) | (first < edge * first_width))
    if not len(busy):
        return
    ids, layers = batch.ids[batch.starts].tolist(), batch.layer[batch.starts].tolist()
    steps = batch.step.tolist()
    starts, ends = batch.starts.tolist(), batch.ends.tolist()
    b_list, a_list = before.tolist(), after.tolist()
    keys = {int(i): (ids[i], layers[i]) for i in busy.tolist()}
    seal_rollups(
        conn,
        run_id,
        {k: (None if b_list[i] < 0 else b_list[i]) for i, k in keys.items()},
        {k: a_list[i] for i, k in keys.items()},
        {k: steps[starts[i] : ends[i]] for i, k in keys.items()},
        known,
        from_level,
    )


def _write_latest(conn: Connection, run_id: int, batch: SortedBatch, before: np.ndarray, newer: np.ndarray) -> None:
    """The latest (step, value) of each series whose latest step the batch reaches (``newer``): a new
    series gets its row (an upsert), an existing one is updated unless a later step is already stored
    (a plain UPDATE: PostgreSQL from binary arrays, SQLite stepped in-process; both cheaper than the
    upsert's conflict probe)."""
    lasts = batch.ends - 1
    rows = lasts[newer & (before >= 0)]
    if len(rows) and conn.dialect.name == "postgresql":
        update_rows(conn, run_id, batch.ids[rows], batch.layer[rows], batch.step[rows], batch.value[rows])
    elif len(rows):
        conn.exec_driver_sql(_UPDATE_LATEST_SQLITE, [(s, v, run_id, n, la, s) for n, la, s, v in _latest(batch, rows)])
    rows = lasts[newer & (before < 0)]
    if len(rows):
        latest = [(run_id, n, la, s, v) for n, la, s, v in _latest(batch, rows)]
        bulk_write(
            conn, "series_latest", _LATEST_COLUMNS, _LATEST_TYPES, latest, _LATEST_KEY, _LATEST_SET, _LATEST_WHERE
        )


def _latest(batch: SortedBatch, rows: np.ndarray) -> list[tuple[int, int, int, float | None]]:
    """(name_id, layer, step, sql value) of the given rows (NaN -> NULL)."""
    values: list[Any] = batch.value[rows].tolist()
    return [
        (n, la, s, None if v != v else v)
        for n, la, s, v in zip(batch.ids[rows].tolist(), batch.layer[rows].tolist(), batch.step[rows].tolist(), values)
    ]


def _sealing(batch: SortedBatch, taken: Columns, touched: np.ndarray, edge_after: np.ndarray) -> np.ndarray:
    """Which pending points lie in a chunk the batch seals: their series is touched and they are below
    its new boundary (pending points are never below the old one)."""
    if not len(taken):
        return np.zeros(0, dtype=bool)
    codes = batch.codes  # sorted: the batch is key-sorted
    theirs = series_code(taken.ids, taken.layer)
    at = np.minimum(np.searchsorted(codes, theirs), len(codes) - 1)
    return (codes[at] == theirs) & touched[at] & (taken.step < edge_after[at])


def _point_rows(cols: Any, mask: Any) -> list[PointRow]:
    """(name_id, layer, step, tokens, sql value) tuples of the masked rows of key-sorted columns."""
    tokens: list[Any] = cols.tokens[mask].tolist()
    if NULL_INT in tokens:
        tokens = [None if t == NULL_INT else t for t in tokens]
    value = cols.value[mask]
    values: list[Any] = value.tolist()
    for i in np.flatnonzero(np.isnan(value)).tolist():
        values[i] = None  # NaN is stored as NULL (see models.py)
    return list(zip(cols.ids[mask].tolist(), cols.layer[mask].tolist(), cols.step[mask].tolist(), tokens, values))


def _insert_points(
    conn: Connection,
    run_id: int,
    batch: SortedBatch,
    fresh: np.ndarray,
    other: np.ndarray,
    also: tuple[Columns, np.ndarray] | None = None,
) -> None:
    """Store the rows of ``fresh`` (keys not stored yet) and ``other`` (may exist: last write wins), and
    ``also``'s masked points (taken back from pending batches: stored nowhere else now).

    Fresh keys are steps past their series' latest, and the run's row is locked (see
    :mod:`monitor.store.ingest`): no one else can write them before commit, so a plain insert is
    exact for them. PostgreSQL loads them by binary COPY, the database's fastest load, built from
    the columns in one piece; SQLite steps one prepared INSERT over them in-process. Every other
    key (a re-sent or late step) takes the upsert, after the plain inserts.
    """
    if conn.dialect.name == "postgresql":
        cols = [getattr(batch, c)[fresh] for c in _COLS]
        if also is not None and also[1].any():
            cols = [np.concatenate((c, getattr(also[0], n)[also[1]])) for c, n in zip(cols, _COLS, strict=True)]
        if len(cols[0]):
            ids, layer, step, tokens, value = cols
            stream = copy_binary(
                [
                    (np.full(len(ids), run_id), "int4", None),
                    (ids, "int4", None),  # name_id INTEGER since revision 0007
                    (layer, "int2", None),
                    (step, "int8", None),
                    (tokens, "int8", tokens == NULL_INT),
                    (value, "float8", np.isnan(value)),
                ]
            )
            raw = conn.connection.dbapi_connection
            assert raw is not None
            with raw.cursor() as cur, cur.copy(_COPY_POINTS) as copy:  # type: ignore[attr-defined]
                copy.write(stream)
    elif fresh.any():
        conn.exec_driver_sql(_INSERT_POINTS_SQLITE, [(run_id, *r) for r in batch.rows(fresh)])
    if other.any():
        rows = [(run_id, *r) for r in batch.rows(other)]
        bulk_write(conn, "metric_points", _POINT_COLUMNS, _POINT_TYPES, rows, _POINT_KEY, _POINT_SET)
