"""The hooks' sequence batch ids kept as ranges, one row a writer session (issue 36).

Every request cost one ``ingested_batches`` row, whatever it held: on a long real-hooks run logged every
step (36 points a request) 1.07 of SQLite's 4.48 bytes a point and 3.64 of PostgreSQL's 6.71. The hooks
now number a run's batches within their process (``<session>-<n>``, ``<session>-<first>-<last>`` for
merged ones), and the service keeps each session's claimed numbers as ranges in ``batch_ranges``
(``monitor.store.claims``). Other ids keep their row in ``ingested_batches``.

Upgrade: the table; ``ingested_batches`` rows whose id has the sequence form (a service downgraded and
upgraded again, or one of the code before this revision that stored the new hooks' ids) moved into
ranges; and a guard on ``ingested_batches`` that refuses a sequence id (PostgreSQL a ``CHECK``, SQLite a
trigger). The guard is what keeps the exactly-once promise across the move: a service process still
running the code before this revision stores the hooks' ids there, and the service after it would not
look for them. With the guard its request fails unacknowledged and is sent again, to a service that
claims it as a range. Moves data, so it locks first (migrations/README.md).

Downgrade: each range back into one ``ingested_batches`` row a number (``<session>-<n>``; the range's
point count on its first row, 0 on the others, since a range keeps only the total), the guard and the
table dropped. A merged request's own id (``<session>-<first>-<last>``) is not among them: a retry of
one to the code before this revision is stored again, as any request sent for the first time is.

Revision ID: 0019_batch_ranges
Revises: 0018_latest_fillfactor
Create Date: 2026-12-01
"""

from __future__ import annotations

import re
from collections import defaultdict

import sqlalchemy as sa
from alembic import op

from hyperwatch.monitor.store import packing

revision = "0019_batch_ranges"
down_revision = "0018_latest_fillfactor"
branch_labels = None
depends_on = None

_SEQUENCE = re.compile(r"([0-9a-f]{32})-([0-9a-f]{1,12})(?:-([0-9a-f]{1,12}))?")  # hooks.schema.SEQUENCE_ID
_PG_SEQUENCE = "^[0-9a-f]{32}-[0-9a-f]{1,12}(-[0-9a-f]{1,12})?$"
_GUARD = "ck_ingested_batches_not_sequence"
_INT_MAX = 2**31 - 1  # ingested_batches.n_points is an INTEGER
_ROWS = 5_000


