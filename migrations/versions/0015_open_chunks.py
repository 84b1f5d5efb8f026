"""The open ranges' rows in their own table: ``metric_chunks`` only grows (issue 36).

A running run's 16-step chunks and partial segments are rewritten by every pack (every 256 steps)
and deleted when their range seals. In ``metric_chunks`` beside the segments they left the space
they freed in its heap, TOAST and index files: on PostgreSQL 5 of the 11.9 B/pt of issue 36's
workload. ``open_chunks`` (same columns) holds them now: it churns, stays as small as the open
ranges of the running runs, and empties when they stop (their partial segments then go to
``metric_chunks``); reads select the view ``chunk_rows`` (both tables).

On SQLite ``metric_chunks`` becomes a rowid table (rebuilt; downgrade rebuilds it ``WITHOUT ROWID``):
a row of up to ~990 bytes stays whole in a 1 KB leaf page where a ``WITHOUT ROWID`` row spilled past
~230 bytes into an overflow page left mostly empty (the real-hooks fixture of ``bench/storage.py``:
short series whose last segment is ~300 bytes), and a longer row fills its overflow pages.

Moves data, so it locks first (migrations/README.md): on PostgreSQL ``runs`` against writers
(SHARE ROW EXCLUSIVE: reads go on; a writer takes its run's row first, so the new table's foreign key
cannot deadlock with one), then ``packing.SEGMENT_TABLES``; on SQLite the write lock. Upgrade moves
the rows at or past each running run's open-range start; downgrade moves every ``open_chunks`` row
back and drops the table and the view.

Revision ID: 0015_open_chunks
Revises: 0014_compressed_segments
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from hyperwatch.monitor.store import packing

revision = "0015_open_chunks"
down_revision = "0014_compressed_segments"
branch_labels = None
depends_on = None

_COLUMNS = "run_id, name_id, layer, chunk, nonfinite, data, min_step, min_value, max_step, max_value"
_RANGE = 1024 // 16  # chunks per segment (models.SEGMENT_CHUNKS at this revision)
_OPEN = (
    "SELECT c.run_id, c.name_id, c.layer, c.chunk FROM metric_chunks c "
    "JOIN runs r ON r.id = c.run_id AND r.status = 'running' "
    "JOIN series_latest s ON s.run_id = c.run_id AND s.name_id = c.name_id AND s.layer = c.layer "
    f"WHERE c.chunk >= ((s.step + 1) / {_RANGE * 16}) * {_RANGE}"
)
_VIEW = f"CREATE VIEW chunk_rows AS SELECT {_COLUMNS} FROM metric_chunks UNION ALL SELECT {_COLUMNS} FROM open_chunks"


def _lock(conn: sa.Connection, *tables: str) -> None:
    if conn.dialect.name == "postgresql":
        op.execute("LOCK TABLE runs IN SHARE ROW EXCLUSIVE MODE")
    packing.lock_for_move(conn, (*packing.SEGMENT_TABLES, *tables))


def _chunk_table(name: str, rowid: bool, key_name: str | None = None) -> None:
    key = key_name or name
    op.create_table(
        name,
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("name_id", sa.Integer(), nullable=False),
        sa.Column("layer", sa.SmallInteger(), nullable=False),
        sa.Column("chunk", sa.BigInteger(), nullable=False),
        sa.Column("nonfinite", sa.SmallInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("min_step", sa.BigInteger(), nullable=True),
        sa.Column("min_value", sa.Float(), nullable=True),
        sa.Column("max_step", sa.BigInteger(), nullable=True),
        sa.Column("max_value", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("run_id", "name_id", "layer", "chunk", name=f"pk_{key}"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=f"fk_{key}_run_id_runs", ondelete="CASCADE"),
        sqlite_with_rowid=rowid,
    )


def _nonfinite_index(table: str) -> None:
    op.create_index(
        f"ix_{table}_nonfinite",
        table,
        ["run_id", "name_id", "layer", "chunk"],
        sqlite_where=sa.text("nonfinite > 0"),
        postgresql_where=sa.text("nonfinite > 0"),
    )


def _rebuild_sqlite_chunks(rowid: bool) -> None:
    """``metric_chunks`` copied into a new table of the other kind, in key order, and renamed."""
    _chunk_table("metric_chunks_new", rowid, key_name="metric_chunks")
    op.execute(
        f"INSERT INTO metric_chunks_new ({_COLUMNS}) SELECT {_COLUMNS} FROM metric_chunks "
        "ORDER BY run_id, name_id, layer, chunk"
    )
    op.execute("DROP TABLE metric_chunks")
    op.execute("ALTER TABLE metric_chunks_new RENAME TO metric_chunks")
    _nonfinite_index("metric_chunks")


def upgrade() -> None:
    conn = op.get_bind()
    _lock(conn)
    _chunk_table("open_chunks", rowid=False)
    _nonfinite_index("open_chunks")
    if conn.dialect.name == "postgresql":
        op.execute("ALTER TABLE open_chunks ALTER COLUMN data SET STORAGE EXTERNAL")
    op.execute(
        f"INSERT INTO open_chunks ({_COLUMNS}) SELECT {_COLUMNS} FROM metric_chunks "
        f"WHERE (run_id, name_id, layer, chunk) IN ({_OPEN})"
    )
    op.execute(
        "DELETE FROM metric_chunks WHERE (run_id, name_id, layer, chunk) IN "
        "(SELECT run_id, name_id, layer, chunk FROM open_chunks)"
    )
    if conn.dialect.name == "sqlite":
        _rebuild_sqlite_chunks(rowid=True)
    op.execute(_VIEW)


def downgrade() -> None:
    conn = op.get_bind()
    _lock(conn, "open_chunks")
    op.execute("DROP VIEW chunk_rows")
    op.execute(f"INSERT INTO metric_chunks ({_COLUMNS}) SELECT {_COLUMNS} FROM open_chunks")
    op.execute("DELETE FROM open_chunks")
    op.drop_index("ix_open_chunks_nonfinite", table_name="open_chunks")
    op.drop_table("open_chunks")
    if conn.dialect.name == "sqlite":
        _rebuild_sqlite_chunks(rowid=False)
