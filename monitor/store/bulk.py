"""Set-based upserts with the fewest round trips each database allows.

SQLite runs in-process: one prepared ``INSERT .. ON CONFLICT DO UPDATE`` stepped over every row
(``executemany``) costs no round trip. PostgreSQL gets the whole set as one statement: each column
travels as one array parameter and ``unnest`` turns the arrays back into rows
(``INSERT .. SELECT * FROM unnest(..) ON CONFLICT ..``), one round trip however many rows.

Rows are plain tuples in ``columns`` order; the statements are built from constant table and
column names only (never from input), and every value is a bound parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy.engine import Connection

PG_ARRAY_TYPES = frozenset({"int", "bigint", "float8", "text"})


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
    sql = f"INSERT INTO {table} ({cols}) {source} ON CONFLICT ({', '.join(key)}) DO UPDATE SET {set_clause}"
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
    """Upsert ``rows`` into ``table``: ``ON CONFLICT (key) DO UPDATE SET set_clause [WHERE where]``.

    Rows must have distinct keys (PostgreSQL refuses to update one row twice in a statement).
    """
    if not rows:
        return
    dialect = conn.dialect.name
    sql = upsert_sql(dialect, table, tuple(columns), tuple(pg_types), tuple(key), set_clause, where)
    if dialect == "postgresql":
        conn.exec_driver_sql(sql, tuple(list(col) for col in zip(*rows)))
    else:
        conn.exec_driver_sql(sql, list(rows))
