"""Pending batches and the run lock's cache of series steps (issue 16; monitor/store/pending.py, ingest.py).

On PostgreSQL a batch of new steps is stored as one row per metric name until its chunks seal; each
test compares what the store answers with a plain dict of what was sent (last write wins per key),
and checks where the points are: pending while their chunk is open, packed once it seals, never
in two places. The cache tests run on both databases: two stores on one database stand for two
service processes, each holding its own cache.
"""

from __future__ import annotations

import math
import random
import uuid

import pytest
from sqlalchemy import text

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store import SqlStore, chunks, migrate
from hyperwatch.monitor.store.models import CHUNK_STEPS

W = CHUNK_STEPS
Ref = dict[tuple[str, int | None], dict[int, float]]


def _step(store: SqlStore, run_id: int, ref: Ref, step: int, layers: int = 4, scale: float = 1.0) -> None:
    pts = [Point(n, step, scale * (step + la / 10), layer=la, tokens=step * 8) for n in ("attention_z", "mlp_rms")
           for la in range(layers)]  # fmt: skip
    pts.append(Point("loss", step, math.nan if step % 7 == 3 else 3.0 - step / 100, tokens=None))
    store.ingest(run_id, uuid.uuid4().hex, pts)
    for p in pts:
        ref.setdefault((p.name, p.layer), {})[p.step] = p.value


def _counts(store: SqlStore) -> tuple[int, int, int]:
    """(metric_points rows, point_batches rows, chunk rows of both tables)."""
    with store.engine.connect() as conn:
        return tuple(  # type: ignore[return-value]
            conn.execute(text(f"SELECT count(*) FROM {t}")).scalar()
            for t in ("metric_points", "point_batches", "chunk_rows")
        )


def _check(store: SqlStore, run_id: int, ref: Ref) -> None:
    for (name, layer), want in ref.items():
        got = {p.step: p.value for p in store.series(run_id, name, layer, 10**6, None, None).points}
        assert got.keys() == want.keys(), (name, layer)
        assert all(got[s] == v or (math.isnan(got[s]) and math.isnan(v)) for s, v in want.items()), (name, layer)
    with store.engine.connect() as conn:
        every = chunks.all_points(conn, run_id)
    assert len(every) == len({(p[1], p[2], p[3]) for p in every}) == sum(len(v) for v in ref.values())


def test_steady_training_never_writes_a_point_row(pg_store: SqlStore) -> None:
    """One step per batch, every series at every step: 15 batches wait as pending rows, the 16th packs
    them into chunks; no point ever becomes a metric_points row, and every read sees them meanwhile."""
    store = pg_store
    run, _ = store.upsert_run("default", "steady", {})
    ref: Ref = {}
    for step in range(W - 1):
        _step(store, run.id, ref, step)
    assert _counts(store) == (0, 3 * (W - 1), 0)  # a row per name and batch
    _check(store, run.id, ref)
    window = store.trailing_values(run.id, "attention_z", 2, W - 1, 50)
    assert window == [ref[("attention_z", 2)][s] for s in range(W - 1)]
    _step(store, run.id, ref, W - 1)  # seals chunk 0 of every series
    assert _counts(store) == (0, 0, 9)
    for step in range(W, W + 5):
        _step(store, run.id, ref, step)
    assert _counts(store) == (0, 15, 9)
    _check(store, run.id, ref)
    latest = {(v.name, v.layer): v.value for v in store.list_series(run.id)}
    assert latest[("attention_z", 3)] == ref[("attention_z", 3)][W + 4]


def test_overwrites_and_late_steps_take_pending_points_back(pg_store: SqlStore) -> None:
    store = pg_store
    run, _ = store.upsert_run("default", "late", {})
    ref: Ref = {}
    for step in range(W + 6):
        _step(store, run.id, ref, step)
    assert _counts(store)[:2] == (0, 18)
    # re-send a pending step with other values (last write wins), and a late step into a sealed chunk
    _step(store, run.id, ref, W + 2, scale=-2.0)
    assert _counts(store)[:2] == (9 * 6, 0)  # the pending points became rows, the overwrite went over them
    _step(store, run.id, ref, 3, scale=5.0)
    _check(store, run.id, ref)
    for step in range(W + 6, 2 * W + 3):  # appending again: pending rows again, the rows seal with them
        _step(store, run.id, ref, step)
    assert _counts(store) == (0, 3 * 3, 9 * 2)
    _check(store, run.id, ref)


def test_a_series_that_stops_keeps_its_pending_points(pg_store: SqlStore) -> None:
    """Series logged at different rates: a batch that seals some series' chunks turns the others'
    pending points into rows, and the reads see every point wherever it is."""
    store = pg_store
    run, _ = store.upsert_run("default", "rates", {})
    ref: Ref = {}
    rng = random.Random(5)
    for step in range(3 * W + 4):
        pts = [Point("attention_z", step, rng.gauss(0, 1), layer=la) for la in range(3)]
        if step % 3 == 0 and step < 2 * W:
            pts.append(Point("router_z", step, rng.gauss(5, 1), layer=0))
        store.ingest(run.id, uuid.uuid4().hex, pts)
        for p in pts:
            ref.setdefault((p.name, p.layer), {})[p.step] = p.value
    rows, pending, packed = _counts(store)
    assert rows and pending and packed
    _check(store, run.id, ref)


