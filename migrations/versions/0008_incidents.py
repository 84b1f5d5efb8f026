"""Incidents: the alert events of one run, rule and episode, grouped (issue 21).

A run that goes wrong raises an alert event per layer, head and step; an incident is what a person
reads: one row per run, rule and episode with the layers, heads and steps inside (see
monitor/store/incidents.py). Existing alert events are grouped into incidents here, in the order
they were stored, by the same rule the service applies to new ones.

Revision ID: 0008_incidents
Revises: 0007_metric_name_ids
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_incidents"
down_revision = "0007_metric_name_ids"
branch_labels = None
depends_on = None

Double = sa.Float(precision=53).with_variant(sa.Float(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "incidents",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("rule", sa.String(64), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("first_step", sa.BigInteger(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("events", sa.Integer(), nullable=False),
        sa.Column("first_value", Double, nullable=True),
        sa.Column("peak_value", Double, nullable=True),
        sa.Column("baseline", Double, nullable=True),
        sa.Column("layers", sa.Text(), nullable=False),
        sa.Column("heads", sa.Text(), nullable=False),
        sa.Column("steps", sa.Text(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_incidents"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_incidents_run_id_runs", ondelete="CASCADE"),
    )
    op.create_index("ix_incidents_run_id_rule_source_last_step", "incidents", ["run_id", "rule", "source", "last_step"])
    _group_existing()


def _group_existing() -> None:
    """Existing alert events into incidents, oldest first (the grouping rule of monitor.store.incidents)."""
    from hyperwatch.monitor.store.incidents import record_rows  # the one grouping rule, old events and new

    conn = op.get_bind()
    rows = conn.execute(
        sa.text(
            "SELECT run_id, rule, severity, name, layer, step, value, baseline, message, source "
            "FROM alert_events ORDER BY run_id, id"
        )
    ).fetchall()
    record_rows(conn, [tuple(r) for r in rows])


def downgrade() -> None:
    op.drop_index("ix_incidents_run_id_rule_source_last_step", table_name="incidents")
    op.drop_table("incidents")