def upgrade() -> None:
    conn = op.get_bind()
    pg = conn.dialect.name == "postgresql"
    op.create_table(
        "batch_ranges",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("session", sa.LargeBinary(16), nullable=False),
        sa.Column("lo", sa.BigInteger(), nullable=False),
        sa.Column("hi", sa.BigInteger(), nullable=False),
        sa.Column("n_points", sa.BigInteger(), nullable=False),
        sa.Column("received_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "session", "lo", name="pk_batch_ranges"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name="fk_batch_ranges_run_id_runs", ondelete="CASCADE"),
        sqlite_with_rowid=False,
    )
    packing.lock_for_move(conn, ("ingested_batches", "batch_ranges"))
    # candidates only (text ids of the sequence form's length); the pattern is checked here
    candidates = "SELECT run_id, batch_id, n_points, received_ms FROM ingested_batches WHERE " + (
        "get_byte(batch_id, 0) <> 0 AND octet_length(batch_id) >= 34" if pg else "length(batch_id) >= 34"
    )
    moved: dict[tuple[int, str], list[list[int]]] = defaultdict(list)
    keys = []
    for run_id, key, n, ms in conn.execute(sa.text(candidates)):
        found = _SEQUENCE.fullmatch(bytes(key).decode("ascii", "replace"))
        if found is None:
            continue
        ends = (int(found[2], 16), int(found[3] or found[2], 16))  # hooks.schema.sequence_range
        first, last = min(ends), max(ends)
        moved[(run_id, found[1])].append([first, last, n, ms])
        keys.append({"r": run_id, "k": bytes(key)})
    insert = sa.text("INSERT INTO batch_ranges VALUES (:r, :s, :lo, :hi, :n, :ms)")
    for (run_id, session), claims in moved.items():
        for lo, hi, n, ms in _joined(claims):
            conn.execute(insert, {"r": run_id, "s": bytes.fromhex(session), "lo": lo, "hi": hi, "n": n, "ms": ms})
    for start in range(0, len(keys), _ROWS):
        conn.execute(
            sa.text("DELETE FROM ingested_batches WHERE run_id = :r AND batch_id = :k"), keys[start : start + _ROWS]
        )
    if pg:
        op.execute(
            f"ALTER TABLE ingested_batches ADD CONSTRAINT {_GUARD} CHECK (get_byte(batch_id, 0) = 0 "
            f"OR convert_from(batch_id, 'SQL_ASCII') !~ '{_PG_SEQUENCE}')"
        )
    else:
        op.execute(
            f"CREATE TRIGGER {_GUARD} BEFORE INSERT ON ingested_batches WHEN {_sqlite_sequence('NEW.batch_id')} "
            "BEGIN SELECT RAISE(ABORT, 'a sequence batch id is claimed in batch_ranges since revision 0019; "
            "this process runs older code'); END"
        )


def _sqlite_sequence(column: str) -> str:
    """SQLite: whether ``column`` (a key) is a sequence id, exactly :data:`_SEQUENCE` (GLOB has no counts)."""
    key = f"CAST({column} AS TEXT)"
    tail = f"substr({key}, 34)"  # after the session and its dash: n, or first-last
    dash = f"instr({tail}, '-')"
    return (
        f"(length({column}) BETWEEN 34 AND 58 AND substr({key}, 1, 33) GLOB '{'[0-9a-f]' * 32}-' "
        f"AND {tail} NOT GLOB '*[^0-9a-f-]*' AND {tail} NOT GLOB '-*' AND {tail} NOT GLOB '*-' "
        f"AND CASE WHEN {dash} = 0 THEN length({tail}) <= 12 ELSE {dash} <= 13 "
        f"AND length({tail}) - {dash} <= 12 AND instr(substr({tail}, {dash} + 1), '-') = 0 END)"
    )


def _joined(claims: list[list[int]]) -> list[list[int]]:
    """Claims (first, last, points, ms) as disjoint, never adjacent ranges (``monitor.store.claims``)."""
    out: list[list[int]] = []
    for lo, hi, n, ms in sorted(claims):
        if out and lo <= out[-1][1] + 1:
            last = out[-1]
            last[1], last[2], last[3] = max(last[1], hi), last[2] + n, max(last[3], ms)
        else:
            out.append([lo, hi, n, ms])
    return out


def downgrade() -> None:
    conn = op.get_bind()
    packing.lock_for_move(conn, ("ingested_batches", "batch_ranges"))
    if conn.dialect.name == "postgresql":
        op.execute(f"ALTER TABLE ingested_batches DROP CONSTRAINT {_GUARD}")
    else:
        op.execute(f"DROP TRIGGER {_GUARD}")
    insert = sa.text("INSERT INTO ingested_batches (batch_id, run_id, n_points, received_ms) VALUES (:k, :r, :n, :ms)")
    rows = conn.execute(sa.text("SELECT run_id, session, lo, hi, n_points, received_ms FROM batch_ranges")).all()
    part: list[dict[str, object]] = []
    for run_id, session, lo, hi, n, ms in rows:
        for seq in range(lo, hi + 1):
            key = f"{bytes(session).hex()}-{seq:x}".encode("ascii")
            part.append({"k": key, "r": run_id, "n": min(n, _INT_MAX) if seq == lo else 0, "ms": ms})
            if len(part) >= _ROWS:
                conn.execute(insert, part)
                part = []
    if part:
        conn.execute(insert, part)
    op.drop_table("batch_ranges")
