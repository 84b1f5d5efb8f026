"""Sealed points packed into ``metric_chunks``: one row per series and 16 steps instead of one per point.

Why: on PostgreSQL a one-row-per-point table costs ~94 B a point whatever it holds (tuple header,
line pointer, index entry); a chunk row spreads that over 16 points (see monitor/store/models.py
and monitor/store/chunks.py for the format). SQLite gets the (empty) table but keeps its points as
rows (monitor/store/compact.py says why).

On PostgreSQL, upgrade moves every series' points below its sealed boundary
(``(latest + 1) // 16 * 16``, latest from ``series_latest``) into chunks and deletes them from
``metric_points``, and gives ``series_latest`` fillfactor 50 (see below); downgrade unpacks every
chunk back into ``metric_points``. On both, a series with points but no ``series_latest`` row
(never written by the service; a hand load) gets one first, since the writer reads each series'
boundary from there.

Revision ID: 0005_metric_chunks
Revises: 0004_alert_source
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from hyperwatch.monitor.store import packing

revision = "0005_metric_chunks"
down_revision = "0004_alert_source"
branch_labels = None
depends_on = None

SmallId = sa.SmallInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "metric_chunks",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("name_id", SmallId, nullable=False),
        sa.Column("layer", sa.SmallInteger(), nullable=False),
        sa.Column("chunk", sa.BigInteger(), nullable=False),
        sa.Column("nonfinite", sa.SmallInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "name_id", "layer", "chunk", name="pk_metric_chunks"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_metric_chunks_run_id_runs", ondelete="CASCADE"),
        sqlite_with_rowid=False,
    )
    op.create_index(
        "ix_metric_chunks_nonfinite",
        "metric_chunks",
        ["run_id", "name_id", "layer", "chunk"],
        sqlite_where=sa.text("nonfinite > 0"),
        postgresql_where=sa.text("nonfinite > 0"),
    )
    conn = op.get_bind()
    packing.lock_for_move(conn, packing.MOVED_TABLES)  # before the first read of what it moves
    if conn.dialect.name == "postgresql":
        # rewritten by every batch: room on each page lets an update stay on its page (HOT) and the
        # dead versions be pruned there, instead of the table growing by a row per series and batch
        op.execute("ALTER TABLE series_latest SET (fillfactor = 50)")
    conn.execute(
        sa.text(
            "INSERT INTO series_latest (run_id, name_id, layer, step, value) "
            "SELECT p.run_id, p.name_id, p.layer, p.step, p.value FROM metric_points AS p "
            "WHERE p.step = (SELECT max(q.step) FROM metric_points AS q WHERE q.run_id = p.run_id "
            "AND q.name_id = p.name_id AND q.layer = p.layer) AND NOT EXISTS (SELECT 1 FROM series_latest AS s "
            "WHERE s.run_id = p.run_id AND s.name_id = p.name_id AND s.layer = p.layer)"
        )
    )
    if conn.dialect.name == "postgresql":  # SQLite kept its rows until revision 0006
        packing.pack_sealed(conn)


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        op.execute("ALTER TABLE series_latest RESET (fillfactor)")
    packing.unpack(conn)
    op.drop_index("ix_metric_chunks_nonfinite", table_name="metric_chunks")
    op.drop_table("metric_chunks")
