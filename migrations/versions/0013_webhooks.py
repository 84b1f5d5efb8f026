"""Notifications without Alertmanager: per-project webhooks and their delivery outbox (issue 35).

``webhooks``: a project's Slack-compatible or generic JSON webhook, with the lowest incident severity
it wants. ``webhook_deliveries``: the outbox, one row per incident and webhook, inserted by the
transaction that opens the incident (monitor/store/incidents.py), so a notification commits with its
incident or not at all; the service's deliverer (monitor/alerting/notify.py) sends and retries it.

Schema only: two new tables, no existing row is read or moved, so nothing is locked first
(migrations/README.md). The downgrade drops them (pending notifications with them).

Revision ID: 0013_webhooks
Revises: 0012_run_archived
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_webhooks"
down_revision = "0012_run_archived"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "webhooks",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False, server_default=""),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("format", sa.String(16), nullable=False),
        sa.Column("min_severity", sa.String(16), nullable=False),
        sa.Column("include_prometheus", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_webhooks"),
        sa.ForeignKeyConstraint(
            ["project_id"], ["projects.id"], name="fk_webhooks_project_id_projects", ondelete="CASCADE"
        ),
        sa.UniqueConstraint("project_id", "url", name="uq_webhooks_project_id_url"),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("webhook_id", sa.Integer(), nullable=False),
        sa.Column("incident_id", sa.Integer(), nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_http_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_webhook_deliveries"),
        sa.ForeignKeyConstraint(
            ["webhook_id"], ["webhooks.id"], name="fk_webhook_deliveries_webhook_id_webhooks", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["incident_id"], ["incidents.id"], name="fk_webhook_deliveries_incident_id_incidents", ondelete="CASCADE"
        ),
        sa.UniqueConstraint("webhook_id", "incident_id", name="uq_webhook_deliveries_webhook_id_incident_id"),
    )
    op.create_index("ix_webhook_deliveries_status_next_attempt_at", "webhook_deliveries", ["status", "next_attempt_at"])
    op.create_index("ix_webhook_deliveries_incident_id", "webhook_deliveries", ["incident_id"])


def downgrade() -> None:
    op.drop_index("ix_webhook_deliveries_incident_id", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_status_next_attempt_at", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhooks")
