"""Segment blobs cut at PostgreSQL's TOAST chunk size: TOAST pages hold full chunks only (issue 36).

A chunk row's blob was one ``STORAGE EXTERNAL`` column: TOAST cut it into 1,996-byte chunks, four
to a page, and each blob's last, shorter chunk left room the next full one did not fit (0.91 B/pt of
free TOAST space on issue 36's workload, beside 4.55 live). Now ``data_ext`` (``STORAGE EXTERNAL``)
holds the longest prefix of whole TOAST chunks and ``data`` the rest, inline in the row's heap page
(:mod:`monitor.store.toast`). ``chunk_rows`` joins them back, so every read gets whole blobs.
SQLite gets the column (always NULL: it keeps whole blobs) and the same view.

Moves data (rewrites every blob of at least one TOAST chunk on PostgreSQL), so it locks first
(migrations/README.md): ``runs`` against writers, then the two chunk tables; the write lock on
SQLite. Downgrade joins every split blob back into ``data`` and drops the column. The space of the
old row versions is reused once VACUUM (autovacuum, or the service's own, ``monitor/store/hot.py``)
has seen them.

Revision ID: 0016_toast_split
Revises: 0015_open_chunks
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from hyperwatch.monitor.store import packing, toast

revision = "0016_toast_split"
down_revision = "0015_open_chunks"
branch_labels = None
depends_on = None

_TABLES = ("metric_chunks", "open_chunks")
_COLUMNS = "run_id, name_id, layer, chunk, nonfinite, {data}, min_step, min_value, max_step, max_value"


def _view(data: str) -> str:
    cols = _COLUMNS.format(data=data)
    return f"CREATE VIEW chunk_rows AS SELECT {cols} FROM metric_chunks UNION ALL SELECT {cols} FROM open_chunks"


def _lock(conn: sa.Connection) -> None:
    if conn.dialect.name == "postgresql":
        op.execute("LOCK TABLE runs IN SHARE ROW EXCLUSIVE MODE")
    packing.lock_for_move(conn, (*packing.SEGMENT_TABLES, "open_chunks"))


def upgrade() -> None:
    conn = op.get_bind()
    _lock(conn)
    for table in _TABLES:
        op.add_column(table, sa.Column("data_ext", sa.LargeBinary(), nullable=True))
    if conn.dialect.name == "postgresql":
        size = toast.split_size(conn)
        for table in _TABLES:
            op.execute(f"ALTER TABLE {table} ALTER COLUMN data_ext SET STORAGE EXTERNAL")
            cut = f"octet_length(data) / {size} * {size}"
            op.execute(
                f"UPDATE {table} SET data_ext = substring(data FROM 1 FOR {cut}), data = substring(data FROM {cut} + 1) "
                f"WHERE data_ext IS NULL AND octet_length(data) >= {size}"
            )
    op.execute("DROP VIEW chunk_rows")
    op.execute(_view(toast.data_expr(conn.dialect.name) + " AS data"))


def downgrade() -> None:
    conn = op.get_bind()
    _lock(conn)
    whole = toast.data_expr(conn.dialect.name)
    for table in _TABLES:
        op.execute(f"UPDATE {table} SET data = {whole}, data_ext = NULL WHERE data_ext IS NOT NULL")
    op.execute("DROP VIEW chunk_rows")  # before the column it reads
    for table in _TABLES:
        op.execute(f"ALTER TABLE {table} DROP COLUMN data_ext")  # SQLite >= 3.35 drops it in place
    op.execute(_view("data"))
