"""Whole-database moves between one row per point and packed chunks, for the migrations.

:func:`pack_sealed` moves every series' points below its sealed boundary from ``metric_points`` into
``metric_chunks`` (what the writer keeps up from then on, :mod:`monitor.store.compact`);
:func:`unpack` turns chunks back into rows. Revision 0005 packed PostgreSQL's points, 0006
SQLite's; each downgrade unpacks what its upgrade packed.

:func:`pack_segments` and :func:`unpack_segments` do the same between 16-step chunks and segments
(revision 0014, :mod:`monitor.store.segments`), with the rollups whose levels that changes.

All read rows and then delete what they read: a point committed by a service in between would be
deleted unread, after the service had answered 201 for it (issue 25). So each takes the tables it
moves between first (:func:`lock_for_move`), and every migration that moves data must do the same
(the rule is in ``migrations/README.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from hyperwatch.monitor.store import chunks, segcodec, segments, toast
from hyperwatch.monitor.store.compact import boundary
from hyperwatch.monitor.store.models import CHUNK_STEPS, SEGMENT_CHUNKS

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


# -- revision 0014: segments (issue 36) -------------------------------------------------------------

SEGMENT_TABLES = (*MOVED_TABLES, "metric_rollups")
"""What :func:`pack_segments` and :func:`unpack_segments` move, in the order they lock it."""
_OLD_LEVELS = {1: 16, 2: 256}
"""The rollup levels before revision 0014 (dropped by it, rebuilt by its downgrade)."""


def pack_segments(conn: Connection) -> None:
    """Every series' sealed chunks into segments (whole ranges and the open range's partial one), the
    rollups of 16 and 256 steps dropped, the 1,024-step level written (by :func:`segments.pack`)."""
    lock_for_move(conn, SEGMENT_TABLES)
    series = conn.execute(sa.text("SELECT run_id, name_id, layer, step FROM series_latest ORDER BY 1, 2, 3")).all()
    conn.execute(sa.text("DELETE FROM metric_rollups WHERE level IN (1, 2)"))
    for run_id, rows in groupby(series, key=lambda r: int(r[0])):
        targets = []
        for _r, n, la, latest in rows:
            end = boundary(int(latest)) // CHUNK_STEPS
            targets += [(int(n), int(la), c0, min(c0 + SEGMENT_CHUNKS, end)) for c0 in range(0, end, SEGMENT_CHUNKS)]
        for i in range(0, len(targets), 1000):
            segments.pack(conn, run_id, targets[i : i + 1000], tables=segments.ONE_TABLE)


def unpack_segments(conn: Connection) -> None:
    """Every segment back into 16-step chunks, and the rollups of 16 and 256 steps rebuilt from the
    points (the 1,024-step level dropped): the layout before revision 0014."""
    lock_for_move(conn, SEGMENT_TABLES)
    latest = {
        (int(r), int(n), int(la)): int(s)
        for r, n, la, s in conn.execute(sa.text("SELECT run_id, name_id, layer, step FROM series_latest"))
    }
    found = conn.execute(
        sa.text("SELECT run_id, name_id, layer, chunk, data FROM metric_chunks ORDER BY 1, 2, 3, 4")
    ).all()
    conn.execute(sa.text("DELETE FROM metric_rollups WHERE level = 2"))
    insert_chunk = sa.text(
        "INSERT INTO metric_chunks (run_id, name_id, layer, chunk, nonfinite, data) VALUES (:r, :n, :l, :c, :f, :d)"
    )
    insert_rollup = sa.text(
        "INSERT INTO metric_rollups (run_id, name_id, layer, level, block, n_points, min_step, min_tokens, "
        "min_value, max_step, max_tokens, max_value) VALUES (:r, :n, :l, :lv, :b, :np, :s0, :t0, :v0, :s1, :t1, :v1)"
    )
    for key, rows in groupby(found, key=lambda r: (int(r[0]), int(r[1]), int(r[2]))):
        r, n, la = key
        points: list[chunks.Cand] = []
        for *_k, c, blob in rows:
            data = bytes(blob)
            pts = chunks.decode(int(c), data)
            points += pts
            if segcodec.is_segment(data):
                conn.execute(
                    sa.text(f"DELETE FROM metric_chunks WHERE {KEY} AND chunk = :c"), {"r": r, "n": n, "l": la, "c": c}
                )
                new = [
                    {"r": r, "n": n, "l": la, "c": ck, "f": nf, "d": b}
                    for ck, grp in groupby(pts, key=lambda p: p[0] // CHUNK_STEPS)
                    for b, nf in [chunks.encode(ck, list(grp))]
                ]
                conn.execute(insert_chunk, new)
        sealed_to = latest.get(key, -1) + 1
        rollups = []
        for level, width in _OLD_LEVELS.items():
            for block, grp in groupby(points, key=lambda p: p[0] // width):
                if (block + 1) * width > sealed_to:
                    break
                pts = list(grp)
                real = [p for p in pts if p[2] is not None]
                lo = min(real, key=lambda p: (p[2], p[0]), default=(None, None, None))
                hi = min(real, key=lambda p: (-p[2], p[0]), default=(None, None, None))  # type: ignore[operator]
                rollups.append(
                    {"r": r, "n": n, "l": la, "lv": level, "b": block, "np": len(pts),
                     "s0": lo[0], "t0": lo[1], "v0": lo[2], "s1": hi[0], "t1": hi[1], "v1": hi[2]}
                )  # fmt: skip
        if rollups:
            conn.execute(insert_rollup, rollups)


# -- revision 0022: segment blobs of version 3 (issue 36) ---------------------------------------------

RECODED_TABLES = ("open_chunks", "metric_chunks")
"""The tables whose segment blobs :func:`recode_segments` rewrites, in the order it locks them."""


def recode_segments(conn: Connection, version: int, page: int = 500) -> int:
    """Rewrite every segment blob of another format version as ``version`` (:mod:`.segcodec`), the
    points, span and extremes as they were; the 16-step chunks (version 1) stay. Locks first (the runs
    against writers on PostgreSQL, as revision 0016 does, then the chunk tables); reads each table in
    pages of ``page`` rows by key. Returns the number of rows rewritten."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("LOCK TABLE runs IN SHARE ROW EXCLUSIVE MODE"))
    lock_for_move(conn, RECODED_TABLES)
    size, whole = toast.split_size(conn), toast.data_expr(conn.dialect.name)
    done = 0
    for table in RECODED_TABLES:
        after: tuple[int, ...] = (-1, -1, -1, -1)
        while True:
            rows = conn.execute(
                sa.text(
                    f"SELECT run_id, name_id, layer, chunk, {whole} FROM {table} "
                    "WHERE (run_id, name_id, layer, chunk) > (:r, :n, :l, :c) ORDER BY 1, 2, 3, 4 LIMIT :k"
                ),
                {"r": after[0], "n": after[1], "l": after[2], "c": after[3], "k": page},
            ).all()
            if not rows:
                break
            after = tuple(int(x) for x in rows[-1][:4])
            new = []
            for r, n, la, c, blob in rows:
                data = bytes(blob)
                if not segcodec.is_segment(data) or data[0] == version:
                    continue
                base = int(c) * CHUNK_STEPS
                recoded = segcodec.encode(base, segcodec.span(data), *segcodec.decode(base, data), version=version)
                d, ext = toast.split(recoded, size)
                new.append({"r": r, "n": n, "l": la, "c": c, "d": d, "e": ext})
            if new:
                conn.execute(sa.text(f"UPDATE {table} SET data = :d, data_ext = :e WHERE {KEY} AND chunk = :c"), new)
            done += len(new)
    return done
