"""Server-side downsampling: min and max per bucket, computed in SQL.

A series with steps in [lo, hi] is cut into N buckets of ``w = ceil((hi - lo + 1) / N)`` steps. Each
bucket returns its minimum and its maximum point (with their real steps), so a one-step spike
survives any N (uniform or reservoir sampling keeps a spike only by luck). The first and last
points of the range and every non-finite point (NaN, +-Inf: events, not noise) are always kept.

Buckets narrower than a segment (``SEGMENT_STEPS``) read the points: the hot rows in SQL, the chunks
and segments decoded to columns (numpy picks each bucket's extremes). For wide buckets the extremes
are read from ``metric_rollups`` instead of the points: the coarsest
level whose block width is at most w is used (its *sealed* blocks only: the open tail, less than one
block, is read from the points; see :mod:`monitor.store.rollups`), each block counts in the bucket
holding its first step (bucket edges snap to block edges; every point is still in exactly one bucket, and each bucket's
min and max are exact over its points). Blocks cut by an explicit start/end are read raw.

Every raw read is of the hot rows and the chunks together (:mod:`monitor.store.chunks`): the same
points whichever of the two holds them.

The arg-min/arg-max per group is dialect-specific SQL: SQLite's documented bare-column rule for a
lone ``min()``/``max()`` aggregate, PostgreSQL's ``DISTINCT ON``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sqlalchemy import text
from sqlalchemy.engine import Connection

from hyperwatch.monitor.store import chunks
from hyperwatch.monitor.store.chunks import KEY, Cand
from hyperwatch.monitor.store.models import ROLLUP_LEVELS, hot_relation
from hyperwatch.monitor.store.rollups import extremes, sealed_blocks


def _extremes(
    conn: Connection,
    source: str,
    cols: tuple[str, str, str],
    where: str,
    bucket: str,
    params: dict[str, Any],
    aggs: tuple[str, ...] = ("min", "max"),
) -> list[tuple[int, Cand]]:
    """(bucket, point) of the min and/or the max of ``cols[2]`` per bucket of ``source``."""
    step, tokens, value = cols
    out: list[tuple[int, Cand]] = []
    for agg in aggs:
        order = "ASC" if agg == "min" else "DESC"
        if conn.dialect.name == "postgresql":
            sql = (
                f"SELECT DISTINCT ON (b) {bucket} AS b, {step}, {tokens}, {value} FROM {source} "
                f"WHERE {where} AND {value} IS NOT NULL ORDER BY b, {value} {order}, {step}"
            )
        else:
            sql = (
                f"SELECT {bucket} AS b, {step}, {tokens}, {agg}({value}) FROM {source} "
                f"WHERE {where} AND {value} IS NOT NULL GROUP BY b"
            )
        out.extend((int(b), (int(s), t, v)) for b, s, t, v in conn.execute(text(sql), params))
    return out


def _chunk_extremes(conn: Connection, params: dict[str, Any], lo: int, hi: int, w: int) -> list[tuple[int, Cand]]:
    """(bucket, point) of the min and the max per bucket of the chunked points, on decoded columns
    (a bucket narrower than a segment: up to ~2 million points, no Python object per point)."""
    steps, tokens, values = chunks.chunked_columns(conn, params, lo, hi)
    real = ~np.isnan(values)
    steps, tokens, values = steps[real], tokens[real], values[real]
    if not len(steps):
        return []
    bucket = (steps - lo) // w
    new = np.ones(len(bucket), dtype=bool)
    new[1:] = bucket[1:] != bucket[:-1]
    starts = np.flatnonzero(new)
    lows, highs = extremes(values, np.cumsum(new) - 1, starts)
    picked = np.concatenate((lows, highs))
    cands = chunks.to_cands(steps[picked], tokens[picked], values[picked])
    return list(zip(bucket[picked].tolist(), cands))


def _rollup_extremes(
    conn: Connection, params: dict[str, Any], lo: int, w: int, bw: int, kinds: tuple[str, ...]
) -> dict[int, dict[str, Cand]]:
    """bucket -> {"min": point, "max": point} of the rollup blocks ``[fb, lb]`` of one level: the blocks'
    rows read once (a 10^7-step series at 2,000 buckets: ~2,400 rows of level 3), each bucket's pick by
    numpy (the lowest, or highest, value; the earlier step between equal values)."""
    cols = ", ".join(f"{a}_step, {a}_tokens, {a}_value" for a in kinds)
    sql = f"SELECT block, {cols} FROM metric_rollups WHERE {KEY} AND level = :level AND block >= :fb AND block <= :lb"
    rows = conn.execute(text(sql), params).all()
    out: dict[int, dict[str, Cand]] = {}
    if not rows:
        return out
    columns = list(zip(*rows))
    bucket = (np.array(columns[0], dtype=np.int64) * bw - lo) // w
    for k, agg in enumerate(kinds):
        steps, tokens, values = columns[1 + 3 * k : 4 + 3 * k]
        idx = np.array([i for i, v in enumerate(values) if v is not None], dtype=np.int64)  # NULL: NaN alone
        if not len(idx):
            continue
        val = np.array([values[i] for i in idx.tolist()], dtype=np.float64)
        st = np.array(steps, dtype=object)[idx].astype(np.int64)
        b = bucket[idx]
        order = np.lexsort((st, val if agg == "min" else -val, b))  # by bucket, then value, then step
        first = np.ones(len(order), dtype=bool)
        first[1:] = b[order][1:] != b[order][:-1]
        for i in idx[order[first]].tolist():
            out.setdefault(int(bucket[i]), {})[agg] = (int(steps[i]), tokens[i], values[i])
    return out


def _raw(conn: Connection, params: dict[str, Any], a: int, b: int) -> list[Cand]:
    return chunks.points(conn, params, a, b)


def _latest_step(conn: Connection, params: dict[str, Any]) -> int:
    """The series' latest stored step (blocks before ``latest // width`` have their rollup row); -1 if none."""
    sql = f"SELECT step FROM series_latest WHERE {KEY}"
    found = conn.execute(text(sql), params).scalar()
    return -1 if found is None else int(found)


