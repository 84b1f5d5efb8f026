"""Segment blobs of format version 3: varint headers, pcodec's wrapped columns (issue 36).

Version 3 (``monitor.store.segcodec``) writes a segment's header as varints (its span, count, regular
steps and linear tokens: 8 to 32 bytes before, about a third of that now) and each pcodec column in its
wrapped form (chunk metadata and one page), leaving out the 15-16 bytes of framing pcodec's standalone
form repeats per column; the file header is kept once per blob. On the real-hooks fixture of
``bench/storage.py`` (50-point series) a segment is ~35 bytes shorter, ~0.7 bytes a point. The schema
does not change; what the blobs hold does: the code before this revision reads version 2 only.

Upgrade: every version-2 segment rewritten as version 3; downgrade: every version-3 one as version 2.
Both under a lock taken before the first read (the house rule, ``migrations/README.md``): the runs
against writers on PostgreSQL, then the two chunk tables; SQLite's write lock. The code reads both
versions, so a row a writer of the code before this revision adds after the upgrade (a version-2
segment) is read as it is.

Revision ID: 0022_segment_v3
Revises: 0021_stopped_tails
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

from hyperwatch.monitor.store import packing, segcodec

revision = "0022_segment_v3"
down_revision = "0021_stopped_tails"
branch_labels = None
depends_on = None


def upgrade() -> None:
    packing.recode_segments(op.get_bind(), segcodec.V3)


def downgrade() -> None:
    packing.recode_segments(op.get_bind(), segcodec.V2)
