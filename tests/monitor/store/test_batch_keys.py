"""Revision 0017: batch ids stored as compact keys, times as Unix milliseconds, SQLite's table without
a rowid (issue 36): the key itself, a duplicate seen across the migration, the migration both ways,
and a writer arriving while it holds the table, on both databases."""

from __future__ import annotations

import sqlite3
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import text

from hyperwatch.monitor.store import SqlStore, migrate
from hyperwatch.monitor.store.points import batch_id_of, batch_key, batch_seen, claim_batch
from tests.monitor.store.test_migration_writers import RUN_SQL, Gap, _run_held

BEFORE, AFTER = "0016_toast_split", "0017_batch_keys"
HEX = uuid.UUID(int=0x0123456789ABCDEF0123456789ABCDEF).hex
AT = datetime(2026, 11, 30, 7, 45, 33, 123456, tzinfo=UTC)
BATCHES = {HEX: 5, HEX.upper(): 6, "old-batch-1": 7, "0" * 16: 8, "x" * 64: 9}


def test_keys_are_short_distinct_and_give_the_id_back() -> None:
    ids = [*BATCHES, uuid.uuid4().hex, "-" * 8, "A" * 17]
    keys = [batch_key(i) for i in ids]
    assert len(set(keys)) == len(ids)
    assert [batch_id_of(k) for k in keys] == ids
    assert len(batch_key(HEX)) == 17 and batch_key(HEX)[0] == 0
    assert batch_key(HEX.upper()) == HEX.upper().encode()  # not lowercase hex: kept as text
    assert batch_key("0" * 16) == b"0" * 16  # text ids never start with a 0 byte


def _seed(store: SqlStore) -> None:
    migrate.upgrade(store.engine, BEFORE)
    stamp: Any = AT if store.engine.dialect.name == "postgresql" else AT.replace(tzinfo=None).isoformat(" ")
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO projects (id, name, created_at) VALUES (1, 'p', CURRENT_TIMESTAMP)"))
        conn.execute(text(RUN_SQL))
        for bid, n in BATCHES.items():
            conn.execute(text("INSERT INTO ingested_batches VALUES (:b, 1, :n, :t)"), {"b": bid, "n": n, "t": stamp})
        conn.execute(text("INSERT INTO series_latest VALUES (1, 1, -1, 42, 0.5), (1, 1, 3, 40, NULL)"))


def _latest_and_rowid(store: SqlStore) -> tuple[list[tuple[Any, ...]], list[bool]]:
    """series_latest's rows, and on SQLite whether each of the two tables has a rowid."""
    with store.engine.connect() as conn:
        rows = [tuple(r) for r in conn.execute(text("SELECT * FROM series_latest ORDER BY layer"))]
        if conn.dialect.name != "sqlite":
            return rows, []
        ddl = [
            str(conn.execute(text("SELECT sql FROM sqlite_master WHERE name = :t"), {"t": t}).scalar()).upper()
            for t in ("ingested_batches", "series_latest")
        ]
    return rows, ["WITHOUT ROWID" not in d for d in ddl]


def test_0017_converts_ids_and_times_both_ways(db_url: str) -> None:
    store = SqlStore(db_url)
    try:
        _seed(store)
        latest, rowid = _latest_and_rowid(store)
        assert latest == [(1, 1, -1, 42, 0.5), (1, 1, 3, 40, None)] and rowid in ([], [True, True])
        migrate.upgrade(store.engine, AFTER)
        assert _latest_and_rowid(store) == (latest, [False, False] if rowid else [])
        ms = int(AT.timestamp() * 1000)
        with store.engine.begin() as conn:
            rows = conn.execute(text("SELECT batch_id, run_id, n_points, received_ms FROM ingested_batches")).all()
            assert sorted((bytes(k), r, n, t) for k, r, n, t in rows) == sorted(
                (batch_key(b), 1, n, ms) for b, n in BATCHES.items()
            )
            # what the service asks: a retry of a batch sent before the upgrade is a duplicate
            assert [batch_seen(conn, 1, b) for b in BATCHES] == list(BATCHES.values())
            assert claim_batch(conn, 1, HEX, 99) == 5 and claim_batch(conn, 1, "new-batch-1", 3) is None
        migrate.downgrade(store.engine, BEFORE)
        assert _latest_and_rowid(store) == (latest, rowid)
        with store.engine.connect() as conn:
            rows = conn.execute(text("SELECT batch_id, n_points, received_at FROM ingested_batches")).all()
        back = {b: (n, t) for b, n, t in rows}
        assert {b: n for b, (n, _t) in back.items()} == {**BATCHES, "new-batch-1": 3}
        at_ms = AT.replace(microsecond=123000)
        for bid in BATCHES:
            got = back[bid][1]
            got = datetime.fromisoformat(got) if isinstance(got, str) else got
            assert (got if got.tzinfo else got.replace(tzinfo=UTC)) == at_ms, (bid, got)
    finally:
        store.close()


def _claim(new: bool) -> Any:
    """A service's claim of a new batch on a DB-API connection: 0017's (a key, milliseconds) or 0016's."""

    def write(conn: Any) -> None:
        mark = "?" if isinstance(conn, sqlite3.Connection) else "%s"
        if new:
            row: tuple[Any, ...] = (batch_key("gap-batch-01"), int(AT.timestamp() * 1000))
        else:
            row = ("gap-batch-01", AT if mark == "%s" else AT.replace(tzinfo=None).isoformat(" "))
        cols = "batch_id, run_id, n_points, " + ("received_ms" if new else "received_at")
        conn.execute(f"INSERT INTO ingested_batches ({cols}) VALUES ({mark}, 1, 4, {mark})", row)

    return write


@pytest.mark.parametrize("move", ["up", "down"])
def test_0017_keeps_every_batch_with_a_writer_arriving_in_the_gap(db_url: str, move: str) -> None:
    store = SqlStore(db_url)
    try:
        _seed(store)
        pg = store.engine.dialect.name == "postgresql"
        if move == "down":
            migrate.upgrade(store.engine, AFTER)
        writer = _claim(new=move == "down")  # a service of the schema the migration leaves
        # PostgreSQL converts in one ALTER TABLE: the writer comes after the LOCK, right before it;
        # SQLite's gap is the usual one, between its copy and its DROP
        if pg:
            gap = Gap(db_url, "LOCK TABLE ingested_batches", writer, ("ALTER TABLE INGESTED_BATCHES",))
        else:
            gap = Gap(db_url, "INSERT INTO ingested_batches_new", writer)
        if move == "up":
            _run_held(store, gap, lambda: migrate.upgrade(store.engine, AFTER))
        else:
            _run_held(store, gap, lambda: migrate.downgrade(store.engine, BEFORE))
        # kept out (SQLite: the write lock; PostgreSQL: queued behind the lock, then the new schema
        # refused it), so never acknowledged; every batch stored before is there, converted
        assert gap.outcome[0].startswith("refused"), gap.outcome
        with store.engine.connect() as conn:
            if move == "up":
                assert all(batch_seen(conn, 1, b) == n for b, n in BATCHES.items())
            else:
                got = {r[0]: r[1] for r in conn.execute(text("SELECT batch_id, n_points FROM ingested_batches"))}
                assert got == BATCHES
    finally:
        store.close()
