"""Compressed segments (issue 36): every point reads back bit for bit, on both databases, across segment
boundaries, partial segments, late writes, re-sent batches and a stopped run; reads over segments;
revision 0014 both ways, and with a writer committing in its gap."""

from __future__ import annotations

import math
import random
import struct
import uuid
from typing import Any

import numpy as np
import pytest
from sqlalchemy import event, text

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store import SqlStore, chunks, migrate, segcodec
from hyperwatch.monitor.store.models import SEGMENT_CHUNKS
from tests.monitor.store.test_migration_writers import held_move, v1_chunk_writer

SPECIAL = (math.nan, math.inf, -math.inf, 0.0, 5e-324, 1.7976931348623157e308)
"""-0.0 is left out: SQLite stores an integral REAL as an integer, so a hot row reads it back as 0.0
(as before segments); the codec keeps it (``test_codec_round_trips_odd_steps_and_tokens``)."""


def _bits(v: float | None) -> object:
    return None if v is None or math.isnan(v) else struct.pack("<d", v)


def _value(rng: random.Random, f32: bool) -> float:
    if rng.random() < 0.02:
        return rng.choice(SPECIAL)
    v = math.exp(rng.gauss(0, 2))
    return float(np.float32(v)) if f32 else v


def _stored(store: SqlStore, run_id: int) -> dict[tuple[int, int, int], tuple[Any, object]]:
    with store.engine.connect() as conn:
        return {(n, la, s): (t, _bits(v)) for _r, n, la, s, t, v in chunks.all_points(conn, run_id)}


def _send(store: SqlStore, run_id: int, want: dict[tuple[str, int, int], tuple[Any, object]], pts: list[Point]) -> None:
    store.ingest(run_id, uuid.uuid4().hex, pts)
    for p in pts:
        want[(p.name, p.layer if p.layer is not None else -1, p.step)] = (p.tokens, _bits(p.value))


def test_every_point_reads_back_bit_for_bit(store: SqlStore) -> None:
    rng = random.Random(36)
    run, _ = store.upsert_run("default", "segments", {})
    want: dict[tuple[str, int, int], tuple[Any, object]] = {}

    def point(s: int, layer: int) -> Point:
        tokens = [s * 4096, None, None if s % 7 == 0 else s * s, 2**62 - s][layer]
        return Point(["attention_z", "loss"][layer % 2], s, _value(rng, layer < 2), layer=layer, tokens=tokens)

    step = 0
    while step < 2600:  # 2 whole segments, a partial one, and chunks
        width = rng.choice([1, 1, 3, 16, 40])
        _send(store, run.id, want, [point(s, la) for s in range(step, step + width) for la in range(4)])
        step += width
    # late writes: into a whole segment, into the partial one, into its chunks; re-sent batch, overwrites
    late = [point(s, la) for s in (5, 700, 1023, 1024, 2050, 2570, 2599) for la in range(4)]
    _send(store, run.id, want, late)
    batch = [point(s, 0) for s in range(100, 110)]
    store.ingest(run.id, "same-batch", batch)
    store.ingest(run.id, "same-batch", [Point("attention_z", 100, 1.0, layer=0)])  # a duplicate: ignored
    for p in batch:
        want[(p.name, 0, p.step)] = (p.tokens, _bits(p.value))
    _send(store, run.id, want, [Point("loss", 3000, math.nan, layer=1), Point("loss", 4000, math.inf, layer=1)])
    with store.engine.connect() as conn:
        ids = {name: store._name_id(conn, name, create=False) for name in ("attention_z", "loss")}
        versions = conn.execute(text("SELECT chunk, data FROM chunk_rows WHERE run_id = :r"), {"r": run.id}).all()
    expect = {(ids[n], la, s): v for (n, la, s), v in want.items()}
    assert _stored(store, run.id) == expect
    assert {bytes(b)[0] for _c, b in versions} == {1, segcodec.VERSION}
    assert all(int(c) % SEGMENT_CHUNKS == 0 for c, b in versions if bytes(b)[0] == 2)

    store.update_run(run.id, {"status": "finished"})  # a stopped run: its open ranges are packed too
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT chunk, data FROM chunk_rows WHERE run_id = :r"), {"r": run.id}).all()
    assert {bytes(b)[0] for _c, b in rows} == {segcodec.VERSION}
    assert _stored(store, run.id) == expect
    _send(store, run.id, want, [point(s, la) for s in (9, 2555, 4001, 4002) for la in range(4)])  # and after
    expect = {(ids[n], la, s): v for (n, la, s), v in want.items()}
    assert _stored(store, run.id) == expect
    read = store.series(run.id, "attention_z", 2, 100_000, None, None).points
    assert [(p.step, p.tokens, _bits(p.value)) for p in read] == [
        (s, *want[("attention_z", 2, s)]) for s in sorted(s for n, la, s in want if n == "attention_z" and la == 2)
    ]


