"""Sealed points packed into ``metric_chunks``: the codec is exact, and every read sees hot and chunked alike.

Chunks are written on PostgreSQL only (SQLite keeps rows: see monitor.store.compact); the read
tests run on both, so SQLite checks the same reads over rows alone.

The reference is a plain dict of what was sent (last write wins per key, NaN as NaN); the store's
answers, whichever table holds each point, must equal it.
"""

from __future__ import annotations

import math
import random
import struct
import threading
import time
import uuid
from typing import Any

import pytest
from sqlalchemy import event, text

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store import SqlStore, chunks, points, segments
from hyperwatch.monitor.store.compact import boundary
from hyperwatch.monitor.store.hot import HotVacuum
from hyperwatch.monitor.store.models import CHUNK_STEPS, hot_relation

W = CHUNK_STEPS
Ref = dict[tuple[str, int | None], dict[int, tuple[int | None, float]]]


def _bits(v: float | None) -> Any:
    return None if v is None else struct.pack("<d", v)  # -0.0 is not 0.0 here


@pytest.mark.parametrize("seed", range(40))
def test_codec_round_trips_every_shape(seed: int) -> None:
    rng = random.Random(seed)
    chunk = rng.choice([0, 1, 7, 2**40])
    base = chunk * W
    offsets = sorted(rng.sample(range(W), rng.randint(1, W))) if seed % 3 else list(range(rng.randint(0, 4), W))
    kind = seed % 5
    pts: list[chunks.Cand] = []
    for i, o in enumerate(offsets):
        tokens: int | None
        if kind == 0:
            tokens = None
        elif kind == 1:
            tokens = 1000 + 4096 * (o - offsets[0])  # linear in the step
        elif kind == 2:
            tokens = rng.choice([None, 0, 5, 2**63 - 1, -(2**63)])
        else:
            tokens = rng.randrange(-(2**63), 2**63)
        value = rng.choice([None, math.inf, -math.inf, -0.0, 0.0, 5e-324, 1.7976931348623157e308, rng.gauss(0, 1)])
        pts.append((base + o, tokens, value if i % 4 else rng.gauss(0, 1)))
    blob, nonfinite = chunks.encode(chunk, pts)
    back = chunks.decode(chunk, blob)
    assert [(s, t, _bits(v)) for s, t, v in back] == [(s, t, _bits(v)) for s, t, v in pts]
    assert nonfinite == sum(1 for p in pts if p[2] is None or not math.isfinite(p[2]))


def test_codec_is_compact_for_training_series() -> None:
    pts: list[chunks.Cand] = [(48 + i, (48 + i) * 4096, 1.0 + i / 7) for i in range(W)]
    blob, _ = chunks.encode(3, pts)
    assert len(blob) == 4 + 2 + 16 + 8 * W  # header, first offset, linear tokens, the doubles


def test_codec_refuses_points_outside_the_chunk() -> None:
    with pytest.raises(ValueError, match="outside chunk 1"):
        chunks.encode(1, [(W - 1, None, 1.0)])
    with pytest.raises(ValueError, match="1 to 16 points"):
        chunks.encode(1, [])
    with pytest.raises(ValueError, match="format version 9"):
        chunks.decode(0, b"\x09\x00\x01\x00")


def _ingest(store: SqlStore, run_id: int, ref: Ref, pts: list[Point]) -> None:
    store.ingest(run_id, uuid.uuid4().hex, pts)
    for p in pts:  # within a batch the last occurrence wins, as across batches
        ref.setdefault((p.name, p.layer), {})[p.step] = (p.tokens, p.value)


def _random_history(store: SqlStore, seed: int) -> tuple[int, Ref]:
    """Appends (training), late writes into sealed chunks, overwrites in the hot tail, NaN/Inf, sparse steps."""
    rng = random.Random(seed)
    run, _ = store.upsert_run("default", f"chunks{seed}", {})
    ref: Ref = {}
    top = 0
    for i in range(30):
        if i % 3 != 2:
            stride = rng.choice([1, 1, 3])
            steps = list(range(top, top + rng.randint(1, 90), stride))
            top = steps[-1] + 1
        else:
            steps = [rng.randrange(0, top + 5) for _ in range(rng.randint(1, 40))]
        pts = []
        for s in steps:
            roll = rng.random()
            v = math.nan if roll < 0.05 else (math.inf if roll < 0.07 else round(rng.gauss(0, 5), 2))
            tokens = None if roll > 0.95 else s * 64 + rng.choice([0, 0, 0, 1])
            pts.append(Point(rng.choice(["attention_z", "loss"]), s, v, layer=rng.choice([None, 0, 3]), tokens=tokens))
        _ingest(store, run.id, ref, pts)
    return run.id, ref


