"""Runs remember the hooks process that writes them: ``runs.attach_id``.

A process attaching with ``hooks.attach`` sends a random id of its own with the run; the service
stores it and refuses (409) a *different* process that attaches with the same run name unless it
asks to resume (``hooks.attach(resume=True)``). Before, reusing a run's name silently merged a new
process into the old run, with the old run's "indicators not measured" banner. NULL: a run created
by a client that sends no id (older hooks, the JSONL upload of an older folder): any such client may
write it, as before. See monitor/store/identity.py.

Revision ID: 0009_run_identity
Revises: 0008_incidents
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_run_identity"
down_revision = "0008_incidents"
branch_labels = None
depends_on = None


# Plain ALTER TABLE on both databases (see 0006: a batch copy of ``runs`` on SQLite would cascade).
def upgrade() -> None:
    op.add_column("runs", sa.Column("attach_id", sa.String(length=64), nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "attach_id")
