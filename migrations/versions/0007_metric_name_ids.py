"""Metric-name ids are INTEGER (2,147,483,647 names instead of 32,767); batch ids are per run (issue 25).

``metric_names.id`` and every ``name_id`` column (``metric_points``, ``metric_chunks``,
``metric_rollups``, ``series_latest``, ``point_batches``) were SMALLINT on PostgreSQL, with a
smallint sequence: a team with free ``user.*`` names and per-matrix ``weight_norm.*`` names could
reach 32,767 honestly, and one refused request could exhaust the sequence for everyone. On SQLite
these columns were already INTEGER (64-bit rowids): nothing to change there, both directions.

PostgreSQL rewrites each table (``ALTER COLUMN .. TYPE integer``; the view ``hot_points`` reads two
of them, so it is dropped and made again in the same transaction). Every table is locked first, in
one statement, so that no writer holds one of them while the migration waits for another. The hot
tables' rows grow by up to 8 bytes (alignment); chunks, which hold almost every point, by 2.
Writers wait while it runs: measured 0.83 s each way for 1,024,000 points (``bench/migration.py``'s
fill, 2,000 steps; this 2-core machine at load ~7), so about 15 minutes per 10^9 points.

Downgrade narrows the columns back; it refuses, naming the highest id, when a name id above 32,767
is in use (a SMALLINT cannot hold it), and otherwise sets the sequence back to the highest id in
use so that it fits ``AS smallint``.

``ingested_batches``: the primary key is ``(run_id, batch_id)`` instead of ``batch_id``: the same
id sent for a second run (an upload of one folder into two projects) was answered ``duplicate``
and stored nothing. PostgreSQL swaps the key's index; SQLite, which cannot alter a primary key,
copies the table into a new one under the migration's write lock. Downgrade keeps, of ids used by
several runs, the record of the lowest run id (a later send of the others' batch would be stored
again: the same points, last write wins).

Revision ID: 0007_metric_name_ids
Revises: 0006_pending_batches
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from hyperwatch.monitor.store import packing

revision = "0007_metric_name_ids"
down_revision = "0006_pending_batches"
branch_labels = None
depends_on = None

# every table with a metric-name id column, in the one order all of them are locked
TABLES = ("metric_names", "metric_points", "metric_chunks", "metric_rollups", "series_latest", "point_batches")
SMALLINT_MAX = 32_767

_HOT_POINTS = (
    "CREATE VIEW hot_points AS "
    "SELECT run_id, name_id, layer, step, tokens, value FROM metric_points UNION ALL "
    "SELECT b.run_id, b.name_id, u.layer, u.step, nullif(u.tokens, -1), nullif(u.value, 'NaN'::float8) "
    "FROM point_batches AS b CROSS JOIN LATERAL unnest(b.layer, b.step, b.tokens, b.value) AS u(layer, step, tokens, value)"
)


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _retype("integer")
    _batch_key("run_id, batch_id")


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        op.execute(f"LOCK TABLE {', '.join(TABLES)} IN ACCESS EXCLUSIVE MODE")
        top = conn.execute(sa.text("SELECT max(id) FROM metric_names")).scalar()
        if top is not None and top > SMALLINT_MAX:
            raise RuntimeError(
                f"cannot downgrade below 0007_metric_name_ids: metric_names holds id {top}, beyond the "
                f"{SMALLINT_MAX} a SMALLINT of revision 0006 can hold; delete the names above {SMALLINT_MAX} "
                "(and their points) first, or stay at this revision"
            )
        # the sequence may have drawn past the highest id in use (a name inserted by two writers at once)
        op.execute(
            "SELECT setval('metric_names_id_seq', coalesce((SELECT max(id) FROM metric_names), 1), "
            "(SELECT max(id) FROM metric_names) IS NOT NULL)"
        )
        _retype("smallint")
    # one record per batch id again: the lowest run's (ids are random per batch: rare)
    op.execute(
        "DELETE FROM ingested_batches WHERE EXISTS (SELECT 1 FROM ingested_batches AS o "
        "WHERE o.batch_id = ingested_batches.batch_id AND o.run_id < ingested_batches.run_id)"
    )
    _batch_key("batch_id")


def _batch_key(columns: str) -> None:
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        op.execute("LOCK TABLE ingested_batches IN ACCESS EXCLUSIVE MODE")
        op.execute(
            "ALTER TABLE ingested_batches DROP CONSTRAINT pk_ingested_batches, "
            f"ADD CONSTRAINT pk_ingested_batches PRIMARY KEY ({columns})"
        )
        return
    # SQLite: a new table, the rows copied, the old one dropped; the write lock is held (packing.lock_for_move)
    packing.lock_for_move(conn, ("ingested_batches",))
    op.create_table(
        "ingested_batches_new",
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("n_points", sa.Integer(), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(*columns.split(", "), name="pk_ingested_batches"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_ingested_batches_run_id_runs", ondelete="CASCADE"),
    )
    op.execute(
        "INSERT INTO ingested_batches_new (batch_id, run_id, n_points, received_at) "
        "SELECT batch_id, run_id, n_points, received_at FROM ingested_batches"
    )
    op.drop_table("ingested_batches")
    op.rename_table("ingested_batches_new", "ingested_batches")


def _retype(sql_type: str) -> None:
    op.execute(f"LOCK TABLE {', '.join(TABLES)} IN ACCESS EXCLUSIVE MODE")
    op.execute("DROP VIEW hot_points")
    op.execute(f"ALTER SEQUENCE metric_names_id_seq AS {sql_type}")
    op.execute(f"ALTER TABLE metric_names ALTER COLUMN id TYPE {sql_type}")
    for table in TABLES[1:]:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN name_id TYPE {sql_type}")
    op.execute(_HOT_POINTS)
