"""Alert events carry their source: "service" (the detectors) or "prometheus" (Alertmanager).

The service stores both kinds side by side so that one page lists every alert a run raised; the
column defaults to "service", which is what every alert stored before this revision was.

Revision ID: 0004_alert_source
Revises: 0002_run_unavailable
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_alert_source"
down_revision = "0002_run_unavailable"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("alert_events") as batch:
        batch.add_column(sa.Column("source", sa.String(16), nullable=False, server_default="service"))


def downgrade() -> None:
    with op.batch_alter_table("alert_events") as batch:
        batch.drop_column("source")
