"""SQLite: each run's hot rows held in the service's memory as of its ingest token (monitor/store/held.py).

A seal that takes the held rows instead of reading them back must write exactly what a seal that
reads them writes, and any write the holder did not make (a late step, a re-sent one, another
process) must make the next seal read them again.
"""

from __future__ import annotations

import math
import random
import struct
import uuid
from collections.abc import Sequence

import numpy as np
import pytest
from sqlalchemy import text

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store import SqlStore
from hyperwatch.monitor.store.chunks import all_points
from hyperwatch.monitor.store.held import HeldPoints
from hyperwatch.monitor.store.seal import Columns

Rows = list[tuple[object, ...]]
_ODD_NAN = struct.unpack("<d", struct.pack("<Q", 0xFFF8_0000_0000_0123))[0]  # a NaN with a sign and payload


def _history(seed: int, steps: int = 300) -> list[list[Point]]:
    """Appended steps: four layers at other cadences (one gappy, one joining late), the loss, NaN (one
    with other bits), +-Inf and -0.0, tokens linear, absent, partly absent and beyond 2^53; one step or
    several per batch."""
    rng = random.Random(seed)
    out: list[list[Point]] = []
    step = 0
    while step < steps:
        width = rng.choice([1, 1, 1, 2, 5])
        pts: list[Point] = []
        for s in range(step, step + width):
            for la in range(4):
                if (la == 2 and rng.random() < 0.3) or (la == 3 and s < 40):
                    continue
                tokens = [s * 4096, None, None if s % 3 else s, 2**60 + s][la]
                value = rng.choice([rng.gauss(0, 1), rng.gauss(5, 2), math.nan, _ODD_NAN, math.inf, -math.inf, -0.0])
                pts.append(Point("attention_z", s, value, layer=la, tokens=tokens))
            pts.append(Point("loss", s, rng.gauss(3, 0.1), tokens=s * 4096))
        out.append(pts)
        step += width
    return out


def _state(store: SqlStore, run_id: int) -> tuple[Rows, Rows, Rows]:
    """The run's chunk rows (blobs as bytes), rollup rows and hot rows, without the run id."""
    with store.engine.connect() as conn:
        sql = "SELECT * FROM chunk_rows WHERE run_id = :r ORDER BY 2, 3, 4"
        chunk_rows = [(*r[1:5], bytes(r[5]), *r[6:]) for r in conn.execute(text(sql), {"r": run_id})]
        sql = "SELECT * FROM metric_rollups WHERE run_id = :r ORDER BY 2, 3, 4, 5"
        rollups = [tuple(r[1:]) for r in conn.execute(text(sql), {"r": run_id})]
        sql = "SELECT name_id, layer, step, tokens, value FROM metric_points WHERE run_id = :r ORDER BY 1, 2, 3"
        hot = [tuple(r) for r in conn.execute(text(sql), {"r": run_id})]
    return chunk_rows, rollups, hot


def _ingest(store: SqlStore, name: str, history: list[list[Point]]) -> int:
    run, _ = store.upsert_run("default", name, {})
    for pts in history:
        store.ingest(run.id, uuid.uuid4().hex, pts)
    return run.id


@pytest.mark.parametrize("seed", range(3))
def test_a_seal_from_held_rows_writes_what_a_seal_that_reads_them_writes(sqlite_store: SqlStore, seed: int) -> None:
    store = sqlite_store
    history = _history(seed)
    held = store.held_points
    with_held = _ingest(store, "held", history)
    assert held.hits > 0.9 * len(history)  # every batch after the first seal found its rows held
    store.held_points = _NoHold()  # every seal reads its rows back
    read_back = _ingest(store, "read", history)
    assert store.held_points.hits == 0
    assert _state(store, with_held) == _state(store, read_back)
    # and what the run holds is what metric_points holds
    parts = held.get(with_held, _token(store, with_held))
    assert parts is not None
    cols = Columns.join(parts)
    got = sorted(zip(cols.ids.tolist(), cols.layer.tolist(), cols.step.tolist()))
    assert got == [r[:3] for r in _state(store, with_held)[2]]


class _NoHold(HeldPoints):
    def put(self, run_id: int, token: int, parts: Sequence[Columns] | None) -> None:
        self.forget(run_id)


def _token(store: SqlStore, run_id: int) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT ingest_token FROM runs WHERE id = :r"), {"r": run_id}).scalar_one())


