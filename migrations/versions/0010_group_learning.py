"""Groups may learn thresholds from their finished healthy runs: ``groups.learn_thresholds``, ``groups.learned``.

``learn_thresholds`` (nullable boolean): the group's setting (``PATCH /api/v1/groups/{id}``); NULL
follows the service's default (``monitor.thresholds.defaults.LEARN_BY_DEFAULT``). ``learned`` (nullable
JSON): what the service read from the group's finished healthy runs, the peaks of the metrics it
learns from and the runs they came from (``monitor.thresholds.learned``), written when a run of the
group finishes or the group's learning setting is sent; NULL: not read yet. Existing groups get
NULL in both: nothing changes until a group turns learning on.

Revision ID: 0010_group_learning
Revises: 0009_run_identity
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_group_learning"
down_revision = "0009_run_identity"
branch_labels = None
depends_on = None


# Plain ALTER TABLE on both databases (SQLite >= 3.35 drops a column in place; see 0006 and 0009): a
# batch (copy and rename) of ``groups`` on SQLite would drop the old table, and its ON DELETE SET NULL
# every run's group with it. Schema only, no data moved: nothing to lock first (migrations/README.md).
def upgrade() -> None:
    op.add_column("groups", sa.Column("learn_thresholds", sa.Boolean(), nullable=True))
    op.add_column("groups", sa.Column("learned", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("groups", "learned")
    op.drop_column("groups", "learn_thresholds")