@pytest.mark.parametrize("seed", [0, 1])
def test_two_services_on_one_database_stay_exact(db_url: str, seed: int) -> None:
    """Two stores (two service processes, one cache each) write one run in turns, with overwrites and
    late steps: each notices the other's writes (its cached steps are stale) and nothing is lost,
    doubled or refused."""
    a, b = SqlStore(db_url), SqlStore(db_url)
    migrate.upgrade(a.engine)
    try:
        run, _ = a.upsert_run("default", "shared", {})
        rng = random.Random(seed)
        ref: Ref = {}
        top = 0
        for turn in range(60):
            store = (a, b)[rng.random() < 0.5]
            if rng.random() < 0.4:  # a re-send of the newest steps, likely the other writer's
                steps = list(range(max(0, top - 3), top + rng.randint(0, 2)))
            else:
                steps = list(range(top, top + rng.randint(1, 5)))
            if rng.random() < 0.2:
                steps.append(rng.randrange(top + 1))  # a late step
            top = max(top, max(steps) + 1)
            pts = [Point("attention_z", s, rng.gauss(0, 1), layer=la) for s in steps for la in range(2)]
            store.ingest(run.id, f"turn-{turn:04d}", pts)
            for p in pts:
                ref.setdefault((p.name, p.layer), {})[p.step] = p.value
            if turn % 10 == 9:
                _check((a, b)[turn % 2], run.id, ref)
        assert a.latest_steps.misses and b.latest_steps.misses  # each saw the other's writes
        assert a.latest_steps.hits + b.latest_steps.hits  # and kept its own steps between them
        _check(a, run.id, ref)
    finally:
        a.close()
        b.close()


def test_the_cache_is_only_used_after_a_commit(db_url: str) -> None:
    """A batch that rolls back (its alert insert fails) leaves the cache as it was: the next batch with
    the same steps is stored as new, not refused as a clash with points that never committed."""
    store = SqlStore(db_url)
    migrate.upgrade(store.engine)
    try:
        run, _ = store.upsert_run("default", "rollback", {})
        store.ingest(run.id, "first-batch", [Point("loss", 0, 1.0)])

        def broken(_reader: object) -> list[object]:
            raise RuntimeError("detector failed")

        with pytest.raises(RuntimeError):
            store.ingest(run.id, "second-batch", [Point("loss", s, 2.0) for s in range(1, 5)], detector=broken)
        store.ingest(run.id, "second-batch", [Point("loss", s, 3.0) for s in range(1, 5)])
        got = {p.step: p.value for p in store.series(run.id, "loss", None, 100, None, None).points}
        assert got == {0: 1.0, 1: 3.0, 2: 3.0, 3: 3.0, 4: 3.0}
    finally:
        store.close()


def test_downgrade_turns_pending_points_into_rows(pg_store: SqlStore) -> None:
    store = pg_store
    run, _ = store.upsert_run("default", "down", {})
    ref: Ref = {}
    for step in range(W + 4):
        _step(store, run.id, ref, step)
    with store.engine.connect() as conn:
        before = chunks.all_points(conn, run.id)
    assert _counts(store)[1] == 3 * 4
    migrate.downgrade(store.engine, "0005_metric_chunks")
    with store.engine.connect() as conn:  # 0005's layout: rows and chunks, no view
        rows = [tuple(r) for r in conn.execute(text("SELECT * FROM metric_points WHERE run_id = :r"), {"r": run.id})]
        for n, la, c, blob in conn.execute(text("SELECT name_id, layer, chunk, data FROM metric_chunks")):
            rows += [(run.id, n, la, *p) for p in chunks.decode(c, bytes(blob))]
    assert sorted(rows) == before
    migrate.upgrade(store.engine)
    store.latest_steps = type(store.latest_steps)()  # a new process: nothing cached, every run at token 0
    _step(store, run.id, ref, W + 4)
    _check(store, run.id, ref)


def test_a_batch_without_points_keeps_the_runs_cached_steps(db_url: str) -> None:
    """An empty batch changes no point, so it keeps the run's ingest token and every cache of the run."""
    store = SqlStore(db_url)
    migrate.upgrade(store.engine)
    try:
        run, _ = store.upsert_run("default", "empty", {})
        store.ingest(run.id, "batch-one", [Point("loss", 0, 1.0)])
        store.ingest(run.id, "batch-empty", [])
        hits = store.latest_steps.hits
        store.ingest(run.id, "batch-two", [Point("loss", 1, 2.0)])
        assert store.latest_steps.hits == hits + 1
        got = {p.step: p.value for p in store.series(run.id, "loss", None, 100, None, None).points}
        assert got == {0: 1.0, 1: 2.0}
    finally:
        store.close()