def test_wide_reads_keep_every_bucket_extreme(store: SqlStore) -> None:
    rng = random.Random(7)
    run, _ = store.upsert_run("default", "wide", {})
    values = {s: rng.gauss(0, 1) for s in range(6000)}
    for lo in range(0, 6000, 500):
        store.ingest(run.id, uuid.uuid4().hex, [Point("loss", s, values[s]) for s in range(lo, lo + 500)])
    for buckets in (60, 8, 3):  # numpy over segments, the 1,024-step level, the 4,096-step level
        got = {p.step: p.value for p in store.series(run.id, "loss", None, buckets, None, None).points}
        w = -(-6000 // buckets)
        for b in range(buckets):
            inside = [s for s in range(b * w, min(6000, (b + 1) * w))]
            lo = min(inside, key=lambda s: (values[s], s))
            hi = max(inside, key=lambda s: (values[s], -s))
            assert got.get(lo) == values[lo] and got.get(hi) == values[hi], (buckets, b)


def test_codec_round_trips_odd_steps_and_tokens() -> None:
    steps = np.array([3, 4, 9, 100, 1000], dtype=np.int64)
    tokens = np.array([-1, 7, -1, 2**63 - 1, -(2**63)], dtype=np.int64)
    values = np.array([math.nan, -0.0, math.inf, -math.inf, 1e-300])
    blob = segcodec.encode(1024, 64, steps + 1024, tokens, values)
    s, t, v = segcodec.decode(1024, blob)
    assert s.tolist() == (steps + 1024).tolist() and t.tolist() == tokens.tolist()
    assert v.view(np.uint64).tolist() == values.view(np.uint64).tolist()
    assert segcodec.span(blob) == 64


def test_0014_moves_chunks_into_segments_and_back(db_url: str) -> None:
    store = SqlStore(db_url)
    try:
        migrate.upgrade(store.engine)
        run, _ = store.upsert_run("default", "mig", {})
        rng = random.Random(1)
        for lo in range(0, 2300, 100):
            pts = [
                Point("loss", s, _value(rng, la == 0), layer=la, tokens=s) for s in range(lo, lo + 100) for la in (0, 1)
            ]
            store.ingest(run.id, uuid.uuid4().hex, pts)
        before = _stored(store, run.id)
        with store.engine.connect() as conn:
            rollups = conn.execute(text("SELECT * FROM metric_rollups ORDER BY 2, 3, 4, 5, 6")).all()
        migrate.downgrade(store.engine, "0013_webhooks")
        assert _stored(store, run.id) == before
        with store.engine.connect() as conn:
            assert {bytes(b)[0] for (b,) in conn.execute(text("SELECT data FROM metric_chunks"))} == {1}
            levels = dict(conn.execute(text("SELECT level, count(*) FROM metric_rollups GROUP BY level")).all())
        assert levels == {1: 2 * (2300 // 16), 2: 2 * (2300 // 256)}
        migrate.upgrade(store.engine)
        assert _stored(store, run.id) == before
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT * FROM metric_rollups ORDER BY 2, 3, 4, 5, 6")).all() == rollups
            assert {bytes(b)[0] for (b,) in conn.execute(text("SELECT data FROM chunk_rows"))} == {segcodec.VERSION}
    finally:
        store.close()


_v1_chunk = v1_chunk_writer("metric_chunks")  # a 0013 service's batch that seals chunk 3 (steps 48-63)


@pytest.mark.parametrize("move", ["up", "down"])
def test_0014_keeps_a_chunk_committed_in_the_gap(db_url: str, move: str) -> None:
    marker = {
        "up": "SELECT run_id, name_id, layer, step FROM series_latest",
        "down": "SELECT run_id, name_id, layer, chunk, data FROM metric_chunks",
    }[move]
    outcome = held_move(
        db_url, move, "0013_webhooks", "0014_compressed_segments", marker, _v1_chunk, set(range(48, 64))
    )
    assert outcome == ["committed"] if db_url.startswith("postgresql") else outcome[0].startswith("refused"), outcome


def test_0014_locks_before_its_first_read(sqlite_url: str) -> None:
    """By hand on SQLite the no-op write takes the lock before the first read, both ways."""
    store = SqlStore(sqlite_url)
    seen: dict[str, list[str]] = {"up": [], "down": []}
    now = ["up"]
    try:
        migrate.upgrade(store.engine, "0013_webhooks")
        event.listen(store.engine, "before_cursor_execute", lambda *a: seen[now[0]].append(" ".join(a[2].split())))
        migrate.upgrade(store.engine, "0014_compressed_segments")
        now[0] = "down"
        migrate.downgrade(store.engine, "0013_webhooks")
    finally:
        store.close()
    lock = "UPDATE alembic_version SET version_num = version_num"
    for part in seen.values():
        reads = [i for i, s in enumerate(part) if s.startswith(("SELECT run_id, name_id", "SELECT t.name_id"))]
        locks = [i for i, s in enumerate(part) if s == lock]
        assert reads and locks and locks[0] < reads[0], part


def test_a_new_sqlite_file_gets_small_pages_and_an_old_one_keeps_its_own(tmp_path: Any) -> None:
    """SQLITE_PAGE_SIZE applies to new files (segments spill less: engine.py); a file made with 4 KB
    pages before it keeps them, and every point written to it reads back."""
    from hyperwatch.monitor.store.engine import SQLITE_PAGE_SIZE
    from tests.monitor.cli.test_db_compact import old_sqlite_file, page_size, read_back, same_points

    new = SqlStore(f"sqlite:///{tmp_path}/new.db")
    migrate.upgrade(new.engine)
    new.close()
    sent = old_sqlite_file(tmp_path / "old.db")
    assert same_points(read_back(tmp_path / "old.db"), sent)
    assert SQLITE_PAGE_SIZE == 2048 and page_size(tmp_path / "new.db") == 2048
    assert page_size(tmp_path / "old.db") == 4096
