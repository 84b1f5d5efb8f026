"""``metric_rollups`` maintenance: blocks are written once, when they are *sealed*; ingest never rewrites a row.

A rollup row summarises one block of one series at one level (1,024 or 4,096 steps since revision
0014, when the 16- and 256-step levels went: ``ROLLUP_LEVELS``; the finest block is one segment, and
:mod:`monitor.store.segments` writes its row when it packs the segment): the count of
points and the point (step, tokens, value) of the minimum and of the maximum value. NaN is stored as
NULL and never wins; +-Inf compete as ordinary values; between equal values the earlier step wins,
so a block's summary is a function of its points alone, whatever order they came in.

Why sealed blocks (measured 2026-11-23, /work/shared/measurements/ingest-2026-11-23.md): merging
every batch into the rollups of its blocks rewrote each open block's row at every level on every
batch: with one step per batch a level-3 row was rewritten 4,096 times, and on PostgreSQL every
rewrite leaves a dead row version (193 MB of dead rollup tuples for 68,608 live rows, 292 B/point).

The rule: block ``b`` of width ``w`` is *sealed* once the series' latest step ``L`` reaches its last
step, ``(b + 1) * w - 1 <= L`` (i.e. ``b < (L + 1) // w``). Appending training steps never adds a
point to a sealed
block, so a sealed block's row is written once, computed from the level below (level 1 from the
points). Readers (:mod:`monitor.store.downsample`) use rollups of sealed blocks only and read the
open tail (< one block per level) from the points.

Per batch and series, with ``L_old`` the latest step before the batch and ``L_new`` after it:

- blocks newly sealed, ``(L_old + 1) // w <= b < (L_new + 1) // w``, are computed (one range per series);
- sealed blocks that receive a point (a late step or an overwrite: last write wins can lower a
  maximum, which no merge could undo) are recomputed from the level below.

Both are "replace the row by the summary of the level below", so the result is exact whatever the
row held. Levels go from fine to coarse; a sealed block's sub-blocks are all sealed, so the level
below is final when it is read. ``L_old`` unknown (a series first written by a concurrent batch)
counts as "nothing sealed": more is recomputed, never less.

Concurrency (PostgreSQL, READ COMMITTED): the writer locks the ``series_latest`` rows of its series
(key order, before anything else is read) and keeps them to commit, so the writers of one series run
one after the other from there and each statement after the lock sees every earlier writer's points.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from operator import itemgetter
from typing import Any

import numpy as np
from sqlalchemy.engine import Connection

from hyperwatch.monitor.store import chunks
from hyperwatch.monitor.store.bulk import bulk_write, read_in_ranges
from hyperwatch.monitor.store.chunks import Cand
from hyperwatch.monitor.store.models import CHUNK_STEPS, ROLLUP_LEVELS

SeriesKey = tuple[int, int]  # (name_id, layer)
PointRow = tuple[int, int, int, int | None, float | None]  # name_id, layer, step, tokens, sql value
Acc = list[Any]  # [n, min_step, min_tokens, min_value, max_step, max_tokens, max_value]
BlockRange = tuple[int, int]  # inclusive first and last block
FINEST = min(ROLLUP_LEVELS)
"""The finest level (one block per segment, :mod:`monitor.store.segments`), computed from points."""
_KEY3 = itemgetter(0, 1, 2)

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
ROLLUP_TYPES = ("int",) * 4 + ("bigint", "int") + ("bigint", "bigint", "float8") * 2
ROLLUP_KEY = ("run_id", "name_id", "layer", "level", "block")
ROLLUP_REPLACE = ", ".join(f"{c} = excluded.{c}" for c in ROLLUP_COLUMNS[5:])


def _better(value: float | None, step: int, best_value: float | None, best_step: int | None, less: bool) -> bool:
    """Does (value, step) beat the best so far? NULL (NaN) never wins; ties go to the earlier step."""
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


def extremes(values: np.ndarray, group: np.ndarray, starts: np.ndarray) -> tuple[Any, Any]:
    """Per group of rows (``group`` ascending, group ``g`` starting at row ``starts[g]``, its rows in step
    order): the row of its minimum and of its maximum value, the earlier step winning a tie; NaN never
    wins, so a group's pick is NaN only when all its values are (then its first row).

    The first row holding the group's ``fmin`` / ``fmax``, by ``reduceat`` (rows in step order: the
    first of a value is its earliest step): a sort of 131,072 points (a pack of 512 series' open ranges)
    took 69 ms, this a few."""
    rows = np.arange(len(values))
    out = []
    for pick in (np.fmin, np.fmax):
        best = pick.reduceat(values, starts) if len(starts) else values[:0]
        hit = values == best[group]  # NaN never equals: an all-NaN group has no hit
        first = np.minimum.reduceat(np.where(hit, rows, len(values)), starts) if len(starts) else starts
        out.append(np.where(first < len(values), first, starts))
    return out[0], out[1]


def _level1(rows: Sequence[PointRow]) -> dict[tuple[int, int, int], Acc]:
    """Level-1 accumulators of key-sorted point rows, on whole columns: per block the first row in
    (value, step) order is its minimum and in (-value, step) order its maximum (NaN sorts last, so it
    wins only a block of NaN alone, which has none; equal values go to the earlier step)."""
    if not rows:
        return {}
    width = ROLLUP_LEVELS[FINEST]
    name_id, layer, step, _tokens, value = zip(*rows)
    ids, layers, steps = (np.array(c, dtype=np.int64) for c in (name_id, layer, step))
    values = np.array(value, dtype=np.float64)  # None (NaN's SQL form) -> NaN
    blocks = steps // width
    new = np.ones(len(rows), dtype=bool)
    new[1:] = (ids[1:] != ids[:-1]) | (layers[1:] != layers[:-1]) | (blocks[1:] != blocks[:-1])
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, len(rows))).tolist()
    lows, highs = (i.tolist() for i in extremes(values, np.cumsum(new) - 1, starts))
    out: dict[tuple[int, int, int], Acc] = {}
    for i, first in enumerate(starts.tolist()):
        key = (name_id[first], layer[first], step[first] // width)
        lo, hi = rows[lows[i]], rows[highs[i]]
        if lo[4] is None:  # every value of the block is NaN
            out[key] = [counts[i], None, None, None, None, None, None]
        else:
            out[key] = [counts[i], lo[2], lo[3], lo[4], hi[2], hi[3], hi[4]]
    return out


def batch_summaries(run_id: int, rows: Sequence[PointRow]) -> list[tuple[Any, ...]]:
    """The rollup rows (``ROLLUP_COLUMNS`` order) summarising ``rows`` alone, every level, key-sorted.

    ``rows`` must be sorted by key: level 1 is one pass over runs of consecutive rows (builtin
    ``min``/``max`` keep the first, i.e. the earliest, of equal values), each coarser level is folded
    from the one below. The reference summary the tests and benchmarks compare the store against.
    """
    first_width = ROLLUP_LEVELS[FINEST]
    below = _level1(rows)
    out: list[tuple[Any, ...]] = [(run_id, k[0], k[1], FINEST, k[2], *a) for k, a in below.items()]
    prev_width = first_width
    for level, width in ROLLUP_LEVELS.items():
        if level == FINEST:
            continue
        ratio = width // prev_width
        accs: dict[tuple[int, int, int], Acc] = {}
        for (name_id, layer, block), a in below.items():
            key = (name_id, layer, block // ratio)
            accs[key] = _fold(accs.get(key), a[0], (a[1], a[2], a[3]), (a[4], a[5], a[6]))
        below, prev_width = accs, width
        out.extend((run_id, k[0], k[1], level, k[2], *a) for k, a in below.items())
    out.sort(key=lambda r: (r[1], r[2], r[3], r[4]))
    return out


def _ranges(blocks: Iterable[int]) -> list[BlockRange]:
    """Block numbers -> sorted inclusive runs of consecutive numbers."""
    out: list[BlockRange] = []
    for b in sorted(set(blocks)):
        if out and b == out[-1][1] + 1:
            out[-1] = (out[-1][0], b)
        else:
            out.append((b, b))
    return out


def _merge_ranges(ranges: Iterable[BlockRange]) -> list[BlockRange]:
    out: list[BlockRange] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def blocks_to_seal(
    width: int, latest_before: int | None, latest_after: int, steps: Collection[int]
) -> list[BlockRange]:
    """Blocks of ``width`` to (re)compute after a batch: newly sealed ones and sealed ones holding ``steps``."""
    sealed_after = sealed_blocks(latest_after, width)  # blocks [0, sealed_after) are sealed
    sealed_before = 0 if latest_before is None else min(sealed_blocks(latest_before, width), sealed_after)
    ranges: list[BlockRange] = []
    if sealed_before < sealed_after:
        ranges.append((sealed_before, sealed_after - 1))
    ranges += _ranges(s // width for s in steps if s // width < sealed_before)
    return _merge_ranges(ranges)


def seal_rollups(
    conn: Connection,
    run_id: int,
    latest_before: Mapping[SeriesKey, int | None],
    latest_after: Mapping[SeriesKey, int],
    steps: Mapping[SeriesKey, Collection[int]],
    known: Mapping[SeriesKey, tuple[list[tuple[int, int]], list[Cand]]] | None = None,
    from_level: int = 1,
) -> int:
    """Write the rollup rows a batch seals or invalidates (see the module doc); returns how many were written.

    ``latest_before``/``latest_after``: each touched series' latest step before and after the batch;
    ``steps``: the steps the batch wrote per series; ``known``: per series, chunk ranges the batch has
    just written and all their points (level 1 over them is computed without reading them back);
    ``from_level``: the finest level to write (the levels below are written already).
    One read and one write statement per level at most.
    """
    written = 0
    prev_width = 1
    first = ROLLUP_LEVELS[FINEST]
    # Most batches seal nothing: a series whose level-1 block did not change and that got no step
    # before it needs nothing at any level (the widths nest, so neither do the coarser ones).
    busy = []
    for key, after in latest_after.items():
        old = latest_before.get(key)
        edge = sealed_blocks(old, first) if old is not None else 0
        if old is None or sealed_blocks(after, first) != edge or min(steps.get(key, (after,))) < edge * first:
            busy.append(key)
    busy.sort()
    for level, width in ROLLUP_LEVELS.items():
        ratio = width // prev_width
        todo: list[tuple[int, ...]] = []
        for key in busy:
            for b0, b1 in blocks_to_seal(width, latest_before.get(key), latest_after[key], steps.get(key, ())):
                if level == FINEST:
                    todo.append((key[0], key[1], b0 * width, (b1 + 1) * width - 1))
                else:
                    todo.append((key[0], key[1], b0 * ratio, (b1 + 1) * ratio - 1))
        prev_width = width
        if not todo or level < from_level:
            continue
        accs: dict[tuple[int, int, int], Acc] = {}
        if level == FINEST:
            points = _level1_points(conn, run_id, todo, known or {})
            points.sort(key=_KEY3)
            accs = _level1(points)
        else:
            cols = "t.block, t.n_points, t.min_step, t.min_tokens, t.min_value, t.max_step, t.max_tokens, t.max_value"
            for n, la, blk, cnt, s0, t0, v0, s1, t1, v1 in read_in_ranges(
                conn, run_id, cols, "metric_rollups", "block", f" AND t.level = {level - 1:d}", todo
            ):
                k = (n, la, blk // ratio)
                accs[k] = _fold(accs.get(k), cnt, (s0, t0, v0), (s1, t1, v1))
        out_rows = [(run_id, k[0], k[1], level, k[2], *a) for k, a in sorted(accs.items())]
        bulk_write(conn, "metric_rollups", ROLLUP_COLUMNS, ROLLUP_TYPES, out_rows, ROLLUP_KEY, ROLLUP_REPLACE)
        written += len(out_rows)
    return written


def _level1_points(
    conn: Connection,
    run_id: int,
    todo: list[tuple[int, ...]],
    known: Mapping[SeriesKey, tuple[list[tuple[int, int]], list[Cand]]],
) -> list[Any]:
    """The points of (name_id, layer, first step, last step) ranges: from ``known`` chunks, else the database."""
    out: list[Any] = []
    unknown: list[tuple[int, int, int, int]] = []
    for n, la, a, b in todo:
        spans, pts = known.get((n, la), ((), ()))
        ca, cb = a // CHUNK_STEPS, b // CHUNK_STEPS
        if any(c0 <= ca and cb <= c1 for c0, c1 in spans):
            out += [(n, la, *p) for p in pts if a <= p[0] <= b]
        else:
            unknown.append((n, la, a, b))
    if unknown:
        out += chunks.points_in_ranges(conn, run_id, unknown)
    return out


def sealed_blocks(latest_step: int, width: int) -> int:
    """How many leading blocks of ``width`` are sealed (have their rollup row) when the latest step is given:
    those whose last step the series has reached (the chunks of :mod:`monitor.store.compact` seal alike)."""
    return (latest_step + 1) // width
