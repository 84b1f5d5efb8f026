"""The trailing window of many series in one statement (what the spike detector needs per batch).

Each series' window is an index range scan on the primary key ``(run_id, name_id, layer, step)``
read backwards from ``before_step`` for at most ``limit`` rows; the windows of up to
``SERIES_PER_STATEMENT`` series are glued with ``UNION ALL`` so a batch touching 64 layers costs one
round trip instead of 64 transactions. Both databases take the same SQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from sqlalchemy.engine import Connection

SERIES_PER_STATEMENT = 200  # SQLite allows 500 terms in a compound SELECT
WindowKey = tuple[int, int, int]  # (name_id, sql layer, before_step)


@lru_cache(maxsize=32)
def _windows_sql(dialect: str, n: int) -> str:
    mark = "%s" if dialect == "postgresql" else "?"
    one = (
        "SELECT {i} AS i, step, value FROM (SELECT step, value FROM metric_points WHERE run_id = {m} "
        "AND name_id = {m} AND layer = {m} AND step < {m} ORDER BY step DESC LIMIT {m}) AS t{i}"
    )
    return " UNION ALL ".join(one.format(i=i, m=mark) for i in range(n))


def trailing_points(
    conn: Connection, run_id: int, keys: Sequence[WindowKey], limit: int
) -> list[list[tuple[int, float | None]]]:
    """Per key, the ``limit`` newest stored ``(step, value)`` pairs strictly before its step, oldest first
    (NULL = NaN). The steps let a caller line layers up (the max over layers of one step)."""
    if limit < 1:
        raise ValueError(f"limit: the window must hold at least 1 point, got {limit}")
    out: list[list[tuple[int, float | None]]] = [[] for _ in keys]
    for lo in range(0, len(keys), SERIES_PER_STATEMENT):
        chunk = keys[lo : lo + SERIES_PER_STATEMENT]
        params: list[int] = []
        for name_id, layer, before in chunk:
            params += (run_id, name_id, layer, before, limit)
        for i, step, value in conn.exec_driver_sql(_windows_sql(conn.dialect.name, len(chunk)), tuple(params)):
            out[lo + int(i)].append((int(step), value))
    return [sorted(w) for w in out]
