"""Rollups stay exact under incremental maintenance: random batches, overwrites, NaN/Inf, ties, concurrency.

The reference is a brute-force summary of every stored point (hot rows and packed chunks alike) per
block and level (count, the minimum and the maximum point, NaN never winning, ties to the earlier
step) over the *sealed* blocks (those whose last step the series' latest step has reached); the stored rollup rows must
be exactly those, each equal to it. The writers' batches cross chunk boundaries and write late into
sealed chunks, so the chunks' rewrites are checked by the same reference.
"""

from __future__ import annotations

import math
import random
import threading
import uuid
from typing import Any

from sqlalchemy import event, text

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store import SqlStore, chunks
from hyperwatch.monitor.store.models import CHUNK_STEPS as W
from hyperwatch.monitor.store.models import ROLLUP_LEVELS, hot_relation
from hyperwatch.monitor.store.rollups import batch_summaries

Row = tuple[Any, ...]


def brute_force(store: SqlStore) -> dict[tuple[int, int, int, int, int], Row]:
    with store.engine.connect() as conn:
        points = chunks.all_points(conn)  # hot rows and chunks alike
    out: dict[tuple[int, int, int, int, int], list[Any]] = {}
    for run_id, name_id, layer, step, tokens, value in sorted(points, key=lambda r: (r[0], r[1], r[2], r[3])):
        for level, width in ROLLUP_LEVELS.items():
            acc = out.setdefault(
                (run_id, name_id, layer, level, step // width), [0, None, None, None, None, None, None]
            )
            acc[0] += 1
            if value is not None and (acc[3] is None or value < acc[3]):  # ascending steps: ties keep the first
                acc[1:4] = [step, tokens, value]
            if value is not None and (acc[6] is None or value > acc[6]):
                acc[4:7] = [step, tokens, value]
    latest: dict[tuple[int, int, int], int] = {}
    for run_id, name_id, layer, step, _t, _v in points:
        latest[(run_id, name_id, layer)] = max(step, latest.get((run_id, name_id, layer), -1))
    # only sealed blocks (the series' latest step has reached their last step) have a row
    return {k: tuple(v) for k, v in out.items() if k[4] < (latest[k[:3]] + 1) // ROLLUP_LEVELS[k[3]]}


def stored(store: SqlStore) -> dict[tuple[int, int, int, int, int], Row]:
    sql = (
        "SELECT run_id, name_id, layer, level, block, n_points, min_step, min_tokens, min_value, "
        "max_step, max_tokens, max_value FROM metric_rollups"
    )
    with store.engine.connect() as conn:
        return {tuple(r[:5]): tuple(r[5:]) for r in conn.execute(text(sql))}


def _value(rng: random.Random) -> float:
    roll = rng.random()
    if roll < 0.04:
        return math.nan
    if roll < 0.06:
        return rng.choice([math.inf, -math.inf])
    return float(rng.choice([1.0, 2.0, 2.0, 3.0, -1.0, 0.0, -0.0]) if roll < 0.3 else round(rng.gauss(0, 10), 1))


def test_batch_summaries_fold_the_levels_with_nan_never_winning() -> None:
    # levels 2 (1,024 steps) and 3 (4,096) since revision 0014
    rows = [(1, 0, 3, 30, None), (1, 0, 5, 50, 2.0), (1, 0, 1029, 170, 2.0), (1, 0, 1040, 200, -math.inf)]
    got = {(r[3], r[4]): r[5:] for r in batch_summaries(7, rows)}
    assert got[(2, 0)] == (2, 5, 50, 2.0, 5, 50, 2.0)  # the NaN point counts but is no extreme
    assert got[(2, 1)] == (2, 1040, 200, -math.inf, 1029, 170, 2.0)
    assert got[(3, 0)] == (4, 1040, 200, -math.inf, 5, 50, 2.0)  # the tie at 2.0: the earlier step


def test_random_batches_with_overwrites_keep_every_block_exact(store: SqlStore) -> None:
    rng = random.Random(20250101)
    run, _ = store.upsert_run("default", "exact", {})
    other, _ = store.upsert_run("default", "other", {})
    for i in range(40):
        if i % 3 == 0:  # appending, as training does
            start = 300 * i
            steps = list(range(start, start + rng.randint(1, 300)))
        else:  # re-sending old steps (overwrites), out of order, with repeats inside the batch
            steps = [rng.randrange(0, 300 * (i + 1)) for _ in range(rng.randint(1, 120))]
        pts = [
            Point(rng.choice(["attention_z", "loss"]), s, _value(rng), layer=rng.choice([None, 0, 1]), tokens=s * 3)
            for s in steps
        ]
        store.ingest(rng.choice([run.id, other.id]), uuid.uuid4().hex, pts)
    expected = brute_force(store)
    assert len(expected) > 100
    _assert_split_at_boundary(store)  # the reference read the chunks; the writer rewrote some of them
    got = stored(store)
    assert got.keys() == expected.keys()
    for key, want in expected.items():
        assert _same(got[key], want), (key, got[key], want)


def test_overwrite_lowering_the_maximum_is_recomputed(store: SqlStore) -> None:
    run, _ = store.upsert_run("default", "lower", {})
    store.ingest(run.id, uuid.uuid4().hex, [Point("loss", s, 1.0 + (s == 5) * 99.0) for s in range(1030)])
    store.ingest(run.id, uuid.uuid4().hex, [Point("loss", 5, 0.5), Point("loss", 1100, math.nan)])
    got = stored(store)
    block0 = next(v for k, v in got.items() if k[3:] == (2, 0))  # the first segment's block (1,024 steps)
    assert block0[0] == 1024 and block0[3] == 0.5 and block0[6] == 1.0 and block0[4] == 0  # min 0.5 @5, max 1.0 @0
    assert got == brute_force(store)


def test_concurrent_writers_of_the_same_blocks_stay_exact(store: SqlStore) -> None:
    """Writers interleave on the same series and blocks, some re-sending others' steps (PostgreSQL: in parallel)."""
    run, _ = store.upsert_run("default", "busy", {})
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        rng = random.Random(k)
        try:
            for _ in range(6):
                steps = [rng.randrange(0, 600) for _ in range(80)]
                pts = [Point("attention_z", s, _value(rng), layer=s % 2, tokens=k) for s in steps]
                store.ingest(run.id, uuid.uuid4().hex, pts)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    _assert_split_at_boundary(store)
    expected = brute_force(store)
    got = stored(store)
    assert got.keys() == expected.keys()
    for key, want in expected.items():
        assert _same(got[key], want), (key, got[key], want)


def _assert_split_at_boundary(store: SqlStore) -> None:
    """Chunks are in play, and every hot point lies at or past its series' sealed boundary."""
    with store.engine.connect() as conn:
        n_chunks = conn.execute(text("SELECT count(*) FROM chunk_rows")).scalar()
        late = conn.execute(
            text(
                f"SELECT count(*) FROM {hot_relation(store.engine.dialect.name)} AS p JOIN series_latest AS s "
                "ON s.run_id = p.run_id "
                f"AND s.name_id = p.name_id AND s.layer = p.layer WHERE p.step < (s.step + 1) / {W} * {W}"
            )
        ).scalar()
    assert n_chunks and late == 0  # both databases pack sealed points (SQLite since revision 0006)


def _same(a: Row, b: Row) -> bool:
    """Equal rows; -0.0 == 0.0 as the databases compare them, so the step decides the tie as in SQL."""
    return all(
        x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))
        for x, y in zip(a, b)
    )


