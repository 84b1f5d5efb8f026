"""Whole-database moves between one row per point and packed chunks, for the migrations.

:func:`pack_sealed` moves every series' points below its sealed boundary from ``metric_points`` into
``metric_chunks`` (what the writer keeps up from then on, :mod:`monitor.store.compact`);
:func:`unpack` turns chunks back into rows. Revision 0005 packed PostgreSQL's points, 0006
SQLite's; each downgrade unpacks what its upgrade packed.

Both read rows and then delete what they read: a point committed by a service in between would be
deleted unread, after the service had answered 201 for it (issue 25). So each takes the tables it
moves between first (:func:`lock_for_move`), and every migration that moves data must do the same
(the rule is in ``migrations/README.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from hyperwatch.monitor.store import chunks
from hyperwatch.monitor.store.compact import boundary
from hyperwatch.monitor.store.models import CHUNK_STEPS

MOVED_TABLES = ("series_latest", "metric_points", "metric_chunks")
"""What :func:`pack_sealed` and :func:`unpack` read, write and delete, in the order they lock it."""
KEY = "run_id = :r AND name_id = :n AND layer = :l"
_BATCH = 5_000


def lock_for_move(conn: Connection, tables: Sequence[str]) -> None:
    """Keep every writer out of ``tables`` until this (migration) transaction ends.

    PostgreSQL: ``LOCK TABLE .. IN ACCESS EXCLUSIVE MODE``, one statement, in the order given (use
    one order everywhere): it waits for the writers already in them to commit (their rows are then
    read and moved), and a writer that comes later waits for the migration and then finds the new
    schema (its request fails and is not acknowledged, nothing is lost). SQLite locks the whole
    database for a writer: a no-op write takes its write lock now (``hyperwatch db`` already began
    with ``BEGIN IMMEDIATE``; by hand, when another connection committed since this transaction's
    first read, it fails with "database is locked" instead, before anything moved).
    """
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE"))
    else:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = version_num"))


def pack_sealed(conn: Connection) -> None:
    """Every series' points below its sealed boundary (from ``series_latest``) into chunk rows."""
    lock_for_move(conn, MOVED_TABLES)
    series = conn.execute(sa.text("SELECT run_id, name_id, layer, step FROM series_latest ORDER BY 1, 2, 3")).all()
    insert = sa.text(
        "INSERT INTO metric_chunks (run_id, name_id, layer, chunk, nonfinite, data) VALUES (:r, :n, :l, :c, :f, :d)"
    )
    pending: list[dict[str, object]] = []
    for r, n, la, latest in series:
        edge = boundary(int(latest))
        key = {"r": r, "n": n, "l": la, "e": edge}
        rows = conn.execute(
            sa.text(f"SELECT step, tokens, value FROM metric_points WHERE {KEY} AND step < :e ORDER BY step"), key
        )
        for c, pts in groupby(((int(s), t, v) for s, t, v in rows), key=lambda p: p[0] // CHUNK_STEPS):
            blob, nonfinite = chunks.encode(c, list(pts))
            pending.append({"r": r, "n": n, "l": la, "c": c, "f": nonfinite, "d": blob})
        if len(pending) >= _BATCH:
            conn.execute(insert, pending)
            pending = []
        conn.execute(sa.text(f"DELETE FROM metric_points WHERE {KEY} AND step < :e"), key)
    if pending:
        conn.execute(insert, pending)


def unpack(conn: Connection) -> None:
    """Every chunk's points back into ``metric_points`` rows, and the chunk rows deleted."""
    lock_for_move(conn, MOVED_TABLES)
    insert = sa.text(
        "INSERT INTO metric_points (run_id, name_id, layer, step, tokens, value) VALUES (:r, :n, :l, :s, :t, :v)"
    )
    pending: list[dict[str, object]] = []
    for r, n, la, c, blob in conn.execute(
        sa.text("SELECT run_id, name_id, layer, chunk, data FROM metric_chunks ORDER BY 1, 2, 3, 4")
    ).all():
        pending += [{"r": r, "n": n, "l": la, "s": s, "t": t, "v": v} for s, t, v in chunks.decode(int(c), bytes(blob))]
        if len(pending) >= _BATCH:
            conn.execute(insert, pending)
            pending = []
    if pending:
        conn.execute(insert, pending)
    conn.execute(sa.text("DELETE FROM metric_chunks"))