def _same(got: list[tuple[int, int | None, float]], want: dict[int, tuple[int | None, float]]) -> bool:
    expected = [(s, *want[s]) for s in sorted(want)]
    return len(got) == len(expected) and all(
        g[0] == e[0] and g[1] == e[1] and (g[2] == e[2] or (math.isnan(g[2]) and math.isnan(e[2])))
        for g, e in zip(got, expected)
    )


def test_hot_rows_and_chunks_split_at_the_boundary(pg_store: SqlStore) -> None:
    store = pg_store
    run_id, ref = _random_history(store, 1)
    with store.engine.connect() as conn:
        latest = {
            (n, la): s
            for n, la, s in conn.execute(
                text("SELECT name_id, layer, step FROM series_latest WHERE run_id = :r"), {"r": run_id}
            )
        }
        hot = conn.execute(
            text(f"SELECT name_id, layer, step FROM {hot_relation('postgresql')} WHERE run_id = :r"), {"r": run_id}
        ).all()
        n_chunks = conn.execute(text("SELECT count(*) FROM chunk_rows WHERE run_id = :r"), {"r": run_id}).scalar()
        every = chunks.all_points(conn, run_id)
    assert n_chunks and n_chunks > 5 and hot  # both tables in use
    assert all(s >= boundary(latest[(n, la)]) for n, la, s in hot)  # hot: only past the sealed boundary
    hot_keys = {(n, la, s) for n, la, s in hot}
    chunked = [p for p in every if p[1:4] not in hot_keys]
    assert all(p[3] < boundary(latest[(p[1], p[2])]) for p in chunked)
    assert len(every) == sum(len(v) for v in ref.values())  # every key once


