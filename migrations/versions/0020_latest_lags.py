"""``series_latest`` on PostgreSQL is no longer rewritten by batches that go to ``point_batches`` (issue 36).

From this revision on, a batch that only appends new steps and seals no chunk (15 of 16 in steady
training) leaves the ``series_latest`` rows of the series it already had as they were; the readers
merge the run's pending rows (``monitor.store.latest``). Side by side, the store's time for such a
batch went from 5.56 to 3.65 ms. The schema does not change, but what the table holds does: code
before this revision reads the table as exact.

Upgrade: nothing to move (every row is exact under the old code). Downgrade: each row brought to its
series' newest pending step, under a lock that keeps writers out until the revision is recorded, so
the code before it finds the table exact again. SQLite keeps no pending rows: nothing to do there.

Revision ID: 0020_latest_lags
Revises: 0019_batch_ranges
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from hyperwatch.monitor.store import packing

revision = "0020_latest_lags"
down_revision = "0019_batch_ranges"
branch_labels = None
depends_on = None

_CATCH_UP = """
UPDATE series_latest AS t SET step = u.step, value = nullif(u.value, 'NaN')
FROM (
  SELECT DISTINCT ON (b.run_id, b.name_id, e.layer) b.run_id, b.name_id, e.layer::int AS layer, e.step, e.value
  FROM point_batches b CROSS JOIN LATERAL unnest(b.layer, b.step, b.value) AS e(layer, step, value)
  ORDER BY b.run_id, b.name_id, e.layer, e.step DESC
) AS u
WHERE t.run_id = u.run_id AND t.name_id = u.name_id AND t.layer = u.layer AND u.step > t.step
"""


def upgrade() -> None:
    """Nothing to move: every row is exact as the code before left it; only what later batches write changes."""


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    packing.lock_for_move(conn, ("point_batches", "series_latest"))
    conn.execute(sa.text(_CATCH_UP))
