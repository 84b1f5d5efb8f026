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

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy.engine import Connection

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
    out: list[tuple[Any, ...]] = []
    for i in range(0, len(ranges), RANGES_PER_STATEMENT):
        chunk = ranges[i : i + RANGES_PER_STATEMENT]
        sql = (
            f"WITH r(n, l, a, b) AS ({_range_source(dialect, len(chunk))}) SELECT t.name_id, t.layer, {select_cols} "
            "FROM r "
            f"JOIN {table} AS t ON t.run_id = {mark} AND t.name_id = r.n AND t.layer = r.l "
            f"AND t.{pos} >= r.a AND t.{pos} <= r.b{extra}"
        )
        if dialect == "postgresql":
            types = ("int", "int", "bigint", "bigint")
            params: Any = (*(pg_array(col, t) for col, t in zip(zip(*chunk), types, strict=True)), run_id)
        else:
            params = (*(v for r in chunk for v in r), run_id)
        out.extend(conn.exec_driver_sql(sql, params).cursor.fetchall())  # driver rows: no Row objects
    return out
