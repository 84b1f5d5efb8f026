"""Revision 0015: a running run's open ranges in ``open_chunks``, what no longer changes in
``metric_chunks`` (issue 36), on both databases: where each row lives while a run runs, stops, runs
again and takes a late write; the migration both ways, with a writer committing in the gap."""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest
from sqlalchemy import event, inspect, text

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store import SqlStore, chunks, hot, migrate, segcodec, toast
from hyperwatch.monitor.store.models import SEGMENT_CHUNKS
from tests.monitor.store.test_migration_writers import held_move, v1_chunk_writer

BEFORE = "0014_compressed_segments"


def _rows(store: SqlStore, table: str, run_id: int) -> dict[tuple[int, int, int], bytes]:
    with store.engine.connect() as conn:
        whole = toast.data_expr(store.engine.dialect.name)  # the blob, joined where 0016 cut it
        q = text(f"SELECT name_id, layer, chunk, {whole} FROM {table} WHERE run_id = :r")
        return {(int(n), int(la), int(c)): bytes(d) for n, la, c, d in conn.execute(q, {"r": run_id})}


def _points(store: SqlStore, run_id: int) -> list[tuple[Any, ...]]:
    with store.engine.connect() as conn:
        return [(*p[:5], repr(p[5])) for p in chunks.all_points(conn, run_id)]  # repr: NaN == NaN


def _span(blob: bytes) -> int:
    return segcodec.span(blob[:8]) if segcodec.is_segment(blob) else 1


def _pg_bytes(store: SqlStore, sizes: str) -> int:
    """``SELECT <sizes>`` on PostgreSQL: a sum of relation sizes, in bytes."""
    with store.engine.connect() as conn:
        return int(conn.execute(text(f"SELECT {sizes}")).scalar_one())


def _send(store: SqlStore, run_id: int, lo: int, hi: int) -> None:
    for s0 in range(lo, hi, 50):
        pts = [
            Point("loss", s, math.nan if s == 7 else math.inf if s == 1500 else 1.0 / (s + 1), layer=la, tokens=8 * s)
            for s in range(s0, min(s0 + 50, hi))
            for la in (0, 1)
        ]
        store.ingest(run_id, uuid.uuid4().hex, pts)


def _no_key_twice(store: SqlStore) -> None:
    with store.engine.connect() as conn:
        both = conn.execute(
            text("SELECT count(*) FROM metric_chunks m JOIN open_chunks o USING (run_id, name_id, layer, chunk)")
        ).scalar()
    assert both == 0


def test_rows_move_from_open_to_sealed_as_a_run_runs_stops_and_runs_again(store: SqlStore) -> None:
    run, _ = store.upsert_run("default", "r", {})
    _send(store, run.id, 0, 340)  # packed at 288 (passing 256), then chunks 18-20 per series: all open
    assert _rows(store, "metric_chunks", run.id) == {}
    open_rows = _rows(store, "open_chunks", run.id)
    assert {k: _span(b) for k, b in open_rows.items() if k[1] == 0} == {
        (1, 0, 0): 18,
        (1, 0, 18): 1,
        (1, 0, 19): 1,
        (1, 0, 20): 1,
    }
    before = _points(store, run.id)
    assert [p[3] for p in before if p[2] == 0] == list(range(340))

    store.update_run(run.id, {"status": "finished"})  # stopped: its open ranges final, out of open_chunks
    assert _rows(store, "open_chunks", run.id) == {}
    sealed = _rows(store, "metric_chunks", run.id)
    # chunks 0-20 sealed, and the last steps (336-339, chunk 21) folded in since 0021 (store.tail)
    assert {k: _span(b) for k, b in sealed.items()} == {(1, 0, 0): 22, (1, 1, 0): 22}
    assert _points(store, run.id) == before

    store.update_run(run.id, {"status": "running"})
    _send(store, run.id, 340, 2100)  # seals ranges 0 and 1 (whole: the sealed table), packs range 2 (open)
    _no_key_twice(store)
    sealed, open_rows = _rows(store, "metric_chunks", run.id), _rows(store, "open_chunks", run.id)
    assert {k: _span(b) for k, b in sealed.items()} == {(1, la, c): SEGMENT_CHUNKS for la in (0, 1) for c in (0, 64)}
    assert open_rows and all(c >= 2 * SEGMENT_CHUNKS for _n, _la, c in open_rows)
    got = _points(store, run.id)
    assert [p[3] for p in got if p[2] == 1] == list(range(2100))
    assert [p[5] for p in got if p[2] == 0 and p[3] in (7, 1500)] == ["None", "inf"]  # NaN is NULL


