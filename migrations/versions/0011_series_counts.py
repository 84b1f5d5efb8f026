"""Series counted per run and per project: ``runs.series_count``, ``projects.series_count``.

What the cardinality limits (issue 37, ``monitor.store.cardinality``) and the bounded reads use
instead of a ``count(*)`` per batch or per scrape: a run's distinct (name, layer) series (its
``series_latest`` rows) and the sum over a project's runs. Filled from ``series_latest`` here.

Locks first (migrations/README.md): the counts are read from ``series_latest`` and written to
``runs`` and ``projects``, so a writer committing new series between the read and the commit would
leave them short. On PostgreSQL ``runs`` then ``projects`` are locked before the read (the order
every writer takes them in: its run's row, then its project's); every writer of a point locks its
run's row first, so none is inside. On SQLite the migration holds the database's write lock.

Revision ID: 0011_series_counts
Revises: 0010_group_learning
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from hyperwatch.monitor.store.packing import lock_for_move

revision = "0011_series_counts"
down_revision = "0010_group_learning"
branch_labels = None
depends_on = None


# Plain ALTER TABLE on both databases (see 0006 and 0009: a batch copy of ``runs`` on SQLite would cascade).
def upgrade() -> None:
    lock_for_move(op.get_bind(), ("runs", "projects"))
    op.add_column("runs", sa.Column("series_count", sa.BigInteger(), nullable=False, server_default="0"))
    op.add_column("projects", sa.Column("series_count", sa.BigInteger(), nullable=False, server_default="0"))
    op.execute(
        "UPDATE runs SET series_count = (SELECT count(*) FROM series_latest AS s WHERE s.run_id = runs.id) "
        "WHERE EXISTS (SELECT 1 FROM series_latest AS s WHERE s.run_id = runs.id)"
    )
    op.execute(
        "UPDATE projects SET series_count = (SELECT coalesce(sum(r.series_count), 0) FROM runs AS r "
        "WHERE r.project_id = projects.id)"
    )


def downgrade() -> None:
    op.drop_column("projects", "series_count")
    op.drop_column("runs", "series_count")