def test_appending_steps_writes_each_rollup_row_once(store: SqlStore) -> None:
    """One step per batch (training's pattern): no rollup row is ever rewritten (no dead versions on PostgreSQL)."""
    run, _ = store.upsert_run("default", "append", {})
    writes: list[int] = []

    def count(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, executemany: bool) -> None:
        if statement.startswith("INSERT INTO metric_rollups"):
            # SQLite: one parameter tuple per row; PostgreSQL: one array per column, a numeric one as
            # its literal '{a,b,..}' (see monitor/store/bulk.py)
            first = parameters if executemany else parameters[0]
            writes.append(len(first) if not isinstance(first, str) else first.count(",") + 1)

    event.listen(store.engine, "before_cursor_execute", count)
    try:
        for first in range(0, 4200, 4):  # a few steps per batch keeps the test short; still no block rewrite
            pts = [Point("attention_z", s, float(s % 7), layer=la) for s in range(first, first + 4) for la in range(3)]
            store.ingest(run.id, uuid.uuid4().hex, pts)
    finally:
        event.remove(store.engine, "before_cursor_execute", count)
    got = stored(store)
    assert got == brute_force(store)
    assert len(got) == 3 * (4203 // 1024 + 4203 // 4096)
    assert sum(writes) == len(got)  # every row written exactly once


def test_bucket_extremes_over_rollup_blocks_equal_every_point_read(store: SqlStore) -> None:
    """Buckets of whole rollup blocks (``downsample.bucket_extremes`` reads the blocks inside and decodes
    the open tail): the min and max of every bucket, NaN never winning, ties to the earlier step, equal
    those of every stored point. (A block that straddles two buckets counts for the one it starts in.)"""
    from hyperwatch.monitor.store import downsample

    rng = random.Random(7)
    run, _ = store.upsert_run("default", "wide", {})
    for s0 in range(0, 13_000, 500):  # ~3 level-3 blocks, values with many ties, NaN and +-Inf
        pts = [Point("loss", s, _value(rng), tokens=s) for s in range(s0, s0 + 500)]
        store.ingest(run.id, uuid.uuid4().hex, pts)
    pts = [Point("loss", s, math.nan) for s in range(4096, 5120)]  # a whole block of NaN alone
    store.ingest(run.id, uuid.uuid4().hex, pts)
    with store.engine.connect() as conn:
        every = [p for p in chunks.all_points(conn, run.id) if p[5] is not None]
        params = {"run_id": run.id, "name_id": every[0][1], "layer": -1}
        for lo, hi, w in [(0, 12_999, 1024), (1024, 12_999, 2048), (0, 12_999, 4096), (4096, 12_999, 8192)]:
            want: dict[int, dict[str, tuple[Any, ...]]] = {}
            for _r, _n, _la, s, t, v in every:
                if lo <= s <= hi:
                    slot = want.setdefault((s - lo) // w, {})
                    if "min" not in slot or v < slot["min"][2]:  # ascending steps: ties keep the first
                        slot["min"] = (s, t, v)
                    if "max" not in slot or v > slot["max"][2]:
                        slot["max"] = (s, t, v)
            assert downsample.bucket_extremes(conn, params, lo, hi, w) == want, (lo, hi, w)
