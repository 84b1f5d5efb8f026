"""Sequence batch ids claimed as ranges (revision 0019, issue 36).

The hooks number a run's batches within their process's writer session (``hooks.schema.new_batch_id``:
``<session>-<n>``; ``<session>-<first>-<last>`` for batches merged into one request). Where any other
id is one ``ingested_batches`` row a request (~36 bytes on SQLite, ~130 on PostgreSQL, whatever the
request holds), these are kept in ``batch_ranges`` as each session's claimed numbers: ranges that are
disjoint and never adjacent (a claim that touches a range joins it), so a session sending in order is
one row, rewritten by each batch.

Exactly-once as before: a batch whose numbers all lie in one stored range is a duplicate (the reply says
so and nothing is written); any other is stored and its numbers joined to the ranges. Every claim runs
under the run's row lock (``ingest.lock_run``), in a statement after it, so it reads what every earlier
writer of the run committed.
"""

from __future__ import annotations

from sqlalchemy import bindparam, text
from sqlalchemy.engine import Connection

from hyperwatch.monitor.store.points import received_ms

_WHERE = "run_id = :run AND session = :session"

# the common case, one statement: the session's range ends just before this batch and nothing starts
# inside it or just after it (disjoint ranges: then none of its numbers is claimed, and none adjoins)
_EXTEND = text(
    f"UPDATE batch_ranges SET hi = :last, n_points = n_points + :n, received_ms = :ms WHERE {_WHERE} "
    f"AND hi = :first - 1 AND NOT EXISTS (SELECT 1 FROM batch_ranges WHERE {_WHERE} "
    "AND lo BETWEEN :first AND :last + 1) RETURNING lo"
)
_NEAR = text(
    f"SELECT lo, hi, n_points FROM batch_ranges WHERE {_WHERE} AND lo <= :last + 1 AND hi >= :first - 1 ORDER BY lo"
)
_INSERT = text(
    "INSERT INTO batch_ranges (run_id, session, lo, hi, n_points, received_ms) "
    "VALUES (:run, :session, :first, :last, :n, :ms)"
)
_DROP = text(f"DELETE FROM batch_ranges WHERE {_WHERE} AND lo IN :los").bindparams(bindparam("los", expanding=True))
_JOIN = text(
    f"UPDATE batch_ranges SET lo = :first, hi = :last, n_points = :n, received_ms = :ms WHERE {_WHERE} AND lo = :lo"
)


def claim_range(conn: Connection, run_id: int, session: str, first: int, last: int, n_points: int) -> int | None:
    """Claim numbers ``first..last`` of ``session`` (32 hex digits) for the locked run; None when the
    batch is new (claimed by this transaction), else its point count (this send's: a re-sent batch
    carries the points it first did)."""
    params = {"run": run_id, "session": bytes.fromhex(session), "first": first, "last": last}
    params.update(n=n_points, ms=received_ms())
    if conn.execute(_EXTEND, params).first() is not None:
        return None
    near = conn.execute(_NEAR, params).all()
    if any(lo <= first and hi >= last for lo, hi, _ in near):
        return n_points
    if not near:
        conn.execute(_INSERT, params)
        return None
    # the batch overlaps or adjoins these ranges: they become one, stored in the first one's row
    keep = near[0][0]
    if len(near) > 1:
        conn.execute(_DROP, {**params, "los": [lo for lo, _, _ in near[1:]]})
    joined = {"first": min(first, keep), "last": max(last, near[-1][1]), "n": n_points + sum(n for *_, n in near)}
    conn.execute(_JOIN, {**params, **joined, "lo": keep})
    return None
