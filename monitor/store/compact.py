"""Moving sealed points out of ``metric_points`` into chunk rows (``open_chunks``), inside the batch's transaction.

The invariant every read relies on: for each series with latest step ``L``, the steps below its
sealed boundary ``((L + 1) // CHUNK_STEPS) * CHUNK_STEPS`` live in chunks and the steps from it on live in
``metric_points`` (the "hot" rows: at most one chunk's worth per series). A batch keeps it:

- points at or past the new boundary go to ``metric_points`` (see :func:`points.write_points`);
- when the boundary moves (``L`` reaches a chunk's last step), the hot rows it passes are
  deleted (``DELETE .. RETURNING``: read and removed in one statement) and written as chunk rows,
  merged with the batch's own points of those chunks (the batch's win: last write wins);
- a point below the old boundary (a late step or an overwrite) rewrites its chunk: the stored chunk
  decoded, the point merged, the chunk encoded again (rare: training appends).

Only the writer of a run moves its points, and the writer holds the run's row locked to commit
(:mod:`monitor.store.ingest`), so the boundary it reads is the one it moves. The chunks written are
returned with their full contents, so the rollups of the blocks they seal are computed from memory
instead of read back.

Both databases pack (SQLite since revision 0006). Chunks are compact (~17 B a point on SQLite, ~28
on PostgreSQL, against ~31.5 and ~94 for rows), and they keep the table that every batch writes
small: on SQLite, with the key order (run, name, layer, step), a batch of one step for 512 series
wrote into a leaf page of every series of the big table, ~1-2 MB of WAL per commit; into the hot
table of at most 16 steps per series it dirties ~10 times fewer pages, and a sealed chunk is one
short row (issue 16, measured with 1,000 steps of 512 points through the store: 7.9 -> 4.9 ms per
batch, where the raw one-row-per-point insert takes 4.6-5.7 ms).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from itertools import groupby
from typing import Any

from sqlalchemy.engine import Connection

from hyperwatch.monitor.store import chunks, segments
from hyperwatch.monitor.store.bulk import bulk_write, pg_array, read_in_ranges
from hyperwatch.monitor.store.chunks import CHUNK_COLUMNS, CHUNK_KEY, CHUNK_SET, CHUNK_TYPES, Cand
from hyperwatch.monitor.store.models import CHUNK_ROWS, CHUNK_STEPS, COMPACTING_DIALECTS, OPEN_CHUNKS

SeriesKey = tuple[int, int]  # (name_id, layer)
PointRow = tuple[int, int, int, int | None, float | None]  # name_id, layer, step, tokens, sql value
Known = dict[SeriesKey, tuple[list[tuple[int, int]], list[Cand]]]
"""Per series: inclusive chunk ranges whose every point is listed, and those points, step-sorted."""


_TAKE_PG = (
    "DELETE FROM metric_points AS t USING unnest(%s::int[], %s::int[], %s::bigint[], %s::bigint[]) AS r(n, l, a, b) "
    "WHERE t.run_id = %s AND t.name_id = r.n AND t.layer = r.l AND t.step >= r.a AND t.step <= r.b "
    "RETURNING t.name_id, t.layer, t.step, t.tokens, t.value"
)
_COPY_CHUNKS = f"COPY {OPEN_CHUNKS} ({', '.join(CHUNK_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
DELETE_RANGE_SQLITE = (
    "DELETE FROM metric_points WHERE run_id = ? AND name_id = ? AND layer = ? AND step >= ? AND step <= ?"
)


__all__ = [
    "COMPACTING_DIALECTS",
    "DELETE_RANGE_SQLITE",
    "boundary",
    "compacts",
    "copy_chunks",
    "store_sealed",
    "take_hot",
]


def compacts(conn: Connection) -> bool:
    return conn.dialect.name in COMPACTING_DIALECTS


def boundary(latest: int) -> int:
    """The first hot step of a series whose latest step is ``latest`` (-1: no point yet -> 0): a chunk
    seals once the series reaches its last step, as the level-1 rollup block it coincides with."""
    return (latest + 1) // CHUNK_STEPS * CHUNK_STEPS


def store_sealed(
    conn: Connection,
    run_id: int,
    cold: Sequence[PointRow],
    before: Mapping[SeriesKey, int],
    after: Mapping[SeriesKey, int],
    taken: Sequence[PointRow] = (),
) -> tuple[Known, int]:
    """Write the chunks a batch seals or touches; ``cold``: the batch's points below their new boundary.

    ``before``/``after``: the latest step before (-1: none) and after the batch of every series that
    seals a chunk or has a point in ``cold`` (others may be left out of ``after``). ``taken``: hot
    points of the sealed chunks already taken out of pending batches (:mod:`monitor.store.pending`).
    Returns what the chunks written hold and how many ``metric_points`` rows were moved (deleted) into them.
    """
    spans: dict[SeriesKey, list[tuple[int, int]]] = defaultdict(list)
    take: list[tuple[int, int, int, int]] = []
    for key, latest in after.items():
        c_old, c_new = boundary(before[key]) // CHUNK_STEPS, boundary(latest) // CHUNK_STEPS
        if c_new > c_old:
            spans[key].append((c_old, c_new - 1))
            if before[key] >= 0:  # a new series has no hot row to move
                take.append((*key, c_old * CHUNK_STEPS, c_new * CHUNK_STEPS - 1))
    late = sorted({(r[0], r[1], r[2] // CHUNK_STEPS) for r in cold if r[2] < boundary(before[(r[0], r[1])])})
    if not take and not late and not cold:
        return {}, 0
    # late points of a segment's range rewrite that segment (monitor.store.segments), the rest their chunk
    in_segment = segments.late_targets(conn, run_id, late, before)
    by_target: dict[tuple[int, int, int], list[PointRow]] = defaultdict(list)
    for r in cold:
        target = in_segment.get(_chunk_of(r))
        if target is not None:
            by_target[target[:3]].append(r)
    known_late = segments.pack(conn, run_id, sorted(set(in_segment.values())), by_target)
    late = [k for k in late if k not in in_segment]
    cold = [r for r in cold if _chunk_of(r) not in in_segment]
    moved = take_hot(conn, run_id, take)
    groups: dict[tuple[int, int, int], list[Cand]] = {
        ckey: [r[2:] for r in rows] for ckey, rows in groupby(sorted([*moved, *taken]), key=_chunk_of)
    }
    extra: dict[tuple[int, int, int], dict[int, Cand]] = defaultdict(dict)
    if late:
        ranges = [(n, la, c, c) for n, la, c in late]
        for n, la, c, blob in read_in_ranges(conn, run_id, "t.chunk, t.data", CHUNK_ROWS, "chunk", "", ranges):
            extra[(n, la, c)].update((p[0], p) for p in chunks.decode(int(c), bytes(blob)))
        for n, la, c in late:
            spans[(n, la)].append((c, c))
    for r in cold:  # the batch's points last: they win
        extra[_chunk_of(r)][r[2]] = r[2:]
    for ckey, by_step in extra.items():
        for p in groups.get(ckey, ()):
            by_step.setdefault(p[0], p)
        groups[ckey] = [by_step[s] for s in sorted(by_step)]
    out_rows: list[tuple[Any, ...]] = []
    listed: dict[SeriesKey, list[Cand]] = defaultdict(list)
    for n, la, c in sorted(groups):
        pts = groups[(n, la, c)]
        blob, nonfinite = chunks.encode(c, pts)
        out_rows.append((run_id, n, la, c, nonfinite, blob, *chunks.summary(pts)))
        listed[(n, la)] += pts
    rewritten = set(late)
    copy_chunks(conn, [r for r in out_rows if r[1:4] not in rewritten])
    # a rewritten chunk goes to open_chunks; one a stopped run left in metric_chunks is deleted there
    segments.delete(conn, run_id, [(n, la, c, c + 1) for n, la, c in late], "metric_chunks")
    rows = [r for r in out_rows if r[1:4] in rewritten]
    bulk_write(conn, OPEN_CHUNKS, CHUNK_COLUMNS, CHUNK_TYPES, rows, CHUNK_KEY, CHUNK_SET)
    out = {k: (_merged(v), listed.get(k, [])) for k, v in spans.items()}
    for key, (seg_spans, pts) in known_late.items():  # a series' late segment and its new chunks: both listed
        had_spans, had_pts = out.get(key, ([], []))
        out[key] = (_merged([*had_spans, *seg_spans]), sorted([*had_pts, *pts]))
    return out, len(moved)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def copy_chunks(conn: Connection, rows: list[tuple[Any, ...]]) -> None:
    """New chunk rows by binary COPY: no row can hold their key yet (chunks at or past a series'
    boundary do not exist, and the series is locked), and bytea travels as its raw bytes."""
    if not rows:
        return
    if conn.dialect.name != "postgresql":
        marks = ", ".join("?" * len(CHUNK_COLUMNS))
        conn.exec_driver_sql(f"INSERT INTO {OPEN_CHUNKS} ({', '.join(CHUNK_COLUMNS)}) VALUES ({marks})", rows)
        return
    raw = conn.connection.dbapi_connection
    assert raw is not None
    with raw.cursor() as cur, cur.copy(_COPY_CHUNKS) as copy:  # type: ignore[attr-defined]
        copy.set_types(["int4", "int4", "int2", "int8", "int2", "bytea", "int8", "float8", "int8", "float8"])
        for row in rows:
            copy.write_row(row)


def _chunk_of(r: PointRow) -> tuple[int, int, int]:
    return r[0], r[1], r[2] // CHUNK_STEPS


def take_hot(conn: Connection, run_id: int, ranges: list[tuple[int, int, int, int]]) -> list[PointRow]:
    """Delete the hot rows in (name_id, layer, first step, last step) ranges and return them."""
    if not ranges:
        return []
    if conn.dialect.name == "postgresql":
        types = ("int", "int", "bigint", "bigint")
        params = (*(pg_array(col, t) for col, t in zip(zip(*ranges), types, strict=True)), run_id)
        return conn.exec_driver_sql(_TAKE_PG, params).cursor.fetchall()  # type: ignore[return-value]
    # SQLite: in-process, so a read then a delete per range costs no round trip
    rows = read_in_ranges(conn, run_id, "t.step, t.tokens, t.value", "metric_points", "step", "", ranges)
    conn.exec_driver_sql(DELETE_RANGE_SQLITE, [(run_id, *r) for r in ranges])
    return rows  # type: ignore[return-value]