def step_range(conn: Connection, params: dict[str, Any]) -> tuple[Cand, Cand] | None:
    """First and last point of the series within params' [start, end]."""
    first = chunks.end_point(conn, params, True)
    last = chunks.end_point(conn, params, False)
    return None if first is None or last is None else (first, last)


def bucket_extremes(
    conn: Connection, params: dict[str, Any], lo: int, hi: int, w: int, kinds: tuple[str, ...] = ("min", "max")
) -> dict[int, dict[str, Cand]]:
    """bucket -> {"min": point, "max": point} over steps [lo, hi] with buckets of w steps from lo."""
    p = {**params, "lo": lo, "hi": hi, "w": w}
    level = max((lv for lv, bw in ROLLUP_LEVELS.items() if bw <= w), default=None)
    found: list[tuple[int, Cand]] = []
    out: dict[int, dict[str, Cand]] = {}
    if level is None:  # narrower than a block: the hot rows in SQL, the chunks decoded
        found = _extremes(
            conn,
            hot_relation(conn.dialect.name),
            ("step", "tokens", "value"),
            f"{KEY} AND step >= :lo AND step <= :hi",
            "(step - :lo) / :w",
            p,
            kinds,
        )
        found += _chunk_extremes(conn, params, lo, hi, w)
    else:
        bw = ROLLUP_LEVELS[level]
        fb, lb = -(-lo // bw), (hi + 1) // bw - 1  # first and last block lying wholly inside [lo, hi]
        lb = min(lb, sealed_blocks(_latest_step(conn, params), bw) - 1)  # open blocks have no row yet
        raw_edges: list[Cand] = []
        if fb > lb:
            raw_edges = _raw(conn, params, lo, hi)
        else:
            out = _rollup_extremes(conn, {**params, "level": level, "fb": fb, "lb": lb}, lo, w, bw, kinds)
            if lo < fb * bw:
                raw_edges += _raw(conn, params, lo, fb * bw - 1)
            if (lb + 1) * bw <= hi:
                raw_edges += _raw(conn, params, (lb + 1) * bw, hi)
        found.extend(((c[0] - lo) // w, c) for c in raw_edges if c[2] is not None)
    for b, c in found:  # the edges' and the chunks' candidates, merged into the rollups' picks
        slot = out.setdefault(b, {})
        assert c[2] is not None
        # between equal values the earlier step wins, wherever the candidates came from
        if "min" in kinds and ("min" not in slot or (c[2], c[0]) < (slot["min"][2], slot["min"][0])):  # type: ignore[operator]
            slot["min"] = c
        if "max" in kinds and ("max" not in slot or (-c[2], c[0]) < (-slot["max"][2], slot["max"][0])):  # type: ignore[operator]
            slot["max"] = c
    return out


def nonfinite(conn: Connection, params: dict[str, Any], lo: int, hi: int) -> list[Cand]:
    """Every NaN/Inf point in [lo, hi], read through the small partial indexes (no scan of the series)."""
    return chunks.nonfinite(conn, params, lo, hi)


def downsample(conn: Connection, params: dict[str, Any], buckets: int) -> tuple[list[Cand], bool, int, int, int] | None:
    """(points sorted by step, downsampled?, lo, hi, w) or None for an empty range."""
    ends = step_range(conn, params)
    if ends is None:
        return None
    first, last = ends
    lo, hi = first[0], last[0]
    span = hi - lo + 1
    w = -(-span // buckets)
    if span <= 2 * buckets:
        return _raw(conn, params, lo, hi), False, lo, hi, w
    keep: dict[int, Cand] = {first[0]: first, last[0]: last}
    for slot in bucket_extremes(conn, params, lo, hi, w).values():
        for c in slot.values():
            keep[c[0]] = c
    for c in nonfinite(conn, params, lo, hi):
        keep[c[0]] = c
    return [keep[s] for s in sorted(keep)], True, lo, hi, w
