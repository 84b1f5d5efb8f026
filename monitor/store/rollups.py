"""``metric_rollups`` maintenance: an incremental merge per batch, a recompute where points were overwritten.

A rollup row summarises one block of one series at one level (16, 256 or 4096 steps): the count of
points and the point (step, tokens, value) of the minimum and of the maximum value. NaN is stored as
NULL and never wins; +-Inf compete as ordinary values; between equal values the earlier step wins.
That tie rule makes a block's summary a function of its points alone, whatever order they came in,
so the two ways of maintaining it below agree exactly:

- **merge** (every batch, all levels in one statement): the batch's points are summarised per block
  in Python and upserted with ``ON CONFLICT DO UPDATE`` keeping the smaller minimum and the larger
  maximum and adding the counts. Exact when every point of the batch is a new key.
- **recompute** (:func:`refresh_rollups`): a block holding a key that was *overwritten* (last write
  wins can lower a maximum or raise a minimum, which a merge cannot undo) is rebuilt from the level
  below (level 1 from the points), level by level. Overwrites are rare (a re-sent step), so this
  path reads little.

Concurrency (PostgreSQL, READ COMMITTED): the merge statement locks each rollup row it touches until
commit, and runs before any recompute of the same transaction; a recompute therefore reads the
points only after every other writer of those blocks has committed, and writers that come later
merge their points on top of it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from functools import lru_cache
from itertools import groupby
from operator import itemgetter
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from hyperwatch.monitor.store.bulk import bulk_write
from hyperwatch.monitor.store.models import ROLLUP_LEVELS

SeriesKey = tuple[int, int]  # (name_id, layer)
PointRow = tuple[int, int, int, int | None, float | None]  # name_id, layer, step, tokens, sql value
Acc = list[Any]  # [n, min_step, min_tokens, min_value, max_step, max_tokens, max_value]
_VALUE = itemgetter(4)

ROLLUP_COLUMNS = (
    "run_id",
    "name_id",
    "layer",
    "level",
    "block",
    "n_points",
    "min_step",
    "min_tokens",
    "min_value",
    "max_step",
    "max_tokens",
    "max_value",
)
_ROLLUP_TYPES = ("int",) * 4 + ("bigint", "int") + ("bigint", "bigint", "float8") * 2
_ROLLUP_KEY = ("run_id", "name_id", "layer", "level", "block")


def _wins(new: str, old: str, less: bool) -> str:
    """SQL: the excluded row's extreme replaces the stored one (NULL = NaN never wins; ties: earlier step)."""
    op = "<" if less else ">"
    t = "metric_rollups"
    return (
        f"excluded.{new}_value IS NOT NULL AND ({t}.{old}_value IS NULL OR excluded.{new}_value {op} {t}.{old}_value "
        f"OR (excluded.{new}_value = {t}.{old}_value AND excluded.{new}_step < {t}.{old}_step))"
    )


@lru_cache(maxsize=1)
def _merge_set() -> str:
    parts = ["n_points = metric_rollups.n_points + excluded.n_points"]
    for kind, less in (("min", True), ("max", False)):
        cond = _wins(kind, kind, less)
        for col in ("step", "tokens", "value"):
            c = f"{kind}_{col}"
            parts.append(f"{c} = CASE WHEN {cond} THEN excluded.{c} ELSE metric_rollups.{c} END")
    return ", ".join(parts)


def _better(value: float | None, step: int, best_value: float | None, best_step: int | None, less: bool) -> bool:
    """Python twin of :func:`_wins`."""
    if value is None:
        return False
    if best_value is None:
        return True
    if value == best_value:
        return best_step is None or step < best_step
    return value < best_value if less else value > best_value


def _fold(acc: Acc | None, n: int, lo: tuple[Any, Any, Any], hi: tuple[Any, Any, Any]) -> Acc:
    """Merge a (count, min point, max point) into an accumulator."""
    if acc is None:
        acc = [0, None, None, None, None, None, None]
    acc[0] += n
    if _better(lo[2], lo[0], acc[3], acc[1], less=True):
        acc[1], acc[2], acc[3] = lo
    if _better(hi[2], hi[0], acc[6], acc[4], less=False):
        acc[4], acc[5], acc[6] = hi
    return acc


