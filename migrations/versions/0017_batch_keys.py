"""Batch ids stored compactly: 17-byte keys, Unix milliseconds, and on SQLite no rowid (issue 36).

One ``ingested_batches`` row per request keeps ingest exactly-once (a retried batch is answered as a
duplicate). For short runs logged in small requests that row cost more than the points it carried
(the real-hooks fixture of ``bench/storage.py``: 28 points a request, ~124 bytes a batch on SQLite,
5.1 of its 15 B/pt). Now:

- ``batch_id`` is ``monitor.store.points.batch_key``: a 32-digit lowercase hex id (the hooks' uuid4
  hex) as a 0 byte and its 16 bytes, any other id as its ASCII bytes (ids never start with a 0 byte,
  so keys stay distinct); ``bytea`` / ``BLOB``;
- ``received_at`` (a timestamp; on SQLite 26 characters of text) becomes ``received_ms``, Unix
  milliseconds (BIGINT), what Prometheus' timestamps are;
- SQLite's table is ``WITHOUT ROWID``: clustered on its key (run, id), where the rowid table kept
  the key twice (the row and its automatic index).

SQLite: ~36 bytes a batch instead of ~124 (measured with 1 KB pages, random ids). PostgreSQL keeps
its heap table and rewrites it in place (one ``ALTER TABLE``). On SQLite ``series_latest`` (one
short row per series, updated by every batch) becomes ``WITHOUT ROWID`` too: one b-tree for its key
and row instead of two, so each batch's update of a series' row finds it in one descent.

Moves data (every row is rewritten), so it locks first (migrations/README.md): PostgreSQL's
``ALTER TABLE`` under ``LOCK TABLE .. ACCESS EXCLUSIVE`` (a writer inside is waited for and its row
converted; a later one fails against the new column type, unacknowledged, and retries); SQLite
copies into a new table under the database's write lock. Downgrade turns keys back into the ids and
the milliseconds into timestamps (UTC).

Revision ID: 0017_batch_keys
Revises: 0016_toast_split
Create Date: 2026-11-30
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

from hyperwatch.monitor.store import packing

revision = "0017_batch_keys"
down_revision = "0016_toast_split"
branch_labels = None
depends_on = None

_HEX = re.compile("[0-9a-f]{32}")
_ROWS = 5_000


def _key(batch_id: str) -> bytes:  # points.batch_key at this revision
    return b"\x00" + bytes.fromhex(batch_id) if _HEX.fullmatch(batch_id) else batch_id.encode("ascii")


def _id(key: bytes) -> str:
    key = bytes(key)
    return key[1:].hex() if key[:1] == b"\x00" else key.decode("ascii")


def _ms(text: str) -> int:  # SQLAlchemy's DateTime on SQLite: ISO text, naive meaning UTC
    at = datetime.fromisoformat(text)
    return int((at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp() * 1000)


def _stamp(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None).isoformat(" ", timespec="microseconds")


def upgrade() -> None:
    conn = op.get_bind()
    packing.lock_for_move(conn, ("ingested_batches",))
    if conn.dialect.name == "postgresql":
        op.execute(
            "ALTER TABLE ingested_batches ALTER COLUMN batch_id TYPE bytea USING (CASE WHEN batch_id ~ "
            "'^[0-9a-f]{32}$' THEN '\\x00'::bytea || decode(batch_id, 'hex') ELSE convert_to(batch_id, 'UTF8') END), "
            "ALTER COLUMN received_at TYPE bigint USING floor(extract(epoch FROM received_at) * 1000)::bigint"
        )
        op.execute("ALTER TABLE ingested_batches RENAME COLUMN received_at TO received_ms")
        return
    _copy_sqlite(
        [
            sa.Column("batch_id", sa.LargeBinary(65), nullable=False),
            sa.Column("run_id", sa.Integer(), nullable=False),
            sa.Column("n_points", sa.Integer(), nullable=False),
            sa.Column("received_ms", sa.BigInteger(), nullable=False),
        ],
        "received_at",
        lambda row: (_key(row[0]), row[1], row[2], _ms(row[3])),
        sqlite_with_rowid=False,
    )
    _rebuild_sqlite("series_latest", rowid=False)


def downgrade() -> None:
    conn = op.get_bind()
    packing.lock_for_move(conn, ("ingested_batches",))
    if conn.dialect.name == "postgresql":
        op.execute("ALTER TABLE ingested_batches RENAME COLUMN received_ms TO received_at")
        op.execute(
            "ALTER TABLE ingested_batches ALTER COLUMN batch_id TYPE varchar(64) USING (CASE WHEN "
            "octet_length(batch_id) = 17 AND get_byte(batch_id, 0) = 0 THEN encode(substring(batch_id FROM 2), 'hex') "
            "ELSE convert_from(batch_id, 'UTF8') END), "
            "ALTER COLUMN received_at TYPE timestamptz USING to_timestamp(received_at / 1000.0)"
        )
        return
    _copy_sqlite(
        [
            sa.Column("batch_id", sa.String(64), nullable=False),
            sa.Column("run_id", sa.Integer(), nullable=False),
            sa.Column("n_points", sa.Integer(), nullable=False),
            sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        ],
        "received_ms",
        lambda row: (_id(row[0]), row[1], row[2], _stamp(row[3])),
        sqlite_with_rowid=True,
    )
    _rebuild_sqlite("series_latest", rowid=True)


def _copy_sqlite(columns: list[sa.Column], old_time: str, convert, **table_kw: bool) -> None:  # type: ignore[no-untyped-def]
    """SQLite: a new table, every row converted in Python (SQLite 3.40 has no ``unhex``), the old one
    dropped; the database's write lock is held from before the first read (``lock_for_move``)."""
    conn = op.get_bind()
    op.create_table(
        "ingested_batches_new",
        *columns,
        sa.PrimaryKeyConstraint("run_id", "batch_id", name="pk_ingested_batches"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_ingested_batches_run_id_runs", ondelete="CASCADE"),
        **table_kw,
    )
    names = [c.name for c in columns]
    insert = sa.text(
        f"INSERT INTO ingested_batches_new ({', '.join(names)}) VALUES ({', '.join(':' + n for n in names)})"
    )
    rows = conn.execute(sa.text(f"SELECT batch_id, run_id, n_points, {old_time} FROM ingested_batches"))
    while part := rows.fetchmany(_ROWS):
        conn.execute(insert, [dict(zip(names, convert(row), strict=True)) for row in part])
    op.drop_table("ingested_batches")
    op.rename_table("ingested_batches_new", "ingested_batches")


def _rebuild_sqlite(table: str, rowid: bool) -> None:
    """SQLite: ``table`` copied into one of the same definition with or without its rowid."""
    conn = op.get_bind()
    ddl = conn.execute(
        sa.text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :t"), {"t": table}
    ).scalar()
    ddl = re.sub(r"\s*WITHOUT\s+ROWID\s*$", "", str(ddl), flags=re.IGNORECASE)
    op.execute(ddl.replace(table, f"{table}_new", 1) + ("" if rowid else " WITHOUT ROWID"))
    op.execute(f"INSERT INTO {table}_new SELECT * FROM {table}")
    op.drop_table(table)
    op.rename_table(f"{table}_new", table)
