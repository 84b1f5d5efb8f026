"""Initial schema: projects, groups, runs, tags, metric names, points, rollups, latest, batches, alerts.

See monitor/store/models.py for why the tables look the way they do (sizing for 10^9 points,
NaN stored as NULL, WITHOUT ROWID on SQLite).

Revision ID: 0001_initial
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None

NONFINITE = "value IS NULL OR value > 1.7976931348623157e308 OR value < -1.7976931348623157e308"
SmallId = sa.SmallInteger().with_variant(sa.Integer(), "sqlite")
Double = sa.Float(precision=53).with_variant(sa.Float(), "sqlite")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "projects",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_projects"),
        sa.UniqueConstraint("name", name="uq_projects_name"),
    )
    op.create_table(
        "groups",
        sa.Column("id", sa.Integer(), autoincrement=True),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("thresholds", sa.JSON(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_groups"),
        sa.ForeignKeyConstraint(
            ["project_id"], ["projects.id"], name="fk_groups_project_id_projects", ondelete="CASCADE"
        ),
        sa.UniqueConstraint("project_id", "name", name="uq_groups_project_id_name"),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), autoincrement=True),
        sa.Column("project_id", sa.Integer(), nullable=False),
        sa.Column("group_id", sa.Integer(), nullable=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.Column("depth", sa.Integer(), nullable=True),
        sa.Column("width", sa.Integer(), nullable=True),
        sa.Column("total_params", sa.BigInteger(), nullable=True),
        sa.Column("active_params", sa.BigInteger(), nullable=True),
        sa.Column("tokens", sa.BigInteger(), nullable=True),
        sa.Column("total_steps", sa.BigInteger(), nullable=True),
        sa.Column("flops", Double, nullable=True),
        sa.Column("lr", Double, nullable=True),
        sa.Column("optimizer", sa.String(64), nullable=True),
        sa.Column("parameterization", sa.String(64), nullable=True),
        sa.Column("export_layers", sa.Boolean(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=True),
        sa.Column("last_point_at", TS, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
        sa.ForeignKeyConstraint(
            ["project_id"], ["projects.id"], name="fk_runs_project_id_projects", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["group_id"], ["groups.id"], name="fk_runs_group_id_groups", ondelete="SET NULL"),
        sa.UniqueConstraint("project_id", "name", name="uq_runs_project_id_name"),
    )
    op.create_index("ix_runs_group_id", "runs", ["group_id"])
    op.create_index("ix_runs_status", "runs", ["status"])
    op.create_table(
        "run_tags",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("tag", sa.String(100), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "tag", name="pk_run_tags"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_run_tags_run_id_runs", ondelete="CASCADE"),
    )
    op.create_index("ix_run_tags_tag", "run_tags", ["tag"])
    op.create_table(
        "metric_names",
        sa.Column("id", SmallId, autoincrement=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_metric_names"),
        sa.UniqueConstraint("name", name="uq_metric_names_name"),
    )
    op.create_table(
        "metric_points",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("name_id", SmallId, nullable=False),
        sa.Column("layer", sa.SmallInteger(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=True),
        sa.Column("value", Double, nullable=True),
        sa.PrimaryKeyConstraint("run_id", "name_id", "layer", "step", name="pk_metric_points"),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_metric_points_run_id_runs", ondelete="CASCADE"
        ),
        sqlite_with_rowid=False,
    )
    op.create_index(
        "ix_metric_points_nonfinite",
        "metric_points",
        ["run_id", "name_id", "layer", "step"],
        sqlite_where=sa.text(NONFINITE),
        postgresql_where=sa.text(NONFINITE),
    )
    op.create_table(
        "metric_rollups",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("name_id", SmallId, nullable=False),
        sa.Column("layer", sa.SmallInteger(), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("block", sa.BigInteger(), nullable=False),
        sa.Column("n_points", sa.Integer(), nullable=False),
        sa.Column("min_step", sa.BigInteger(), nullable=True),
        sa.Column("min_tokens", sa.BigInteger(), nullable=True),
        sa.Column("min_value", Double, nullable=True),
        sa.Column("max_step", sa.BigInteger(), nullable=True),
        sa.Column("max_tokens", sa.BigInteger(), nullable=True),
        sa.Column("max_value", Double, nullable=True),
        sa.PrimaryKeyConstraint("run_id", "name_id", "layer", "level", "block", name="pk_metric_rollups"),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_metric_rollups_run_id_runs", ondelete="CASCADE"
        ),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "series_latest",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("name_id", SmallId, nullable=False),
        sa.Column("layer", sa.SmallInteger(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("value", Double, nullable=True),
        sa.PrimaryKeyConstraint("run_id", "name_id", "layer", name="pk_series_latest"),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_series_latest_run_id_runs", ondelete="CASCADE"
        ),
    )
    op.create_table(
        "ingested_batches",
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("n_points", sa.Integer(), nullable=False),
        sa.Column("received_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("batch_id", name="pk_ingested_batches"),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_ingested_batches_run_id_runs", ondelete="CASCADE"
        ),
    )
    op.create_table(
        "alert_events",
        sa.Column("id", sa.Integer(), autoincrement=True),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("rule", sa.String(64), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("layer", sa.SmallInteger(), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=False),
        sa.Column("value", Double, nullable=True),
        sa.Column("baseline", Double, nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_alert_events"),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_alert_events_run_id_runs", ondelete="CASCADE"
        ),
        sa.UniqueConstraint("run_id", "rule", "name", "layer", "step", name="uq_alert_events_run_id_rule_name_layer_step"),
    )
    op.create_index("ix_alert_events_created_at", "alert_events", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_alert_events_created_at", table_name="alert_events")
    op.drop_table("alert_events")
    op.drop_table("ingested_batches")
    op.drop_table("series_latest")
    op.drop_table("metric_rollups")
    op.drop_index("ix_metric_points_nonfinite", table_name="metric_points")
    op.drop_table("metric_points")
    op.drop_table("metric_names")
    op.drop_index("ix_run_tags_tag", table_name="run_tags")
    op.drop_table("run_tags")
    op.drop_index("ix_runs_status", table_name="runs")
    op.drop_index("ix_runs_group_id", table_name="runs")
    op.drop_table("runs")
    op.drop_table("groups")
    op.drop_table("projects")
