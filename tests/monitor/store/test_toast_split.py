"""Revision 0016: segment blobs cut at PostgreSQL's TOAST chunk size (issue 36), on both databases:
the cut itself, what the writer stores, what TOAST then holds, every point read back, and the
migration both ways with a writer committing in the gap."""

from __future__ import annotations

import math
import random
import uuid
from typing import Any

import numpy as np
import pytest
from sqlalchemy import inspect, text

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store import SqlStore, chunks, migrate, segcodec, toast
from tests.monitor.store.test_migration_writers import held_move

BEFORE = "0015_open_chunks"
V2_REVISION = "0021_stopped_tails"  # the last revision of segment blobs of version 2


def test_chunk_size_is_postgresqls_for_each_page_size() -> None:
    # TOAST_MAX_CHUNK_SIZE of PostgreSQL builds with 8 KB and 32 KB pages
    assert toast.chunk_size(8192) == 1996 and toast.chunk_size(32768) == 8140
    with pytest.raises(ValueError, match="block_size"):
        toast.chunk_size(3000)


@pytest.mark.parametrize("n", [0, 1, 1995, 1996, 1997, 3992, 5000])
def test_split_keeps_every_byte_and_cuts_at_whole_pieces(n: int) -> None:
    blob = bytes(random.Random(n).randrange(256) for _ in range(n))
    data, ext = toast.split(blob, 1996)
    assert (ext or b"") + data == blob
    assert ext is None if n < 1996 else len(ext) == n // 1996 * 1996
    assert len(data) < 1996
    assert toast.split(blob, 0) == (blob, None)  # SQLite: never cut


def test_the_servers_chunk_size_is_the_one_asked(pg_store: SqlStore) -> None:
    with pg_store.engine.connect() as conn:
        assert (
            toast.split_size(conn)
            == conn.exec_driver_sql("SELECT max_toast_chunk_size FROM pg_control_init()").scalar()
        )


def _send(store: SqlStore, run_id: int, steps: int) -> None:
    """Two series of full-mantissa doubles (segments of ~7 KB), NaN and +-Inf inside."""
    rng = random.Random(7)
    special = {5: math.nan, 700: math.inf, 1500: -math.inf}
    for s0 in range(0, steps, 100):
        pts = [
            Point("loss", s, special.get(s, rng.random() * 10 ** rng.uniform(-3, 3)), layer=la, tokens=s * 8)
            for s in range(s0, min(s0 + 100, steps))
            for la in (0, 1)
        ]
        store.ingest(run_id, uuid.uuid4().hex, pts)


def _raw(store: SqlStore) -> dict[tuple[str, int, int, int], tuple[bytes, bytes | None]]:
    out = {}
    with store.engine.connect() as conn:
        for table in ("metric_chunks", "open_chunks"):
            q = f"SELECT name_id, layer, chunk, data, data_ext FROM {table}"
            for n, la, c, data, ext in conn.execute(text(q)):
                out[(table, int(n), int(la), int(c))] = (bytes(data), None if ext is None else bytes(ext))
    return out


def _points(store: SqlStore, run_id: int) -> list[tuple[Any, ...]]:
    with store.engine.connect() as conn:
        return [(*p[:5], repr(p[5])) for p in chunks.all_points(conn, run_id)]  # repr: NaN == NaN


def test_segments_are_stored_cut_and_read_back_whole(store: SqlStore) -> None:
    run, _ = store.upsert_run("default", "r", {})
    _send(store, run.id, 2700)  # two whole segments per series, a partial one of 512 steps open
    pg = store.engine.dialect.name == "postgresql"
    raw = _raw(store)
    segments = {k: v for k, v in raw.items() if segcodec.is_segment(v[1] or v[0])}
    assert {k[0] for k in segments} == {"metric_chunks", "open_chunks"}
    for data, ext in raw.values():
        if pg and len((ext or b"") + data) >= 1996:
            assert ext is not None and len(ext) % 1996 == 0 and len(data) < 1996
        else:
            assert ext is None
    with store.engine.connect() as conn:  # the view gives every blob back whole
        whole = {
            (int(n), int(la), int(c)): bytes(d)
            for n, la, c, d in conn.execute(text("SELECT name_id, layer, chunk, data FROM chunk_rows"))
        }
    assert whole == {k[1:]: (ext or b"") + data for k, (data, ext) in raw.items()}
    points = _points(store, run.id)
    values = {(p[2], p[3]): p[5] for p in points}
    assert (
        len(points) == 2 * 2700 and values[(0, 5)] == "None"
    )  # NaN: SQL NULL at this level and values[(1, 700)] == "inf"
    assert values[(0, 1500)] == "-inf"
    got = store.series(run.id, "loss", 1, 2000, None, None).points
    assert [p.step for p in got] == list(range(2700)) and math.isinf(got[700].value) and math.isnan(got[5].value)


