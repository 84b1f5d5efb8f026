"""Runs remember the indicators the hooks could not measure: runs.unavailable (JSON, nullable).

The hooks send ``{"attention_z@3": "reason and fix", ...}`` when they create or update the run;
the run page lists them, so a missing panel is explained instead of silently absent. NULL means
none (rows written before this revision).

Revision ID: 0002_run_unavailable
Revises: 0001_initial
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_run_unavailable"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("unavailable", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("unavailable")