def test_writes_to_a_stopped_run_keep_one_row_per_key_and_nothing_open(store: SqlStore) -> None:
    run, _ = store.upsert_run("default", "late", {})
    _send(store, run.id, 0, 340)
    store.update_run(run.id, {"status": "finished"})
    store.ingest(run.id, uuid.uuid4().hex, [Point("loss", 100, 42.0, layer=0), Point("loss", 290, -1.0, layer=1)])
    _no_key_twice(store)
    got = {(p[2], p[3]): p[5] for p in _points(store, run.id)}
    assert got[(0, 100)] == "42.0" and got[(1, 290)] == "-1.0" and len(got) == 680
    _send(store, run.id, 340, 400)  # new steps after the stop (a late flush): sealed where they land
    assert _rows(store, "open_chunks", run.id) == {}
    _no_key_twice(store)
    assert [p[3] for p in _points(store, run.id) if p[2] == 0] == list(range(400))
    assert store.series(run.id, "loss", 0, 1000, None, None).points[100].value == 42.0


def test_0015_moves_the_open_rows_both_ways(db_url: str) -> None:
    store = SqlStore(db_url)
    try:
        migrate.upgrade(store.engine)
        running, _ = store.upsert_run("default", "running", {})
        stopped, _ = store.upsert_run("default", "stopped", {})
        for run_id in (running.id, stopped.id):
            _send(store, run_id, 0, 1400)
        store.update_run(stopped.id, {"status": "crashed"})
        store.hot_vacuum.wait()  # the stop's rebuild of open_chunks' indexes, before the migration locks the tables
        tables = {
            t: {r: _rows(store, t, r) for r in (running.id, stopped.id)} for t in ("metric_chunks", "open_chunks")
        }
        assert tables["open_chunks"][stopped.id] == {} and tables["open_chunks"][running.id]
        points = {r: _points(store, r) for r in (running.id, stopped.id)}

        migrate.downgrade(store.engine, BEFORE)
        assert "open_chunks" not in inspect(store.engine).get_table_names()
        assert {r: _points(store, r) for r in points} == points
        migrate.upgrade(store.engine)
        assert {t: {r: _rows(store, t, r) for r in (running.id, stopped.id)} for t in tables} == tables
        assert {r: _points(store, r) for r in points} == points
    finally:
        store.close()


@pytest.mark.parametrize("move", ["up", "down"])
def test_0015_keeps_a_chunk_committed_in_the_gap(db_url: str, move: str) -> None:
    # up: held after the copy into open_chunks, before the delete from metric_chunks; down: the reverse
    marker, table = {
        "up": ("INSERT INTO open_chunks", "metric_chunks"),
        "down": ("INSERT INTO metric_chunks", "open_chunks"),
    }[move]
    outcome = held_move(db_url, move, BEFORE, "0015_open_chunks", marker, v1_chunk_writer(table), set(range(48, 64)))
    # SQLite: the migration holds the write lock; PostgreSQL: the writer waits for it, then
    # commits into the new layout (up) or finds its table gone (down)
    if db_url.startswith("postgresql") and move == "up":
        assert outcome == ["committed"], outcome
    else:
        assert outcome[0].startswith("refused"), outcome


def test_0015_locks_before_it_moves(sqlite_url: str) -> None:
    store = SqlStore(sqlite_url)
    seen: list[str] = []
    try:
        migrate.upgrade(store.engine, BEFORE)
        event.listen(store.engine, "before_cursor_execute", lambda *a: seen.append(" ".join(a[2].split())))
        migrate.upgrade(store.engine, "0015_open_chunks")
        migrate.downgrade(store.engine, BEFORE)
    finally:
        store.close()
    lock = "UPDATE alembic_version SET version_num = version_num"
    moves = [i for i, s in enumerate(seen) if s.startswith(("INSERT INTO open_chunks", "INSERT INTO metric_chunks"))]
    locks = [i for i, s in enumerate(seen) if s == lock]
    # up: into open_chunks, then metric_chunks rebuilt as a rowid table; down: back, then rebuilt again
    assert len(moves) == 4 and len(locks) == 2 and locks[0] < moves[0] < moves[1] < locks[1] < moves[2], seen


def test_sqlite_keeps_sealed_rows_in_a_rowid_table_and_open_ones_without(sqlite_url: str) -> None:
    store = SqlStore(sqlite_url)
    try:
        migrate.upgrade(store.engine)
        with store.engine.connect() as conn:
            ddl = dict(conn.exec_driver_sql("SELECT name, sql FROM sqlite_master WHERE type = 'table'").all())
        assert "WITHOUT ROWID" not in ddl["metric_chunks"] and "WITHOUT ROWID" in ddl["open_chunks"]
        migrate.downgrade(store.engine, BEFORE)
        with store.engine.connect() as conn:
            ddl = dict(conn.exec_driver_sql("SELECT name, sql FROM sqlite_master WHERE type = 'table'").all())
        assert "WITHOUT ROWID" in ddl["metric_chunks"] and "open_chunks" not in ddl
    finally:
        store.close()


