"""Set-based upserts with the fewest round trips each database allows.

SQLite runs in-process: one prepared ``INSERT .. ON CONFLICT DO UPDATE`` stepped over every row
(``executemany``) costs no round trip. PostgreSQL gets the whole set as one statement: each column
travels as one array parameter and ``unnest`` turns the arrays back into rows
(``INSERT .. SELECT * FROM unnest(..) ON CONFLICT ..``), one round trip however many rows.

Rows are plain tuples in ``columns`` order; the statements are built from constant table and
column names only (never from input), and every value is a bound parameter.

Numeric columns travel as one array literal each (``'{1,2,NULL}'``), built here with ``str`` (a
float's ``str`` is its shortest exact round trip; PostgreSQL reads ``inf``/``-inf``), not as Python
lists: psycopg's list dumper quotes element by element with a regex, which cost ~3.5 ms of an ~16 ms
512-point batch (issue 16, cProfile), more than the server's work on the statement it fed.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
from sqlalchemy.engine import Connection

from hyperwatch.monitor.store import toast
from hyperwatch.monitor.store.models import CHUNK_ROWS, CHUNK_TABLES

PG_ARRAY_TYPES = frozenset({"int", "bigint", "float8", "text", "bytea"})
_LITERAL_TYPES = frozenset({"int", "bigint", "float8"})
RANGES_PER_STATEMENT = 4_000  # SQLite binds at most 32,766 parameters: 4 per range


@lru_cache(maxsize=64)
def upsert_sql(
    dialect: str,
    table: str,
    columns: tuple[str, ...],
    pg_types: tuple[str, ...],
    key: tuple[str, ...],
    set_clause: str,
    where: str = "",
    returning: str = "",
) -> str:
    """The statement text of :func:`bulk_write` (cached: built once per shape)."""
    if len(columns) != len(pg_types) or not set(pg_types) <= PG_ARRAY_TYPES:
        raise ValueError(f"pg_types: one of {sorted(PG_ARRAY_TYPES)} per column of {table}, got {pg_types}")
    cols = ", ".join(columns)
    if dialect == "postgresql":
        source = "SELECT * FROM unnest(" + ", ".join(f"%s::{t}[]" for t in pg_types) + ")"
    else:
        source = "VALUES (" + ", ".join("?" for _ in columns) + ")"
    action = f"DO UPDATE SET {set_clause}" if set_clause else "DO NOTHING"
    sql = f"INSERT INTO {table} ({cols}) {source} ON CONFLICT ({', '.join(key)}) {action}"
    if where:
        sql += f" WHERE {where}"
    if returning:
        sql += f" RETURNING {returning}"
    return sql


def bulk_write(
    conn: Connection,
    table: str,
    columns: Sequence[str],
    pg_types: Sequence[str],
    rows: Sequence[tuple[Any, ...]],
    key: Sequence[str],
    set_clause: str,
    where: str = "",
) -> None:
    """Upsert ``rows`` into ``table``: ``ON CONFLICT (key) DO UPDATE SET set_clause [WHERE where]``
    (``DO NOTHING`` when ``set_clause`` is empty).

    Rows must have distinct keys (PostgreSQL refuses to update one row twice in a statement).
    """
    if not rows:
        return
    dialect = conn.dialect.name
    sql = upsert_sql(dialect, table, tuple(columns), tuple(pg_types), tuple(key), set_clause, where)
    if dialect == "postgresql":
        conn.exec_driver_sql(sql, tuple(pg_array(col, t) for col, t in zip(zip(*rows), pg_types, strict=True)))
    else:
        conn.exec_driver_sql(sql, list(rows))


def pg_array(values: Sequence[Any], pg_type: str) -> Any:
    """One array parameter for ``%s::<pg_type>[]``: a literal for numbers (None -> NULL), a list otherwise.

    NaN never reaches here as a float (it is stored as NULL: see models.py); a float NaN would
    still be read back as NaN (``str`` gives ``nan``), never clamped.
    """
    if pg_type not in _LITERAL_TYPES:
        return list(values)
    if None in values:
        return "{" + ",".join("NULL" if v is None else str(v) for v in values) + "}"
    return "{" + ",".join(map(str, values)) + "}"


def _range_source(dialect: str, n: int) -> str:
    """SQL rows (n, l, a, b) of ``n`` bound ranges: unnest of arrays (PostgreSQL) or VALUES (SQLite)."""
    if dialect == "postgresql":
        return "SELECT * FROM unnest(%s::int[], %s::int[], %s::bigint[], %s::bigint[])"
    return "VALUES " + ", ".join("(?, ?, ?, ?)" for _ in range(n))


def read_in_ranges(
    conn: Connection, run_id: int, select_cols: str, table: str, pos: str, extra: str, ranges: Sequence[tuple[int, ...]]
) -> list[tuple[Any, ...]]:
    """Rows of ``table`` for (name_id, layer, first, last) ``ranges`` of column ``pos``, one statement per chunk."""
    dialect = conn.dialect.name
    mark = "%s" if dialect == "postgresql" else "?"
    arms = _arms(dialect, table, select_cols)
    out: list[tuple[Any, ...]] = []
    for i in range(0, len(ranges), RANGES_PER_STATEMENT):
        chunk = ranges[i : i + RANGES_PER_STATEMENT]
        sql = f"WITH r(n, l, a, b) AS ({_range_source(dialect, len(chunk))}) " + " UNION ALL ".join(
            f"SELECT t.name_id, t.layer, {cols} FROM r "
            f"JOIN {relation} AS t ON t.run_id = {mark} AND t.name_id = r.n AND t.layer = r.l "
            f"AND t.{pos} >= r.a AND t.{pos} <= r.b{extra}"
            for relation, cols in arms
        )
        if dialect == "postgresql":
            types = ("int", "int", "bigint", "bigint")
            params: Any = (*(pg_array(col, t) for col, t in zip(zip(*chunk), types, strict=True)), run_id)
        else:
            params = (*(v for r in chunk for v in r), *(run_id for _ in arms))
        out.extend(conn.exec_driver_sql(sql, params).cursor.fetchall())  # driver rows: no Row objects
    return out


def _arms(dialect: str, table: str, select_cols: str) -> list[tuple[str, str]]:
    """(relation, columns) to read ``table`` from, joined as one UNION ALL.

    SQLite plans a join against a ``UNION ALL`` view by materializing the whole view and scanning it
    once per range: a VALUES join of 512 ranges over one run's 7,680 rows of ``chunk_rows`` took
    101 ms (a segment pack of issue 36's workload, every 256th step), quadratic in the series, where
    each of its two tables read through its key takes 6.8 ms. There the view is read as its tables,
    its ``data`` column computed as the view computes it; PostgreSQL joins through the view well.
    """
    if dialect == "sqlite" and table == CHUNK_ROWS:
        cols = re.sub(r"\bt\.data\b", toast.data_expr(dialect, "t.") + " AS data", select_cols)
        return [(relation, cols) for relation in CHUNK_TABLES]
    return [(table, select_cols)]


# -- PostgreSQL binary forms built from numpy columns (no per-row Python) ---------------------------
_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
_COPY_TRAILER = struct.pack(">h", -1)
_BINARY = {"int2": ">i2", "int4": ">i4", "int8": ">i8", "float8": ">f8"}


def copy_binary(columns: Sequence[tuple[np.ndarray, str, np.ndarray | None]]) -> bytes:
    """A whole ``COPY .. FROM STDIN (FORMAT BINARY)`` stream (header, rows, trailer) of numpy columns.

    ``columns``: (values, PostgreSQL type of the table column, NULL mask or None) in the table's
    column order; every column has one entry per row. Rows are laid out by numpy as one packed
    record per row (field count, then a length and a big-endian value per field), one record type
    per pattern of NULLs that occurs (a NULL field is a length of -1 and no data), so a 512-point
    batch is built in ~50 us instead of ~0.5 ms of ``write_row`` calls, and the server reads binary
    fields instead of parsing text. The rows' order in the stream is not kept across patterns.
    """
    n = len(columns[0][0])
    masks = [np.zeros(n, dtype=bool) if null is None else null for _, _, null in columns]
    pattern = np.zeros(n, dtype=np.int64)
    for i, m in enumerate(masks):
        pattern |= m.astype(np.int64) << i
    parts = [_COPY_HEADER]
    for p in np.unique(pattern).tolist():
        rows = pattern == p
        fields: list[tuple[str, str]] = [("n", ">i2")]
        for i, (_, pg_type, _) in enumerate(columns):
            fields.append((f"l{i}", ">i4"))
            if not p >> i & 1:
                fields.append((f"v{i}", _BINARY[pg_type]))
        rec = np.empty(int(rows.sum()), dtype=np.dtype(fields))
        rec["n"] = len(columns)
        for i, (values, pg_type, _) in enumerate(columns):
            if p >> i & 1:
                rec[f"l{i}"] = -1
            else:
                rec[f"l{i}"] = np.dtype(_BINARY[pg_type]).itemsize
                rec[f"v{i}"] = values[rows]
        parts.append(rec.tobytes())
    parts.append(_COPY_TRAILER)
    return b"".join(parts)


class PgArray:
    """A numpy column sent as one binary PostgreSQL array parameter (``%s::int[]`` and the like).

    Use the subclasses :class:`Int4Array`, :class:`Int8Array`, :class:`Float8Array`. No NULL elements:
    a NaN double travels as NaN (``nullif(x, 'NaN')`` in SQL makes it the store's NULL). The dumpers
    are registered on each PostgreSQL connection (:func:`register_pg_types`); psycopg's own list
    dumper would quote element by element in Python.
    """

    __slots__ = ("values",)
    pg_type = ""

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def dump(self) -> bytes:
        """PostgreSQL's binary array: ndim 1, no NULLs, element oid, length, lower bound 1, (length, value)s."""
        n = len(self.values)
        rec = np.empty(n, dtype=[("len", ">i4"), ("v", _BINARY[self.pg_type])])
        rec["len"] = rec.dtype["v"].itemsize
        rec["v"] = self.values
        return struct.pack(">iiiii", 1, 0, _ARRAY_OIDS[self.pg_type][1], n, 1) + rec.tobytes()


class Int2Array(PgArray):
    __slots__ = ()
    pg_type = "int2"


class Int4Array(PgArray):
    __slots__ = ()
    pg_type = "int4"


class Int8Array(PgArray):
    __slots__ = ()
    pg_type = "int8"


class Float8Array(PgArray):
    __slots__ = ()
    pg_type = "float8"


_ARRAY_OIDS = {"int2": (1005, 21), "int4": (1007, 23), "int8": (1016, 20), "float8": (1022, 701)}  # (array, element)


def register_pg_types(dbapi_conn: Any) -> None:
    """Teach a psycopg connection to send :class:`PgArray` parameters in binary, with the array's oid."""
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    for cls in (Int2Array, Int4Array, Int8Array, Float8Array):
        dumper = type(
            f"{cls.__name__}Dumper",
            (Dumper,),
            {"format": Format.BINARY, "oid": _ARRAY_OIDS[cls.pg_type][0], "dump": lambda self, obj: obj.dump()},
        )
        dbapi_conn.adapters.register_dumper(cls, dumper)


def array_values(data: Any, pg_type: str) -> np.ndarray:
    """A binary PostgreSQL array without NULLs (as :class:`PgArray` sends them) back as a numpy column."""
    ndim, _flags, _elem = struct.unpack_from(">iii", data)
    if ndim == 0:
        return np.empty(0, dtype=_BINARY[pg_type][1:])
    if ndim != 1:
        raise ValueError(f"expected a one-dimensional {pg_type} array, got {ndim} dimensions")
    (n,) = struct.unpack_from(">i", data, 12)
    rec = np.frombuffer(data, dtype=[("len", ">i4"), ("v", _BINARY[pg_type])], count=n, offset=20)
    return rec["v"].astype(_BINARY[pg_type][1:])


def register_array_bytes(cursor: Any, oids: Sequence[int]) -> None:
    """Make a binary psycopg cursor return arrays of ``oids`` as their raw bytes (see :func:`array_values`)."""
    from psycopg.adapt import Loader
    from psycopg.pq import Format

    class _Raw(Loader):
        format = Format.BINARY

        def load(self, data: Any) -> bytes:
            return bytes(data)

    for oid in oids:
        cursor.adapters.register_loader(oid, _Raw)
