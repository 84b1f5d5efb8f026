"""Where a database's bytes are: each table with its indexes (and TOAST on PostgreSQL), the space kept
free inside, the points received and the bytes per point (``hyperwatch db size``; issue 36's question,
"does one database hold a year of a team's runs or a month", asked of a user's own data).

Read-only, so it runs beside the service: SQLite through ``dbstat`` (page counts of every table and
index; the file's pages from ``PRAGMA page_count``, WAL content included, and its free pages), PostgreSQL
through ``pg_total_relation_size`` / ``pg_indexes_size`` of the schema's tables (what ``VACUUM`` keeps
inside them for later writes is counted as used: measuring it needs ``pgstattuple``, see
``bench/storage_parts.py``). Points are the sum of ``ingested_batches.n_points`` and
``batch_ranges.n_points``: every point the service accepted, a point sent again for a stored step included.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError

_PG_TABLES = text(
    "SELECT c.relname, pg_total_relation_size(c.oid), pg_indexes_size(c.oid) FROM pg_class c "
    "JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE s.schemaname = current_schema() ORDER BY 2 DESC, 1"
)
_SQLITE_PAGES = text(
    "SELECT coalesce(m.tbl_name, d.name), sum(d.pgsize), sum(CASE WHEN m.type = 'index' THEN d.pgsize ELSE 0 END) "
    "FROM dbstat AS d LEFT JOIN sqlite_master AS m ON m.name = d.name GROUP BY 1 ORDER BY 2 DESC, 1"
)


@dataclass(frozen=True)
class TableSize:
    table: str
    bytes: int  # the table, its indexes and (PostgreSQL) its TOAST table
    index_bytes: int  # of which its indexes


@dataclass(frozen=True)
class Sizes:
    dialect: str
    total_bytes: int  # SQLite: the database's pages (free ones included); PostgreSQL: every table's total
    free_bytes: int | None  # SQLite's free pages (reused by later writes); None on PostgreSQL
    points: int | None  # received (ingested_batches); None where the schema has no such table
    runs: int | None
    tables: list[TableSize] = field(default_factory=list)

    @property
    def bytes_per_point(self) -> float | None:
        return self.total_bytes / self.points if self.points else None

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "bytes_per_point": self.bytes_per_point}


def measure(engine: Engine) -> Sizes:
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            tables = [TableSize(str(n), int(b), int(i)) for n, b, i in conn.execute(_PG_TABLES)]
            total, free = sum(t.bytes for t in tables), None
        else:
            page = int(conn.exec_driver_sql("PRAGMA page_size").scalar_one())
            total = int(conn.exec_driver_sql("PRAGMA page_count").scalar_one()) * page
            free = int(conn.exec_driver_sql("PRAGMA freelist_count").scalar_one()) * page
            tables = _sqlite_tables(conn)
        points, runs = _received(conn)
    return Sizes(conn.dialect.name, total, free, points, runs, tables)


def _sqlite_tables(conn: Connection) -> list[TableSize]:
    """Per table from ``dbstat``; none where this SQLite was built without it (the totals still hold)."""
    try:  # a failed SELECT leaves a SQLite transaction usable
        return [TableSize(str(n), int(b), int(i)) for n, b, i in conn.execute(_SQLITE_PAGES)]
    except OperationalError as exc:
        if "dbstat" not in str(exc):
            raise
        return []


def _received(conn: Connection) -> tuple[int | None, int | None]:
    if not conn.dialect.has_table(conn, "ingested_batches"):
        return None, None
    received = "SELECT run_id, n_points FROM ingested_batches"
    if conn.dialect.has_table(conn, "batch_ranges"):  # revision 0019: the hooks' sequence ids
        received += " UNION ALL SELECT run_id, n_points FROM batch_ranges"
    points, runs = conn.execute(
        text(f"SELECT coalesce(sum(n_points), 0), count(DISTINCT run_id) FROM ({received}) AS received")
    ).one()
    return int(points), int(runs)
