"""Runs count their ingest transactions: ``runs.ingest_seq``, raised by one by every stored batch.

Every batch of a run first locks the run's row and raises its ``ingest_seq`` (one statement, which
also records the run's progress). A service keeps, per run, the latest step of each series as of
the ``ingest_seq`` it last committed; when the row still holds that number no other writer has
stored a point of the run since, and the service need not read its ``series_latest`` rows again
(issue 16: that read, with a row lock per series, cost ~1 ms of a 512-point batch on PostgreSQL).
Existing runs start at 0, which no cache holds yet.

Revision ID: 0006_run_ingest_seq
Revises: 0005_metric_chunks
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_run_ingest_seq"
down_revision = "0005_metric_chunks"
branch_labels = None
depends_on = None


# Plain ALTER TABLE on both databases (SQLite >= 3.35 drops a column in place): a batch (copy and
# rename) of ``runs`` on SQLite would drop the old table, and its ON DELETE CASCADE every point with it.
def upgrade() -> None:
    op.add_column("runs", sa.Column("ingest_seq", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.execute("ALTER TABLE runs DROP COLUMN ingest_seq")