def batch_summaries(run_id: int, rows: Sequence[PointRow]) -> list[tuple[Any, ...]]:
    """The rollup rows (``ROLLUP_COLUMNS`` order) summarising ``rows`` alone, every level, key-sorted.

    ``rows`` must be sorted by key (as :func:`monitor.store.points.point_rows` returns them): level 1
    is then one pass over runs of consecutive rows (builtin ``min``/``max`` keep the first, i.e. the
    earliest, of equal values), each coarser level is folded from the one below.
    """
    first_width = ROLLUP_LEVELS[1]
    below: dict[tuple[int, int, int], Acc] = {}
    for key, group in groupby(rows, key=lambda r: (r[0], r[1], r[2] // first_width)):
        members = list(group)
        finite = [r for r in members if r[4] is not None]
        if finite:
            lo = min(finite, key=_VALUE)
            hi = max(finite, key=_VALUE)
            below[key] = [len(members), lo[2], lo[3], lo[4], hi[2], hi[3], hi[4]]
        else:
            below[key] = [len(members), None, None, None, None, None, None]
    out: list[tuple[Any, ...]] = [(run_id, k[0], k[1], 1, k[2], *a) for k, a in below.items()]
    prev_width = first_width
    for level, width in ROLLUP_LEVELS.items():
        if level == 1:
            continue
        ratio = width // prev_width
        accs: dict[tuple[int, int, int], Acc] = {}
        for (name_id, layer, block), a in below.items():
            key = (name_id, layer, block // ratio)
            accs[key] = _fold(accs.get(key), a[0], (a[1], a[2], a[3]), (a[4], a[5], a[6]))
        below, prev_width = accs, width
        out.extend((run_id, k[0], k[1], level, k[2], *a) for k, a in below.items())
    out.sort(key=lambda r: (r[1], r[2], r[3], r[4]))  # one lock order for every writer (PostgreSQL)
    return out


def merge_rollups(conn: Connection, run_id: int, rows: Sequence[PointRow]) -> None:
    """Merge new points (keys not stored before) into the rollups of every level: one statement."""
    summaries = batch_summaries(run_id, rows)
    if summaries:
        bulk_write(conn, "metric_rollups", ROLLUP_COLUMNS, _ROLLUP_TYPES, summaries, _ROLLUP_KEY, _merge_set())


_POINTS_IN = text(
    "SELECT step, tokens, value FROM metric_points "
    "WHERE run_id = :r AND name_id = :n AND layer = :l AND step >= :a AND step < :b"
)
_ROLLUPS_IN = text(
    "SELECT block, n_points, min_step, min_tokens, min_value, max_step, max_tokens, max_value "
    "FROM metric_rollups WHERE run_id = :r AND name_id = :n AND layer = :l AND level = :v "
    "AND block >= :a AND block < :b"
)


def _ranges(blocks: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted block numbers -> inclusive runs of consecutive numbers."""
    out: list[tuple[int, int]] = []
    for b in sorted(set(blocks)):
        if out and b == out[-1][1] + 1:
            out[-1] = (out[-1][0], b)
        else:
            out.append((b, b))
    return out


def refresh_rollups(conn: Connection, run_id: int, touched: Mapping[SeriesKey, Collection[int]]) -> None:
    """Recompute, from the level below, every rollup block containing a ``touched`` step, level by level.

    The stored rows of those blocks are replaced (count, minimum and maximum), so the result is exact
    whatever they held before; blocks whose points are all gone are left as they are (points are
    never deleted one by one: a run's rows go together).
    """
    prev_width = 1
    for level, width in ROLLUP_LEVELS.items():
        out_rows: list[tuple[Any, ...]] = []
        ratio = width // prev_width
        for (name_id, layer), steps in sorted(touched.items()):
            key = {"r": run_id, "n": name_id, "l": layer}
            for b0, b1 in _ranges(s // width for s in steps):
                accs: dict[int, Acc] = {}
                if level == 1:
                    rows = conn.execute(_POINTS_IN, {**key, "a": b0 * width, "b": (b1 + 1) * width})
                    for step, tokens, value in rows:
                        pt = (step, tokens, value)
                        accs[step // width] = _fold(accs.get(step // width), 1, pt, pt)
                else:
                    rows = conn.execute(_ROLLUPS_IN, {**key, "v": level - 1, "a": b0 * ratio, "b": (b1 + 1) * ratio})
                    for blk, n, s0, t0, v0, s1, t1, v1 in rows:
                        accs[blk // ratio] = _fold(accs.get(blk // ratio), n, (s0, t0, v0), (s1, t1, v1))
                out_rows.extend((run_id, name_id, layer, level, block, *a) for block, a in sorted(accs.items()))
        if out_rows:
            replace = ", ".join(f"{c} = excluded.{c}" for c in ROLLUP_COLUMNS[5:])
            bulk_write(conn, "metric_rollups", ROLLUP_COLUMNS, _ROLLUP_TYPES, out_rows, _ROLLUP_KEY, replace)
        prev_width = width