def test_a_stop_rebuilds_the_open_indexes_at_what_is_still_open(pg_store: SqlStore) -> None:
    """VACUUM keeps an index's pages; a run's stop rebuilds ``open_chunks``' indexes (store.hot), with
    another run still writing its open ranges there and reading them back through the new index."""

    def index_bytes() -> int:
        return _pg_bytes(pg_store, "pg_relation_size('pk_open_chunks')")

    big, _ = pg_store.upsert_run("default", "big", {})
    small, _ = pg_store.upsert_run("default", "small", {})
    for s0 in range(0, 600, 50):  # 32 series of the big run: up to ~500 open rows at a time, churned
        pts = [Point("attention_z", s, 1.0 + s % 7, layer=la) for s in range(s0, s0 + 50) for la in range(32)]
        pg_store.ingest(big.id, uuid.uuid4().hex, pts)
    _send(pg_store, small.id, 0, 300)
    grown = index_bytes()
    pg_store.update_run(big.id, {"status": "finished"})
    pg_store.hot_vacuum.wait()
    assert pg_store.hot_vacuum.reindexed == 1
    assert index_bytes() < grown and index_bytes() <= 2 * 8192, (grown, index_bytes())
    _send(pg_store, small.id, 300, 340)  # the small run writes on through the rebuilt index
    got = pg_store.series(small.id, "loss", 0, 1000, None, None).points
    assert [p.step for p in got] == list(range(340)) and got[1].value == 0.5
    assert pg_store.series(big.id, "attention_z", 31, 1000, None, None).points[599].value == 1.0 + 599 % 7


def test_a_stop_vacuums_the_hot_tables_so_the_next_run_reuses_their_space(pg_store: SqlStore) -> None:
    """A short run moves fewer rows than ``VACUUM_AFTER_ROWS``: no vacuum while it runs. Its stop
    vacuums the hot tables (store.hot), so the next run's points pass through the same pages."""

    def hot_bytes() -> int:
        return _pg_bytes(pg_store, "pg_total_relation_size('point_batches') + pg_total_relation_size('metric_points')")

    def one_run(name: str) -> None:
        run, _ = pg_store.upsert_run("default", name, {})
        for s in range(200):  # 64 series, one step a batch: 12,800 rows moved, under VACUUM_AFTER_ROWS
            pg_store.ingest(
                run.id, uuid.uuid4().hex, [Point("attention_z", s, 1.0 + s % 5, layer=la) for la in range(64)]
            )
        pg_store.update_run(run.id, {"status": "finished"})
        pg_store.hot_vacuum.wait()

    one_run("first")
    assert pg_store.hot_vacuum.runs == 0 and pg_store.hot_vacuum.stop_vacuums == 1
    first = hot_bytes()
    one_run("second")
    assert pg_store.hot_vacuum.stop_vacuums == 2
    assert hot_bytes() <= 1.25 * first, (first, hot_bytes())  # without the stop's vacuum: about twice
    pts = pg_store.series(pg_store.list_runs()[-1].id, "attention_z", 63, 1000, None, None).points
    assert [p.step for p in pts] == list(range(200)) and pts[199].value == 1.0 + 199 % 5


def test_a_stop_rebuilds_the_hot_tables_indexes_when_they_hold_few_rows(
    pg_store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hot tables' indexes keep the size of the most rows they held (store.hot): a stop rebuilds them
    when the tables hold at most ``REINDEX_HOT_MAX_ROWS`` rows, and leaves them when they hold more."""

    def index_bytes() -> int:
        return _pg_bytes(pg_store, "pg_relation_size('pk_metric_points') + pg_relation_size('pk_point_batches')")

    churned, _ = pg_store.upsert_run("default", "churned", {})
    for s in range(35):  # 300 names, one step a batch: 4,500 pending rows at most, 900 left hot
        pg_store.ingest(churned.id, uuid.uuid4().hex, [Point(f"m{k}", s, 1.0 + s % 5, layer=0) for k in range(300)])
    monkeypatch.setattr(hot, "REINDEX_HOT_MAX_ROWS", -1)  # every table "holds many rows": left alone
    pg_store.update_run(churned.id, {"status": "finished"})
    pg_store.hot_vacuum.wait()
    assert pg_store.hot_vacuum.rebuilt == {"open_chunks": 1, "metric_points": 0, "point_batches": 0}
    grown = index_bytes()
    monkeypatch.setattr(hot, "REINDEX_HOT_MAX_ROWS", 100_000)
    another, _ = pg_store.upsert_run("default", "another", {})
    pg_store.update_run(another.id, {"status": "finished"})
    pg_store.hot_vacuum.wait()
    assert pg_store.hot_vacuum.rebuilt == {"open_chunks": 2, "metric_points": 1, "point_batches": 1}
    assert index_bytes() < grown / 2, (grown, index_bytes())
    # the stopped run's last steps are hot rows, read through the rebuilt index
    pts = pg_store.series(churned.id, "m299", 0, 1000, None, None).points
    assert [p.step for p in pts] == list(range(35)) and pts[34].value == 1.0 + 34 % 5
