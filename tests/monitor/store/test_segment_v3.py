"""Segment blobs of version 3 (revision 0022, issue 36): the codec against version 2, bit for bit, and
the migration both ways on both databases, with a writer inside the chunk tables when it starts."""

from __future__ import annotations

import math
import random
import sqlite3
import uuid
from typing import Any

import numpy as np
import psycopg
import pytest
from sqlalchemy import text

from hyperwatch.hooks.columns import NULL_INT
from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store import SqlStore, chunks, migrate, segcodec
from tests.monitor.store.test_migration_writers import behind_writer

BEFORE = "0021_stopped_tails"


def _case(rng: np.random.Generator, trial: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """(base, steps, tokens, values) of one segment: regular or odd steps; tokens none, linear (also
    negative), any int64, or some NULL; values of every magnitude, float32-valued or not, NaN and +-Inf."""
    base = int(rng.integers(0, 5)) * 1024
    n = int(rng.integers(1, 1025))
    if trial % 3 == 0:
        off = int(rng.integers(0, 3)) + int(rng.integers(1, 5)) * np.arange(n)
        off = off[off < 1024]
    else:
        off = np.sort(rng.choice(1024, n, replace=False))
    steps = off.astype(np.int64) + base
    n = len(steps)
    kind = trial % 4
    if kind == 0:
        tokens = np.full(n, NULL_INT, dtype=np.int64)
    elif kind == 1:
        tokens = (trial - 50) * 10**9 + 512 * (steps - steps[0])
    else:
        tokens = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
        if kind == 3:
            tokens[rng.random(n) < 0.3] = NULL_INT
    values = rng.normal(size=n) * 10.0 ** int(rng.integers(-300, 300))
    if trial % 2:
        values = values.astype(np.float32).astype(np.float64)
    u = rng.random(n)
    values[u < 0.05], values[(u >= 0.05) & (u < 0.07)], values[(u >= 0.07) & (u < 0.09)] = math.nan, math.inf, -math.inf
    return base, steps, tokens, values


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # float32 casts of huge values: +-Inf, as wanted
def test_both_versions_round_trip_every_bit() -> None:
    rng = np.random.default_rng(36)
    for trial in range(300):
        base, steps, tokens, values = _case(rng, trial)
        span = int(rng.integers(1, 65))
        for version in segcodec.SEGMENT_VERSIONS:
            blob = segcodec.encode(base, span, steps, tokens, values, version=version)
            assert blob[0] == version and segcodec.is_segment(blob)
            s, t, v = segcodec.decode(base, blob)
            assert s.tolist() == steps.tolist() and t.tolist() == tokens.tolist(), (trial, version)
            assert v.view(np.uint64).tolist() == values.view(np.uint64).tolist(), (trial, version)
            s2, v2 = segcodec.decode_steps_values(base, blob)
            assert s2.tolist() == steps.tolist() and v2.view(np.uint64).tolist() == values.view(np.uint64).tolist()
            assert segcodec.span(blob[:8]) == span


def test_a_short_series_segment_is_shorter_by_its_framing() -> None:
    steps = np.arange(0, 200, 4, dtype=np.int64)  # 50 points, as the real-hooks fixture logs them
    values = np.random.default_rng(1).lognormal(size=50).astype(np.float32).astype(np.float64)
    tokens = 4096 + 2048 * steps
    v2 = segcodec.encode(0, 13, steps, tokens, values, version=segcodec.V2)
    v3 = segcodec.encode(0, 13, steps, tokens, values)
    assert v3[0] == segcodec.V3 == segcodec.VERSION
    assert len(v2) - len(v3) >= 30  # 19 of header, 15 of pcodec's standalone framing


def test_writing_sets_the_version_and_refuses_an_unknown_one() -> None:
    one = np.array([7], dtype=np.int64)
    with segcodec.writing(segcodec.V2):
        assert segcodec.encode(0, 1, one, one, np.array([1.0]))[0] == segcodec.V2
    assert segcodec.encode(0, 1, one, one, np.array([1.0]))[0] == segcodec.V3
    with pytest.raises(ValueError, match="version: one of"), segcodec.writing(1):
        pass
    with pytest.raises(ValueError, match="version: one of"):
        segcodec.encode(0, 1, one, one, np.array([1.0]), version=4)
    assert not segcodec.is_segment(chunks.encode(0, [(3, None, 1.0)])[0])  # a 16-step chunk


def _send(store: SqlStore, run_id: int, steps: int) -> None:
    """Two series: full-mantissa doubles with NaN and +-Inf (segments past a TOAST chunk), and a
    float32-valued one logged every 4 steps."""
    rng = random.Random(22)
    special = {5: math.nan, 700: math.inf, 1500: -math.inf}
    for s0 in range(0, steps, 100):
        pts = [
            Point("loss", s, special.get(s, rng.random() * 10 ** rng.uniform(-3, 3)), tokens=s * 8)
            for s in range(s0, min(s0 + 100, steps))
        ]
        pts += [Point("z", s, float(np.float32(rng.random())), layer=1) for s in range(s0, min(s0 + 100, steps), 4)]
        store.ingest(run_id, uuid.uuid4().hex, pts)


def _versions(store: SqlStore) -> dict[int, int]:
    with store.engine.connect() as conn:
        blobs = [bytes(b) for (b,) in conn.execute(text("SELECT data FROM chunk_rows"))]
    out: dict[int, int] = {}
    for blob in blobs:
        out[blob[0]] = out.get(blob[0], 0) + 1
    return out


def _points(store: SqlStore) -> list[tuple[Any, ...]]:
    with store.engine.connect() as conn:
        return [(*p[:5], repr(p[5])) for p in chunks.all_points(conn)]  # repr: NaN == NaN


def test_0022_recodes_every_segment_both_ways(db_url: str) -> None:
    store = SqlStore(db_url)
    try:
        migrate.upgrade(store.engine)
        done, _ = store.upsert_run("default", "done", {})
        _send(store, done.id, 2700)  # two whole segments per series, the open range folded at the stop
        store.update_run(done.id, {"status": "finished"})
        store.hot_vacuum.wait()  # the stop's vacuum done: a migration's lock waits for no chore
        live, _ = store.upsert_run("default", "live", {})
        _send(store, live.id, 1400)  # running: its open range's partial segment in open_chunks
        points = _points(store)
        assert len(points) == 2700 + 675 + 1400 + 350
        assert set(_versions(store)) <= {1, segcodec.V3}
        migrate.downgrade(store.engine, BEFORE)
        before = _versions(store)
        assert segcodec.V3 not in before and before[segcodec.V2] >= 6
        assert _points(store) == points
        migrate.upgrade(store.engine)
        assert _versions(store).get(segcodec.V3) == before[segcodec.V2] and segcodec.V2 not in _versions(store)
        assert _points(store) == points
        got = {p.step: p.value for p in store.series(done.id, "loss", None, 100_000, None, None).points}
        assert math.isnan(got[5]) and got[700] == math.inf and got[1500] == -math.inf and len(got) == 2700
    finally:
        store.close()


@pytest.mark.parametrize("move", ["up", "down"])
def test_0022_waits_for_a_writer_inside_and_keeps_its_row(db_url: str, move: str) -> None:
    """A writer inside the chunk tables when the migration starts (a segment row written, not
    committed): the migration waits behind its lock, and the writer's row is there afterwards."""
    store = SqlStore(db_url)
    try:
        migrate.upgrade(store.engine)
        run, _ = store.upsert_run("default", "r", {})
        _send(store, run.id, 1100)
        if move == "up":
            migrate.downgrade(store.engine, BEFORE)  # version-2 blobs, as the code before 0022 left them
        with store.engine.connect() as conn:
            nid = conn.execute(text("SELECT id FROM metric_names WHERE name = 'loss'")).scalar_one()
        pg = store.engine.dialect.name == "postgresql"
        writer: Any
        if pg:
            writer = psycopg.connect(db_url.replace("+psycopg", ""))
        else:
            writer = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
            writer.execute("BEGIN IMMEDIATE")
        mark = "%s" if pg else "?"
        steps = np.arange(4096, 4106, dtype=np.int64)
        blob = segcodec.encode(4096, 1, steps, steps * 8, steps * 0.5, version=segcodec.V2)  # the code before 0022
        writer.execute(
            "INSERT INTO metric_chunks (run_id, name_id, layer, chunk, nonfinite, data) "
            f"VALUES ({mark}, {mark}, -1, 256, 0, {mark})",
            (run.id, nid, blob),
        )
        target = migrate.upgrade if move == "up" else lambda engine: migrate.downgrade(engine, BEFORE)
        behind_writer(db_url, writer, lambda: target(store.engine))
        with store.engine.connect() as conn:
            got = [(p[3], p[5]) for p in chunks.all_points(conn, run.id) if p[1] == nid and p[3] >= 4096]
        assert got == [(int(s), float(s) * 0.5) for s in steps]
        assert (segcodec.V3 if move == "down" else segcodec.V2) not in _versions(store)  # the writer's row too
    finally:
        store.close()