@pytest.mark.parametrize("seed", [2, 3])
def test_every_read_sees_hot_and_chunked_points_alike(store: SqlStore, seed: int) -> None:
    run_id, ref = _random_history(store, seed)
    for (name, layer), want in ref.items():
        whole = store.series(run_id, name, layer, 10**6, None, None)  # few points: returned whole
        assert not whole.downsampled
        assert _same([(p.step, p.tokens, p.value) for p in whole.points], want), (name, layer)
        lo, hi = 5, max(want) - 7  # edges in the middle of chunks
        part = store.series(run_id, name, layer, 10**6, lo, hi)
        assert _same(
            [(p.step, p.tokens, p.value) for p in part.points], {s: v for s, v in want.items() if lo <= s <= hi}
        )
        for before in (3, max(want) // 2, max(want) + 1):
            window = store.trailing_values(run_id, name, layer, before, 50)
            expected = [want[s][1] for s in sorted(want) if s < before][-50:]
            assert len(window) == len(expected)
            assert all(a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(window, expected))
        # narrow buckets (< one block) read the chunks decoded: every bucket's exact extremes, and every event
        buckets = max(2, (max(want) - min(want) + 1) // 5)
        ds = store.series(run_id, name, layer, buckets, None, None)
        got = {p.step: p.value for p in ds.points}
        first, last = min(want), max(want)
        w = -(-(last - first + 1) // buckets)
        if ds.downsampled:
            for b in range((last - first) // w + 1):
                # +-Inf compete as values; NaN never wins
                cands = [(v[1], s) for s, v in want.items() if (s - first) // w == b and not math.isnan(v[1])]
                if cands:
                    lo_v, lo_s = min(cands)
                    hi_s = min(s for v, s in cands if v == max(cands)[0])
                    assert got.get(lo_s) == lo_v and hi_s in got, (name, layer, b)
        for s, (_t, v) in want.items():
            if not math.isfinite(v):
                assert s in got and (math.isnan(got[s]) if math.isnan(v) else got[s] == v)


def _pack_every(monkeypatch: pytest.MonkeyPatch, steps: int) -> None:
    """Pack the open range every ``steps`` (tests of the 16-step chunks keep 100 steps out of a segment)."""
    monkeypatch.setattr(points, "PACK_STEPS", steps)
    monkeypatch.setattr(segments, "PACK_STEPS", steps)


def test_late_write_rewrites_its_chunk_in_place(pg_store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> None:
    _pack_every(monkeypatch, 256)
    store = pg_store
    run, _ = store.upsert_run("default", "late", {})
    store.ingest(run.id, uuid.uuid4().hex, [Point("loss", s, float(s), tokens=s) for s in range(100)])
    with store.engine.connect() as conn:
        before = conn.execute(text("SELECT chunk, data FROM chunk_rows ORDER BY chunk")).all()
    assert [c for c, _ in before] == list(range(100 // W))
    store.ingest(run.id, uuid.uuid4().hex, [Point("loss", 17, math.nan, tokens=None), Point("loss", 200, -1.0)])
    store.ingest(run.id, uuid.uuid4().hex, [Point("loss", 101, math.inf)])  # in a chunk sealed by step 200
    with store.engine.connect() as conn:
        after = dict(conn.execute(text("SELECT chunk, data FROM chunk_rows")).all())
        nonfinite = dict(conn.execute(text("SELECT chunk, nonfinite FROM chunk_rows")).all())
        hot = conn.execute(text(f"SELECT step FROM {hot_relation('postgresql')} ORDER BY step")).scalars().all()
    assert hot == [200]
    assert nonfinite[1] == 1 and nonfinite[101 // W] == 1 and nonfinite[0] == 0
    assert chunks.decode(1, bytes(after[1]))[1] == (17, None, None)
    assert after[0] == before[0][1]  # untouched chunks are not rewritten
    got = {p.step: p.value for p in store.series(run.id, "loss", None, 10**6, None, None).points}
    assert math.isnan(got[17]) and got[101] == math.inf and got[200] == -1.0 and got[16] == 16.0
    assert len(got) == 102


def test_hot_table_is_vacuumed_on_postgresql(store: SqlStore) -> None:
    store.hot_vacuum = HotVacuum(store.engine, after_rows=4_096)
    run, _ = store.upsert_run("default", "vacuum", {})
    for step in range(0, 8 * W, 4):  # 64 series x 8 chunks: 12 hot rows each moved per chunk, 6,144 in all
        pts = [Point("attention_z", s, 1.0, layer=la) for s in range(step, step + 4) for la in range(64)]
        store.ingest(run.id, uuid.uuid4().hex, pts)
    store.hot_vacuum.wait()
    assert store.hot_vacuum.runs == (1 if store.engine.dialect.name == "postgresql" else 0)


def test_every_hot_vacuum_takes_the_open_chunks(pg_store: SqlStore) -> None:
    """The open ranges' churn (``open_chunks``) is vacuumed with the hot tables, every time."""

    def vacuums(table: str) -> int:
        with pg_store.engine.connect() as conn:
            q = text("SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = :t")
            return int(conn.execute(q, {"t": table}).scalar_one())

    tables = ("open_chunks", "point_batches", "metric_chunks")
    before = {t: vacuums(t) for t in tables}
    hv = pg_store.hot_vacuum = HotVacuum(pg_store.engine, after_rows=1)
    for _ in range(3):
        hv.moved(1)
        hv.wait()
    assert hv.runs == 3
    deadline = time.monotonic() + 10
    while vacuums("open_chunks") - before["open_chunks"] < 3 and time.monotonic() < deadline:
        time.sleep(0.1)  # statistics reach the view shortly after the vacuum
    assert {t: vacuums(t) - before[t] for t in tables} == {"open_chunks": 3, "point_batches": 3, "metric_chunks": 0}


def test_sqlite_packs_sealed_points_too(sqlite_store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Since revision 0006 (see store.compact): 100 steps are 6 chunks and 4 hot rows (no pack before
    step 256); packed every 64 steps, a segment row (chunks 0-3) and chunks 4 and 5."""
    _pack_every(monkeypatch, 256)
    run, _ = sqlite_store.upsert_run("default", "rows", {})
    for step in range(100):  # one step per batch: the hot rows move into a chunk at every 16th
        sqlite_store.ingest(run.id, uuid.uuid4().hex, [Point("loss", step, float(step))])
    with sqlite_store.engine.connect() as conn:
        assert conn.execute(text("SELECT step FROM metric_points")).scalars().all() == [96, 97, 98, 99]
        assert conn.execute(text("SELECT chunk FROM chunk_rows ORDER BY chunk")).scalars().all() == list(range(6))
    got = sqlite_store.series(run.id, "loss", None, 1000, None, None).points
    assert [(p.step, p.value) for p in got] == [(s, float(s)) for s in range(100)]
    _pack_every(monkeypatch, 64)
    run, _ = sqlite_store.upsert_run("default", "packed", {})
    for step in range(100):
        sqlite_store.ingest(run.id, uuid.uuid4().hex, [Point("loss", step, float(step))])
    with sqlite_store.engine.connect() as conn:
        q = text("SELECT chunk FROM chunk_rows WHERE run_id = :r ORDER BY chunk")
        assert conn.execute(q, {"r": run.id}).scalars().all() == [0, 4, 5]
    got = sqlite_store.series(run.id, "loss", None, 1000, None, None).points
    assert [(p.step, p.value) for p in got] == [(s, float(s)) for s in range(100)]


def test_a_read_straddling_a_compaction_sees_every_point_once(store: SqlStore) -> None:
    """A writer moves hot rows into a chunk between a reader's chunk read and its hot-row read:
    the reader still sees each step exactly once (one snapshot for the whole read)."""
    run, _ = store.upsert_run("default", "race", {})
    store.ingest(run.id, uuid.uuid4().hex, [Point("loss", s, float(s)) for s in range(W + 5)])
    reader = threading.get_ident()
    fired: list[int] = []

    def compact_now(_conn: Any, _cur: Any, statement: str, *_args: Any) -> None:
        hot = hot_relation(store.engine.dialect.name)
        hot_read = statement.startswith(f"SELECT step, tokens, value FROM {hot}") and "LIMIT" not in statement
        if threading.get_ident() == reader and hot_read and not fired:
            fired.append(1)  # steps W..W+5 move into chunk 1 and commit, from another connection
            t = threading.Thread(target=store.ingest, args=(run.id, "crossing", [Point("loss", 2 * W, 0.0)]))
            t.start()
            t.join()

    event.listen(store.engine, "before_cursor_execute", compact_now)
    try:
        steps = [p.step for p in store.series(run.id, "loss", None, 10**6, None, None).points]
    finally:
        event.remove(store.engine, "before_cursor_execute", compact_now)
    assert fired
    assert steps == list(range(W + 5))  # the snapshot before the crossing batch, whole
    assert [p.step for p in store.series(run.id, "loss", None, 10**6, None, None).points] == [
        *range(W + 5),
        2 * W,
    ]


def test_sqlite_reads_events_through_the_partial_indexes(sqlite_store: SqlStore) -> None:
    """A downsampled read asks for the NaN/Inf points through the partial indexes (SQLite's planner
    would otherwise walk every chunk of the series: ~50 ms for 10^7 points, bench/ingest.py)."""
    run, _ = sqlite_store.upsert_run("default", "events", {})
    pts = [Point("loss", s, math.nan if s == 40 else float(s)) for s in range(200)]
    sqlite_store.ingest(run.id, uuid.uuid4().hex, pts)
    seen: list[str] = []
    event.listen(sqlite_store.engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    got = sqlite_store.series(run.id, "loss", None, 20, None, None)
    assert got.downsampled and any(math.isnan(p.value) and p.step == 40 for p in got.points)
    for index in ("ix_metric_points_nonfinite", "ix_metric_chunks_nonfinite", "ix_open_chunks_nonfinite"):
        statement = next(s for s in seen if f"INDEXED BY {index}" in s)
        params = (run.id, 1, -1, 0, 199) * (statement.count("?") // 5)  # one set per table read
        with sqlite_store.engine.connect() as conn:
            plan = " ".join(str(r[-1]) for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", params))
        assert index in plan
