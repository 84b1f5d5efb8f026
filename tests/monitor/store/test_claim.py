"""A batch's id claimed with the run's lock (``ingest.lock_run``; on PostgreSQL one statement, issue 36):
a duplicate sent at the same time as the first, a run that does not exist, a batch without points,
on both databases; and on PostgreSQL, no statement of its own for the claim."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import event, text

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.core.errors import NotFoundError
from hyperwatch.monitor.store import SqlStore


def _points(step: int) -> list[Point]:
    return [Point("attention_z", step, 1.0 + layer, layer=layer) for layer in range(4)] + [Point("loss", step, 2.5)]


def test_the_same_batch_sent_at_once_is_stored_once(store: SqlStore) -> None:
    run, _ = store.upsert_run("p", "r", {})
    store.ingest(run.id, "first-000", _points(0))
    results: list[Any] = []
    start = threading.Barrier(6)

    def send() -> None:
        start.wait()
        try:
            results.append(store.ingest(run.id, "same-batch-01", _points(1)))
        except BaseException as exc:  # collected and asserted below
            results.append(exc)

    threads = [threading.Thread(target=send) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(not isinstance(r, BaseException) for r in results), results
    assert sorted(r.duplicate for r in results) == [False] + [True] * 5
    assert {r.accepted for r in results} == {5} and {r.run_id for r in results} == {run.id}
    with store.engine.connect() as conn:
        claims = conn.execute(text("SELECT run_id, n_points FROM ingested_batches ORDER BY n_points")).all()
        assert [tuple(c) for c in claims] == [(run.id, 5), (run.id, 5)]
        assert conn.execute(text("SELECT last_step FROM runs WHERE id = :r"), {"r": run.id}).scalar() == 1
    assert store.ingest(run.id, "same-batch-01", _points(7)).duplicate  # other points, the same id: refused
    assert [p.step for p in store.series(run.id, "loss", None, 100, None, None).points] == [0, 1]


def test_a_batch_for_no_run_claims_nothing(store: SqlStore) -> None:
    run, _ = store.upsert_run("p", "r", {})
    with pytest.raises(NotFoundError, match="run id 9999 not found"):
        store.ingest(9999, "lost-batch-01", _points(0))
    with pytest.raises(NotFoundError, match="run 'ghost' not found in project 'p'"):
        store.ingest_named("p", "ghost", "lost-batch-02", _points(0))
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM ingested_batches")).scalar() == 0
    # the ids were not taken: the run that does exist stores them
    assert not store.ingest(run.id, "lost-batch-01", _points(0)).duplicate
    assert not store.ingest_named("p", "r", "lost-batch-02", _points(1)).duplicate


def test_a_batch_without_points_is_claimed_too(store: SqlStore) -> None:
    run, _ = store.upsert_run("p", "r", {})
    assert not store.ingest(run.id, "empty-batch-1", []).duplicate
    again = store.ingest(run.id, "empty-batch-1", [])
    assert again.duplicate and again.accepted == 0
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT last_step FROM runs WHERE id = :r"), {"r": run.id}).scalar() is None


def test_postgresql_claims_in_the_lock_statement(pg_store: SqlStore) -> None:
    run, _ = pg_store.upsert_run("p", "r", {})
    pg_store.ingest(run.id, "warm-up-00", _points(0))
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent.append(" ".join(statement.split())[:60])

    event.listen(pg_store.engine, "before_cursor_execute", record)
    try:
        pg_store.ingest(run.id, "plain-batch-01", _points(1))
    finally:
        event.remove(pg_store.engine, "before_cursor_execute", record)
    assert sent[0].startswith("WITH locked AS (UPDATE runs"), sent
    assert not any(s.startswith("INSERT INTO ingested_batches") for s in sent), sent
