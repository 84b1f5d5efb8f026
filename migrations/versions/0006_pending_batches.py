"""Runs carry an ingest token; new steps wait as pending batches (PostgreSQL); SQLite packs chunks.

``runs.ingest_token`` and ``runs.prior_token`` (see monitor/store/ingest.py): every batch of a run
first locks the run's row and swaps its ``ingest_token`` for a new random 62-bit number, returning
the one it found (``prior_token``), in the same statement that records the run's progress. A service
keeps, per run, the latest step of each series as of the token it last committed; when the row
still holds that token no other writer has stored a point of the run since (nor was the database
replaced by a restore), and the service need not read its ``series_latest`` rows again (issue 16:
that read, with a row lock per series, cost ~1 ms of a 512-point batch on PostgreSQL). Existing
runs start at 0, which no cache holds.

``point_batches`` and the view ``hot_points`` (PostgreSQL; see monitor/store/pending.py): a batch of
new steps is stored as one row of arrays per metric name until the chunks it belongs to seal; the
view is every hot point, ``metric_points`` rows and pending elements alike, which the reads select
from. SQLite gets the table (one schema on both) and never fills it.

SQLite's sealed points move into packed chunks here (PostgreSQL's did in 0005): a 10^7-point
database upgrades in ~41 s on a 2-core machine (``bench/migration.py --steps 20000``); run
``VACUUM`` afterwards to give the freed pages back (45 -> 14 bytes per point there).

Downgrade turns pending elements (PostgreSQL) or chunks (SQLite) back into ``metric_points`` rows,
the tables locked first (:func:`monitor.store.packing.lock_for_move`; ``migrations/README.md``).

Revision ID: 0006_pending_batches
Revises: 0005_metric_chunks
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from hyperwatch.monitor.store import packing

revision = "0006_pending_batches"
down_revision = "0005_metric_chunks"
branch_labels = None
depends_on = None


# Plain ALTER TABLE on both databases (SQLite >= 3.35 drops a column in place): a batch (copy and
# rename) of ``runs`` on SQLite would drop the old table, and its ON DELETE CASCADE every point with it.
def upgrade() -> None:
    op.add_column("runs", sa.Column("ingest_token", sa.BigInteger(), nullable=False, server_default="0"))
    op.add_column("runs", sa.Column("prior_token", sa.BigInteger(), nullable=False, server_default="0"))
    op.create_table(
        "point_batches",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("name_id", SmallId, nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("layer", _array(sa.SmallInteger()), nullable=False),
        sa.Column("step", _array(sa.BigInteger()), nullable=False),
        sa.Column("tokens", _array(sa.BigInteger()), nullable=False),
        sa.Column("value", _array(sa.Float(precision=53)), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "name_id", "token", name="pk_point_batches"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_point_batches_run_id_runs", ondelete="CASCADE"),
    )
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        op.execute(f"CREATE VIEW hot_points AS {_ROWS} UNION ALL {_PENDING}")
    else:
        packing.pack_sealed(conn)


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        # locked before the copy: a batch a service commits between the copy and the drop would be
        # dropped after its 201 (issue 25); a writer now waits, then fails on the old schema, unanswered
        packing.lock_for_move(conn, ("point_batches", "metric_points"))
        op.execute(f"INSERT INTO metric_points (run_id, name_id, layer, step, tokens, value) {_PENDING}")
        op.execute("DROP VIEW hot_points")
    else:
        packing.unpack(conn)
    op.drop_table("point_batches")
    op.execute("ALTER TABLE runs DROP COLUMN prior_token")
    op.execute("ALTER TABLE runs DROP COLUMN ingest_token")


SmallId = sa.SmallInteger().with_variant(sa.Integer(), "sqlite")
_ROWS = "SELECT run_id, name_id, layer, step, tokens, value FROM metric_points"
# the elements with the rows' conventions: no token count is NULL (sent as -1), NaN is NULL
_PENDING = (
    "SELECT b.run_id, b.name_id, u.layer, u.step, nullif(u.tokens, -1), nullif(u.value, 'NaN'::float8) "
    "FROM point_batches AS b CROSS JOIN LATERAL unnest(b.layer, b.step, b.tokens, b.value) AS u(layer, step, tokens, value)"
)


def _array(element: sa.types.TypeEngine) -> sa.types.TypeEngine:
    return sa.LargeBinary().with_variant(postgresql.ARRAY(element), "postgresql")
