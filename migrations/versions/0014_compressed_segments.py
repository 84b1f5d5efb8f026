"""Compressed segments for sealed ranges, rollups at a fraction of the data (issue 36).

A series' sealed chunks are packed, per aligned range of 1,024 steps, into one ``metric_chunks`` row
of format version 2 (values and steps by pcodec: monitor/store/segcodec.py, monitor/store/segments.py);
each row keeps its extremes (``min_step``, ``min_value``, ``max_step``, ``max_value``, new columns)
for the open range; ``metric_rollups`` keeps the 1,024-step (level 2, one per segment) and 4,096-step
(level 3) levels only: the 16- and 256-step ones cost as much as the data (monitor/store/models.py).
On PostgreSQL ``metric_chunks.data`` is ``STORAGE EXTERNAL``: TOAST keeps a segment out of line
without compressing it again.

Moves data, so it locks first (migrations/README.md): ``series_latest``, ``metric_points``,
``metric_chunks`` and ``metric_rollups`` (``packing.SEGMENT_TABLES``) before the first read, on
PostgreSQL one ``LOCK TABLE``; on SQLite the write lock. Downgrade unpacks every segment into
16-step chunks and rebuilds the 16- and 256-step rollups from the points.

Revision ID: 0014_compressed_segments
Revises: 0013_webhooks
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from hyperwatch.monitor.store import packing, segcodec

revision = "0014_compressed_segments"
down_revision = "0013_webhooks"
branch_labels = None
depends_on = None

_EXTREMES = (
    ("min_step", sa.BigInteger()),
    ("min_value", sa.Float()),
    ("max_step", sa.BigInteger()),
    ("max_value", sa.Float()),
)


def upgrade() -> None:
    conn = op.get_bind()
    packing.lock_for_move(conn, packing.SEGMENT_TABLES)  # before anything is read
    for name, kind in _EXTREMES:
        op.add_column("metric_chunks", sa.Column(name, kind, nullable=True))
    if conn.dialect.name == "postgresql":
        op.execute("ALTER TABLE metric_chunks ALTER COLUMN data SET STORAGE EXTERNAL")
    with segcodec.writing(segcodec.V2):  # the blobs of this revision (version 3: 0022)
        packing.pack_segments(conn)


def downgrade() -> None:
    conn = op.get_bind()
    packing.unpack_segments(conn)  # locks first
    for name, _kind in reversed(_EXTREMES):
        op.drop_column("metric_chunks", name)
    if conn.dialect.name == "postgresql":
        op.execute("ALTER TABLE metric_chunks ALTER COLUMN data SET STORAGE EXTENDED")
