"""The trailing window of many series in two statements (what the spike detector needs per batch).

Each series' window is an index range scan on the primary key ``(run_id, name_id, layer, step)``
read backwards from ``before_step`` for at most ``limit`` rows; the windows of up to
``SERIES_PER_STATEMENT`` series are glued with ``UNION ALL`` so a batch touching 64 layers costs one
round trip instead of 64 transactions. Both databases take the same SQL.

The hot rows hold less than one chunk per series, so a window usually reaches into the chunks:
a second statement of the same shape reads, for the series still short, the newest chunks before
the window's oldest point (every chunked step lies below every hot step), enough of them for the
points missing if the chunks are full; a sparse series repeats that for the few still short.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from sqlalchemy.engine import Connection

from hyperwatch.monitor.store import chunks
from hyperwatch.monitor.store.models import CHUNK_ROWS, CHUNK_STEPS, hot_relation

SERIES_PER_STATEMENT = 200  # SQLite allows 500 terms in a compound SELECT
WindowKey = tuple[int, int, int]  # (name_id, sql layer, before_step)


@lru_cache(maxsize=64)
def _newest_sql(dialect: str, n: int, table: str, order: str, cols: str, cmp: str) -> str:
    """``n`` newest-first windows of one series each, as one UNION ALL (one round trip): rows of
    ``table`` with ``order`` ``cmp`` a bound, newest ``limit`` first; built from constants only."""
    mark = "%s" if dialect == "postgresql" else "?"
    one = (
        f"SELECT {{i}} AS i, {cols} FROM (SELECT {cols} FROM {table} WHERE run_id = {{m}} "
        f"AND name_id = {{m}} AND layer = {{m}} AND {order} {cmp} {{m}} ORDER BY {order} DESC LIMIT {{m}}) AS t{{i}}"
    )
    return " UNION ALL ".join(one.format(i=i, m=mark) for i in range(n))


def _windows_sql(dialect: str, n: int) -> str:
    return _newest_sql(dialect, n, hot_relation(dialect), "step", "step, value", "<")


def _chunks_sql(dialect: str, n: int) -> str:
    return _newest_sql(dialect, n, CHUNK_ROWS, "chunk", "chunk, data", "<=")


def trailing_points(
    conn: Connection, run_id: int, keys: Sequence[WindowKey], limit: int
) -> list[list[tuple[int, float | None]]]:
    """Per key, the ``limit`` newest stored ``(step, value)`` pairs strictly before its step, oldest first
    (NULL = NaN). The steps let a caller line layers up (the max over layers of one step)."""
    if limit < 1:
        raise ValueError(f"limit: the window must hold at least 1 point, got {limit}")
    out: list[list[tuple[int, float | None]]] = [[] for _ in keys]
    for lo in range(0, len(keys), SERIES_PER_STATEMENT):
        part = keys[lo : lo + SERIES_PER_STATEMENT]
        params: list[int] = []
        for name_id, layer, before in part:
            params += (run_id, name_id, layer, before, limit)
        for i, step, value in conn.exec_driver_sql(_windows_sql(conn.dialect.name, len(part)), tuple(params)):
            out[lo + int(i)].append((int(step), value))
    windows = [sorted(w) for w in out]
    # (index, first step not yet covered) of the series still short of ``limit`` points
    short = [(i, min(w[0][0] if w else keys[i][2], keys[i][2])) for i, w in enumerate(windows) if len(w) < limit]
    while short:
        short = _from_chunks(conn, run_id, keys, windows, short, limit)
    return [w[-limit:] for w in windows]


def _from_chunks(
    conn: Connection,
    run_id: int,
    keys: Sequence[WindowKey],
    windows: list[list[tuple[int, float | None]]],
    short: list[tuple[int, int]],
    limit: int,
) -> list[tuple[int, int]]:
    """Prepend chunked points below each short window; the ones still short (and not exhausted)."""
    still: list[tuple[int, int]] = []
    for lo in range(0, len(short), SERIES_PER_STATEMENT):
        part = short[lo : lo + SERIES_PER_STATEMENT]
        params: list[int] = []
        wanted = []
        for i, below in part:
            n_chunks = -(-(limit - len(windows[i])) // CHUNK_STEPS) + 1
            wanted.append(n_chunks)
            params += (run_id, keys[i][0], keys[i][1], (below - 1) // CHUNK_STEPS, n_chunks)
        got: list[list[tuple[int, bytes]]] = [[] for _ in part]
        sql = _chunks_sql(conn.dialect.name, len(part))
        for j, c, blob in conn.exec_driver_sql(sql, tuple(params)):
            got[int(j)].append((int(c), bytes(blob)))
        for (i, below), rows, n_chunks in zip(part, got, wanted):
            pts = [(p[0], p[2]) for c, blob in sorted(rows) for p in chunks.decode(c, blob) if p[0] < below]
            windows[i] = pts + windows[i]
            if len(windows[i]) < limit and len(rows) == n_chunks and below > 0:
                still.append((i, min(rows)[0] * CHUNK_STEPS))
    return still


def per_step_max(windows: Sequence[Sequence[tuple[int, float]]]) -> list[tuple[int, float]]:
    """(step, the max over ``windows`` of the finite values logged at it), by step: a metric's series
    across layers as its max-over-layers gauge shows it, one point per logged step."""
    pairs = [p for window in windows for p in window]
    return max_by_step(np.array([s for s, _ in pairs], dtype=np.int64), np.array([v for _, v in pairs], dtype=float))


def max_by_step(steps: np.ndarray, values: np.ndarray) -> list[tuple[int, float]]:
    """(step, the max of the finite ``values`` at it) for each step that has one, by step."""
    finite = np.isfinite(values)
    steps, values = steps[finite], values[finite]
    if not len(steps):
        return []
    order = np.argsort(steps, kind="stable")
    steps, values = steps[order], values[order]
    first = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1]])
    return list(zip(steps[first].tolist(), np.maximum.reduceat(values, first).tolist()))
