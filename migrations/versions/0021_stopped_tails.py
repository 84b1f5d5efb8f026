"""A stopped run's last, unsealed steps live in its segments, not in the hot rows (issue 36).

From this revision on, when a run stops each series' points
from its sealed boundary on are moved out of ``metric_points`` (and on PostgreSQL ``point_batches``)
into the partial segment of its open range, whose span then reaches past the boundary; they are put
back before the run is written again (``monitor.store.tail``). The schema does not change; what the
rows hold does: the writers before this revision take every point past a boundary to be a hot row.

Upgrade: every run that is not running folded now. Downgrade: every folded run put back. Both under
a lock on the tables they move between (the house rule, ``migrations/README.md``): the run rows first,
since a fold gives its run a new ingest token, then the hot tables and the chunks.

Revision ID: 0021_stopped_tails
Revises: 0020_latest_lags
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from hyperwatch.monitor.store import packing, segcodec, tail

revision = "0021_stopped_tails"
down_revision = "0020_latest_lags"
branch_labels = None
depends_on = None

LOCKED = ("runs", "point_batches", "metric_points", "series_latest", "open_chunks", "metric_chunks", "metric_rollups")
_STOPPED = sa.text("SELECT id FROM runs WHERE status <> 'running' ORDER BY id")


def upgrade() -> None:
    conn = op.get_bind()
    packing.lock_for_move(conn, LOCKED)
    with segcodec.writing(segcodec.V2):  # the blobs of this revision (version 3: 0022)
        for (run_id,) in conn.execute(_STOPPED).all():
            tail.seal_stopped(conn, int(run_id))


def downgrade() -> None:
    conn = op.get_bind()
    packing.lock_for_move(conn, LOCKED)
    with segcodec.writing(segcodec.V2):
        for (run_id,) in conn.execute(_STOPPED).all():
            tail.unfold(conn, int(run_id))