def test_toast_holds_full_chunks_only(pg_store: SqlStore) -> None:
    run, _ = pg_store.upsert_run("default", "r", {})
    _send(pg_store, run.id, 2100)
    pg_store.update_run(run.id, {"status": "finished"})  # the partial segments go to metric_chunks too
    with pg_store.engine.connect() as conn:
        toast_rel = conn.execute(
            text("SELECT reltoastrelid::regclass::text FROM pg_class WHERE relname = 'metric_chunks'")
        ).scalar()
        sizes = [int(s) for (s,) in conn.execute(text(f"SELECT octet_length(chunk_data) FROM {toast_rel}"))]
    assert sizes and set(sizes) == {1996}, sorted(set(sizes))


def test_0016_cuts_and_joins_every_blob_both_ways(db_url: str) -> None:
    store = SqlStore(db_url)
    try:
        migrate.upgrade(store.engine)
        run, _ = store.upsert_run("default", "r", {})
        _send(store, run.id, 2300)
        migrate.downgrade(store.engine, V2_REVISION)  # the blobs as the writers of 0016-0021 cut them
        written, points = _raw(store), _points(store, run.id)
        migrate.downgrade(store.engine, BEFORE)
        assert all(c["name"] != "data_ext" for c in inspect(store.engine).get_columns("metric_chunks"))
        with store.engine.connect() as conn:
            for table in ("metric_chunks", "open_chunks"):
                for n, la, c, data in conn.execute(text(f"SELECT name_id, layer, chunk, data FROM {table}")):
                    d, ext = written[(table, int(n), int(la), int(c))]
                    assert bytes(data) == (ext or b"") + d
        assert _points(store, run.id) == points
        migrate.upgrade(store.engine, V2_REVISION)  # cut again by the migration, as the writer cut them
        assert _raw(store) == written
        assert _points(store, run.id) == points
        migrate.upgrade(store.engine)
        assert _points(store, run.id) == points
    finally:
        store.close()


def _segment_writer(conn: Any) -> None:
    """A 0015 service's pack: steps 1024-2047 as one whole segment row in ``data`` (~8 KB)."""
    steps = np.arange(1024, 2048, dtype=np.int64)
    values = np.random.default_rng(3).random(1024) * 1e3
    blob = segcodec.encode(1024, 64, steps, np.full(1024, -(2**63), dtype=np.int64), values, version=segcodec.V2)
    assert len(blob) > 2 * 1996
    mark = "?" if type(conn).__module__.startswith("sqlite3") else "%s"
    cols = "run_id, name_id, layer, chunk, nonfinite, data"
    conn.execute(f"INSERT INTO metric_chunks ({cols}) VALUES (1, 1, -1, 64, 0, {mark})", (blob,))


@pytest.mark.parametrize("move", ["up", "down"])
def test_0016_keeps_a_segment_committed_in_the_gap(db_url: str, move: str) -> None:
    # up: held after both columns exist and PostgreSQL's blobs were cut; down: after they were joined
    marker = {"up": "ALTER TABLE open_chunks ADD COLUMN", "down": "UPDATE open_chunks SET data"}[move]
    outcome = held_move(db_url, move, BEFORE, "0016_toast_split", marker, _segment_writer, set(range(1024, 2048)))
    # SQLite: the migration holds the write lock; PostgreSQL: the writer waits, then commits a whole
    # blob (data_ext NULL after an upgrade), which every read still gets whole
    if db_url.startswith("postgresql"):
        assert outcome == ["committed"], outcome
    else:
        assert outcome[0].startswith("refused"), outcome