def test_a_seal_keeps_the_batch_own_rows_in_its_steps(sqlite_store: SqlStore) -> None:
    """The batch's new hot rows are in the table when its seal deletes a window of steps: a series
    joining at an earlier step, and one lagging behind, keep theirs."""
    store = sqlite_store
    run, _ = store.upsert_run("default", "window", {})
    sent: dict[tuple[int, int], float] = {}

    def send(pts: list[tuple[int, int]]) -> None:
        store.ingest(run.id, uuid.uuid4().hex, [Point("mlp_rms", s, float(s + la), layer=la) for la, s in pts])
        sent.update({(la, s): float(s + la) for la, s in pts})

    for step in range(31):
        send([(0, step)] + ([(2, step)] if step <= 12 else []))
    hits = store.held_points.hits
    # layer 0 seals steps 16-31 and layer 2 steps 0-15 (every held row in the window 0-31); layer 1
    # joins at 20 and layer 2 goes on at 18, both rows inside that window and not sealed
    send([(0, 31), (1, 20), (2, 18)])
    assert store.held_points.hits == hits + 1  # the seal took held rows
    with store.engine.connect() as conn:
        got = {(la, s): v for _r, _n, la, s, _t, v in all_points(conn, run.id)}
    assert got == sent
    hot = sorted((r[1], r[2]) for r in _state(store, run.id)[2])
    assert hot == [(1, 20), (2, 18)]
    parts = store.held_points.get(run.id, _token(store, run.id))
    assert parts is not None
    cols = Columns.join(parts)
    assert sorted(zip(cols.layer.tolist(), cols.step.tolist())) == hot


def test_writes_the_holder_did_not_make_are_read_back(sqlite_store: SqlStore, sqlite_url: str) -> None:
    store = sqlite_store
    history = _history(7, steps=120)
    sent: dict[tuple[int, int], float] = {}
    run, _ = store.upsert_run("default", "others", {})
    other = SqlStore(sqlite_url)  # another service process on the same file
    try:
        for i, pts in enumerate(history):
            writer = other if i % 9 == 4 else store
            writer.ingest(run.id, uuid.uuid4().hex, pts)
            sent.update({(-1 if p.layer is None else p.layer, p.step): p.value for p in pts if p.name == "attention_z"})
            if i % 13 == 6:  # a late step below the latest and a re-sent latest one: the general path
                late = Point("attention_z", pts[0].step - 1, 42.0, layer=0)
                again = Point("attention_z", pts[-1].step, 7.0, layer=1)
                store.ingest(run.id, uuid.uuid4().hex, [late, again])
                sent[(0, late.step)], sent[(1, again.step)] = 42.0, 7.0
    finally:
        other.close()
    assert store.held_points.misses > 10 and store.held_points.hits > 10
    with store.engine.connect() as conn:
        got = {(la, s): math.nan if v is None else v for _r, n, la, s, _t, v in all_points(conn, run.id) if la >= 0}
    assert got.keys() == sent.keys()
    assert all(got[k] == v or (math.isnan(got[k]) and math.isnan(v)) for k, v in sent.items())
    # what the run holds now, if anything, is what metric_points holds
    parts = store.held_points.get(run.id, _token(store, run.id))
    if parts is not None:
        cols = Columns.join(parts)
        hot = _state(store, run.id)[2]
        assert sorted(zip(cols.ids.tolist(), cols.layer.tolist(), cols.step.tolist())) == [r[:3] for r in hot]


def test_memory_is_bounded_and_a_deleted_run_is_forgotten(sqlite_store: SqlStore) -> None:
    held = HeldPoints(max_points=400)

    def cols(n: int) -> Columns:
        a = np.arange(n, dtype=np.int64)
        return Columns(a, a, a, a, a.astype(np.float64))

    held.put(1, 11, [cols(60), cols(40)])
    held.put(2, 22, [cols(100)])
    held.put(3, 33, [cols(101)])  # more than a quarter: not held
    assert held.get(3, 33) is None and held.points == 200
    held.put(4, 44, [cols(100)])
    held.put(5, 55, [cols(100)])  # 400 in all now
    assert held.points == 400 and held.get(1, 11) is not None
    held.put(6, 66, [cols(50)])  # over: the least recently used run (2) goes
    assert held.get(2, 22) is None and held.get(1, 11) is not None and held.points == 350
    assert held.get(1, 12) is None  # another token: a miss
    held.put(1, 12, None)  # a write whose hot rows are not known: forgotten
    assert held.get(1, 11) is None and held.points == 250
    many = [cols(1) for _ in range(40)]
    held.put(7, 77, many)  # parts joined once there are many
    found = held.get(7, 77)
    assert found is not None and len(found) == 1 and len(found[0]) == 40

    store = sqlite_store
    run_id = _ingest(store, "gone", _history(1, steps=40))
    assert store.held_points.get(run_id, _token(store, run_id)) is not None
    store.delete_run(run_id)
    assert store.held_points.points == 0


def test_postgresql_holds_nothing(pg_store: SqlStore) -> None:
    _ingest(pg_store, "pg", _history(2, steps=60))
    assert pg_store.held_points.points == 0 and pg_store.held_points.hits == pg_store.held_points.misses == 0
