"""Archived runs: ``runs.archived`` (issue 35).

An archived run is kept whole (points, alerts, incidents) but left out of the runs list, a group's
scale comparison and the alert lists unless they are asked for it (``?archived=true``,
``?include_archived=true``); ``PATCH /api/v1/runs/{id}`` with ``{"archived": false}`` brings it back.

Schema only: one column with a default, no row is read or moved, so nothing is locked first
(migrations/README.md; PostgreSQL's ``ALTER TABLE`` takes its own exclusive lock, SQLite's
``hyperwatch db`` holds the write lock). A plain ``ADD COLUMN`` on both databases (see 0006 and 0009:
a batch copy of ``runs`` on SQLite would cascade to every table that references it).

Revision ID: 0012_run_archived
Revises: 0011_series_counts
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_run_archived"
down_revision = "0011_series_counts"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("archived", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    op.drop_column("runs", "archived")
