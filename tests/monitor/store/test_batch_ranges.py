"""The hooks' sequence batch ids claimed as ranges (revision 0019, issue 36), on both databases: a
session in order is one row, out of order joins up, a re-sent batch or range is a duplicate, a partial
overlap is stored once more and joined; the migration both ways, its guard, and a writer in its gap."""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

import pytest
from sqlalchemy import text

from hyperwatch.hooks.schema import Point, range_batch_id, sequence_range
from hyperwatch.monitor.store import SqlStore, migrate
from hyperwatch.monitor.store.points import batch_key
from tests.monitor.store.test_migration_writers import RUN_SQL, Gap, _run_held

BEFORE, AFTER = "0018_latest_fillfactor", "0019_batch_ranges"
S1, S2 = "0123456789abcdef" * 2, "fedcba9876543210" * 2


def _points(step: int, n: int = 3) -> list[Point]:
    return [Point("loss", step, 2.0 + k) if k == 0 else Point("attention_z", step, 1.0 * k, layer=k) for k in range(n)]


def _ranges(store: SqlStore) -> list[tuple[Any, ...]]:
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT run_id, session, lo, hi, n_points FROM batch_ranges ORDER BY 1, 2, 3"))
        return [(r, bytes(s).hex(), lo, hi, n) for r, s, lo, hi, n in rows]


def _send(store: SqlStore, run_id: int, session: str, first: int, last: int | None = None) -> bool:
    """Ingest numbers first..last (one step each); True when stored, False when answered as a duplicate."""
    last = first if last is None else last
    points = [p for step in range(first, last + 1) for p in _points(step)]
    result = store.ingest(run_id, range_batch_id(session, first, last), points)
    assert result.accepted == len(points)
    return not result.duplicate


def test_a_session_in_order_is_one_row_and_a_resend_is_a_duplicate(store: SqlStore) -> None:
    run, _ = store.upsert_run("p", "ranges-1", {})
    assert all(_send(store, run.id, S1, n) for n in range(50))
    assert _ranges(store) == [(run.id, S1, 0, 49, 150)]
    assert not _send(store, run.id, S1, 17) and not _send(store, run.id, S1, 49)  # retries of stored batches
    assert not _send(store, run.id, S1, 3, 9)  # a merged group within what is stored
    assert _send(store, run.id, S1, 50, 52)  # a merged group continues the range
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM ingested_batches")).scalar() == 0
    assert _ranges(store) == [(run.id, S1, 0, 52, 159)]
    loss = store.series(run.id, "loss", None, 1000, None, None).points
    assert [p.step for p in loss] == list(range(53))  # every step once


def test_out_of_order_batches_join_up_and_sessions_and_runs_count_apart(store: SqlStore) -> None:
    run, _ = store.upsert_run("p", "ranges-2", {})
    other, _ = store.upsert_run("p", "ranges-3", {})
    for n in (0, 5, 3, 1):
        assert _send(store, run.id, S1, n)
    assert [r[2:4] for r in _ranges(store)] == [(0, 1), (3, 3), (5, 5)]
    assert not _send(store, run.id, S1, 3) and not _send(store, run.id, S1, 0, 1)
    assert _send(store, run.id, S1, 4)  # fills the gap between two ranges: they become one
    assert _send(store, run.id, S1, 2)
    assert _send(store, run.id, S2, 2) and _send(store, other.id, S1, 0)  # same numbers, other session / run
    assert _ranges(store) == sorted([(run.id, S1, 0, 5, 18), (run.id, S2, 2, 2, 3), (other.id, S1, 0, 0, 3)])
    # a group that partly overlaps what is stored (no sender of ours makes one) is stored and joined
    assert _send(store, run.id, S1, 4, 8)
    assert [r[2:] for r in _ranges(store) if r[:2] == (run.id, S1)] == [(0, 8, 33)]
    store.delete_run(run.id)
    assert _ranges(store) == [(other.id, S1, 0, 0, 3)]


def test_sequence_ids_sent_at_once_are_stored_once(store: SqlStore) -> None:
    run, _ = store.upsert_run("p", "ranges-4", {})
    assert _send(store, run.id, S1, 0)
    results: list[Any] = []
    start = threading.Barrier(4)

    def send(first: int, last: int) -> None:
        start.wait()
        try:
            results.append(_send(store, run.id, S1, first, last))
        except BaseException as exc:  # collected and asserted below
            results.append(exc)

    threads = [threading.Thread(target=send, args=(1, 4)) for _ in range(3)] + [
        threading.Thread(target=send, args=(2, 3))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, bool) for r in results), results
    stored = sum(results)
    assert stored in (1, 2), results  # 1..4 once; 2..3 too only when it came first (a partial overlap)
    assert _ranges(store) == [(run.id, S1, 0, 4, 3 + 12 + (6 if stored == 2 else 0))]
    loss = store.series(run.id, "loss", None, 1000, None, None).points
    assert [p.step for p in loss] == [0, 1, 2, 3, 4]


