"""``series_latest`` keeps half of each PostgreSQL page free for its rows' next versions (issue 36).

Every batch rewrites the ``series_latest`` row of each series it carries. On pages filled to 100% the
new version of a row finds no room beside the old one, so PostgreSQL writes it to another page and a
new entry into the primary key (no heap-only tuple): on issue 36's workload (512 series, 2,000
batches) the table ended at 131 KB for 28 KB of live rows and its key at 57 KB (0.18 B/pt, after
VACUUM). With ``fillfactor`` 50 a page keeps room for a new version of every row on it, so the update
stays on its page, the key is not written, and the next update prunes the old version: 64 KB and
33 KB (``bench/storage_parts.py``). The models' docstring claimed this setting since issue 36's
first round; no revision had set it.

Schema only: ``ALTER TABLE .. SET`` takes its own lock and rewrites nothing; pages already full get
their room as their rows move. SQLite has no such setting (its ``WITHOUT ROWID`` b-tree rewrites a
row in place): nothing to do there.

Revision ID: 0018_latest_fillfactor
Revises: 0017_batch_keys
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0018_latest_fillfactor"
down_revision = "0017_batch_keys"
branch_labels = None
depends_on = None

FILLFACTOR = 50


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE series_latest SET (fillfactor = {FILLFACTOR})")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE series_latest RESET (fillfactor)")