def _seed(store: SqlStore, ids: dict[str, int]) -> None:
    """At 0018: a run whose ``ingested_batches`` holds ``ids`` (id -> points), as a service of that code
    stores them (the new hooks' sequence ids among them: the code before 0019 keeps a row a request)."""
    migrate.upgrade(store.engine, BEFORE)
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO projects (id, name, created_at) VALUES (1, 'p', CURRENT_TIMESTAMP)"))
        conn.execute(text(RUN_SQL))
        for bid, n in ids.items():
            conn.execute(
                text("INSERT INTO ingested_batches VALUES (:b, 1, :n, 1700000000000)"), {"b": batch_key(bid), "n": n}
            )


OLD = {f"{S1}-{n:x}": 10 + n for n in (0, 1, 2, 4)} | {f"{S1}-5-7": 30, f"{S2}-0": 1, S1: 2, "my-own-batch-1": 3}


def _rows(store: SqlStore) -> dict[str, int]:
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT batch_id, n_points FROM ingested_batches")).all()
    return {bytes(k).decode("ascii") if bytes(k)[:1] != b"\x00" else bytes(k)[1:].hex(): n for k, n in rows}


def test_0019_moves_sequence_ids_into_ranges_and_back(db_url: str) -> None:
    store = SqlStore(db_url)
    try:
        _seed(store, OLD)
        migrate.upgrade(store.engine, AFTER)
        assert _rows(store) == {S1: 2, "my-own-batch-1": 3}  # other ids keep their rows
        assert _ranges(store) == [(1, S1, 0, 2, 33), (1, S1, 4, 7, 44), (1, S2, 0, 0, 1)]
        # what the service asks after the upgrade: a retry of a batch stored before it is a duplicate
        assert (
            not _send(store, 1, S1, 6)
            and not _send(store, 1, S2, 0)
            and store.ingest(1, S1, _points(9)).duplicate is not False
        )
        assert _send(store, 1, S1, 3)  # the gap: the two ranges become one
        assert _ranges(store)[0][2:] == (0, 7, 33 + 44 + 3)
        with store.engine.begin() as conn, pytest.raises(Exception, match=r"0019|ck_ingested_batches_not_sequence"):
            # the guard: a process of the code before 0019 cannot store a sequence id where no one looks
            conn.execute(text("INSERT INTO ingested_batches VALUES (:b, 1, 1, 0)"), {"b": f"{S1}-9".encode()})
        # exactly the ids the service claims as ranges: the guard refuses these, stores any other
        near_misses = [f"{S1}-1g", f"{S1}-1-2-3", f"{S1}-{'1' * 13}", f"{S1}--1", f"{S1}-1-", f"{S1.upper()}-1"]
        for k, bid in enumerate([f"{S2}-{'f' * 12}-1", f"{S1}-{'a' * 12}", *near_misses]):
            refused = sequence_range(bid) is not None
            assert refused == (k < 2), bid
            try:
                with store.engine.begin() as conn:
                    conn.execute(text("INSERT INTO ingested_batches VALUES (:b, 1, 1, 0)"), {"b": bid.encode()})
            except Exception as exc:
                assert (refused and "0019" in str(exc)) or "ck_ingested_batches_not_sequence" in str(exc), (bid, exc)
            else:
                assert not refused, bid
        migrate.downgrade(store.engine, BEFORE)
        expected = {f"{S1}-{n:x}": (80 if n == 0 else 0) for n in range(8)} | {f"{S2}-0": 1, S1: 2, "my-own-batch-1": 3}
        expected |= {bid: 1 for bid in near_misses}
        assert _rows(store) == expected
        with store.engine.begin() as conn:  # the guard is gone with the table
            conn.execute(text("INSERT INTO ingested_batches VALUES (:b, 1, 1, 0)"), {"b": f"{S1}-9".encode()})
    finally:
        store.close()


def _old_claim(conn: Any) -> None:
    """A service process of the code before 0019 storing one of the new hooks' ids, in the migration's gap."""
    mark = "?" if isinstance(conn, sqlite3.Connection) else "%s"
    conn.execute(f"INSERT INTO ingested_batches VALUES ({mark}, 1, 4, 1700000000000)", (f"{S1}-8".encode(),))


def test_0019_refuses_an_old_writer_arriving_in_the_gap(db_url: str) -> None:
    store = SqlStore(db_url)
    try:
        _seed(store, OLD)
        pg = store.engine.dialect.name == "postgresql"
        # PostgreSQL: the writer queues behind the LOCK, then meets the guard; SQLite: the write lock
        gap = Gap(db_url, "LOCK TABLE" if pg else "UPDATE alembic_version", _old_claim, ("DELETE",))
        _run_held(store, gap, lambda: migrate.upgrade(store.engine, AFTER))
        assert gap.outcome[0].startswith("refused"), gap.outcome  # never acknowledged: the hooks send it again
        assert ("ck_ingested_batches_not_sequence" if pg else "database is locked") in gap.outcome[0], gap.outcome
        assert _send(store, 1, S1, 8)  # and the service after the migration stores it, once
        assert not _send(store, 1, S1, 8)
        assert [r[2:4] for r in _ranges(store) if r[1] == S1] == [(0, 2), (4, 8)]
    finally:
        store.close()
