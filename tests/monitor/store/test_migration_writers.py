"""Migrations that move data, with a writer committing in the gap (issue 25).

Each migration is held, deterministically, between its copy (the first ``INSERT INTO
metric_points``, or pack's first read) and its next ``DROP``/``DELETE``. There a second connection
stores one batch the way the service at that revision does (a pending ``point_batches`` row, a
chunk row, a point row) and commits it, or is kept out. Afterwards every batch that committed,
i.e. that a service would have answered 201 for, must be in the database.

Before issue 25 the 0006 downgrade on PostgreSQL let the batch commit and then dropped it. A
writer already inside when a migration starts is the other case: the migration must wait for its
commit and move its rows too.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from sqlalchemy import event, inspect, text
from sqlalchemy.engine import Engine

from hyperwatch.monitor.store import SqlStore, chunks, migrate, toast

RUN_SQL = (
    "INSERT INTO runs (id, project_id, name, status, config, summary, export_layers, created_at, updated_at) "
    "VALUES (1, 1, 'r', 'running', '{}', '{}', false, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
)


@dataclass
class Gap:
    """Holds the migration at the first statement starting with one of ``stops_at`` (DROP or DELETE)
    after ``marker`` ran, and runs ``write`` there."""

    url: str
    marker: str
    write: Callable[[Any], None]  # on a DB-API connection of its own; commits
    stops_at: tuple[str, ...] = ("DROP", "DELETE")
    copied: bool = False
    started: bool = False
    outcome: list[str] = field(default_factory=list)
    thread: threading.Thread | None = None
    writer_pid: list[int] = field(default_factory=list)

    def after(self, _conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if self.marker in statement:
            self.copied = True

    def before(self, _conn: object, _cursor: object, statement: str, *_args: object) -> None:
        head = statement.lstrip().upper()
        if not self.copied or self.started or not head.startswith(self.stops_at):
            return
        self.started = True
        self.thread = threading.Thread(target=self._writer, daemon=True)
        self.thread.start()
        self._wait_until_committed_or_blocked()

    def _writer(self) -> None:
        try:
            if self.url.startswith("sqlite"):
                conn: Any = sqlite3.connect(self.url.removeprefix("sqlite:///"), timeout=0.5)
            else:
                conn = psycopg.connect(self.url.replace("+psycopg", ""))
                self.writer_pid.append(conn.info.backend_pid)
            try:
                self.write(conn)
                conn.commit()
                self.outcome.append("committed")
            finally:
                conn.close()
        except Exception as exc:  # the writer kept out: its batch was never acknowledged
            self.outcome.append(f"refused: {type(exc).__name__}: {exc}")

    def _wait_until_committed_or_blocked(self) -> None:
        assert self.thread is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self.thread.join(0.05)
            if not self.thread.is_alive():
                return  # it committed (or was refused) while the migration waited
            if self.writer_pid and _waits_on_a_lock(self.url, self.writer_pid[0]):
                return  # PostgreSQL: it is queued behind the migration's lock
        raise AssertionError("the writer neither finished nor waited on a lock within 30 s")


def _waits_on_a_lock(url: str, pid: int) -> bool:
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as c:
        row = c.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return row is not None and row[0] == "Lock"


def _seed(engine: Engine, *, pending: bool, rows: list[int], chunk0: bool) -> None:
    """A run with name 1: ``rows`` as metric_points rows, chunk 0 (steps 0-15), a pending batch (step 40)."""
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO projects (id, name, created_at) VALUES (1, 'p', CURRENT_TIMESTAMP)"))
        conn.execute(text(RUN_SQL))
        conn.execute(text("INSERT INTO metric_names (id, name) VALUES (1, 'loss')"))
        for s in rows:
            conn.execute(text("INSERT INTO metric_points VALUES (1, 1, -1, :s, NULL, :v)"), {"s": s, "v": s / 2})
        if chunk0:
            blob, nf = chunks.encode(0, [(s, None, s / 2) for s in range(16)])
            conn.execute(text("INSERT INTO metric_chunks VALUES (1, 1, -1, 0, :f, :d)"), {"f": nf, "d": blob})
        if pending:
            conn.execute(
                text(
                    "INSERT INTO point_batches (run_id, name_id, token, layer, step, tokens, value) "
                    "VALUES (1, 1, 7, ARRAY[-1]::int2[], ARRAY[40]::int8[], ARRAY[-1]::int8[], ARRAY[20.0]::float8[])"
                )
            )
        top = max([*rows, *(range(16) if chunk0 else []), *([40] if pending else [])])
        conn.execute(text("INSERT INTO series_latest VALUES (1, 1, -1, :s, 0)"), {"s": top})


def _stored_steps(engine: Engine) -> set[int]:
    tables = set(inspect(engine).get_table_names())
    with engine.connect() as conn:
        steps = {int(s) for (s,) in conn.execute(text("SELECT step FROM metric_points WHERE run_id = 1"))}
        for table in ("metric_chunks", "open_chunks"):  # open_chunks: since 0015
            if table in tables:
                cut = any(c["name"] == "data_ext" for c in inspect(engine).get_columns(table))  # since 0016
                data = toast.data_expr(engine.dialect.name) if cut else "data"
                for c, blob in conn.execute(text(f"SELECT chunk, {data} FROM {table} WHERE run_id = 1")):
                    steps |= {s for s, _t, _v in chunks.decode(int(c), bytes(blob))}
        if "point_batches" in tables and engine.dialect.name == "postgresql":
            for (arr,) in conn.execute(text("SELECT step FROM point_batches WHERE run_id = 1")):
                steps |= set(arr)
    return steps


def _pending_batch(conn: Any) -> None:  # the 0006 service's new step on PostgreSQL
    conn.execute(
        "INSERT INTO point_batches (run_id, name_id, token, layer, step, tokens, value) "
        "VALUES (1, 1, 8, ARRAY[-1]::int2[], ARRAY[41]::int8[], ARRAY[-1]::int8[], ARRAY[20.5]::float8[])"
    )


def _chunk_batch(conn: Any) -> None:  # a batch that seals chunk 1 (steps 16-31)
    blob, nf = chunks.encode(1, [(s, None, s / 2) for s in range(16, 32)])
    mark = "?" if isinstance(conn, sqlite3.Connection) else "%s"
    conn.execute(f"INSERT INTO metric_chunks VALUES (1, 1, -1, 1, {mark}, {mark})", (nf, blob))


def v1_chunk_writer(table: str) -> Callable[[Any], None]:
    """A service's batch that seals chunk 3 (steps 48-63) into ``table``, on a DB-API connection."""

    def write(conn: Any) -> None:
        blob, nf = chunks.encode(3, [(s, None, s / 2) for s in range(48, 64)])
        mark = "?" if isinstance(conn, sqlite3.Connection) else "%s"
        cols = "run_id, name_id, layer, chunk, nonfinite, data"
        conn.execute(f"INSERT INTO {table} ({cols}) VALUES (1, 1, -1, 3, {mark}, {mark})", (nf, blob))

    return write


def _row_batch(conn: Any) -> None:  # a late step (5) stored as a row, below the sealed boundary
    conn.execute("INSERT INTO metric_points VALUES (1, 1, -1, 5, NULL, 2.5)")


def _run_held(store: SqlStore, gap: Gap, move: Callable[[], None]) -> None:
    event.listen(store.engine, "after_cursor_execute", gap.after)
    event.listen(store.engine, "before_cursor_execute", gap.before)
    try:
        move()
    finally:
        event.remove(store.engine, "after_cursor_execute", gap.after)
        event.remove(store.engine, "before_cursor_execute", gap.before)
    assert gap.thread is not None, "the migration was never held: its copy or its delete did not run"
    gap.thread.join(30)
    assert gap.outcome, "the writer did not finish"


def _check(store: SqlStore, gap: Gap, before: set[int], batch: set[int]) -> None:
    stored = _stored_steps(store.engine)
    assert before <= stored, f"points stored before the migration are gone: {sorted(before - stored)}"
    if gap.outcome[0] == "committed":  # acknowledged: it must have survived
        assert batch <= stored, f"a batch committed in the gap was lost: steps {sorted(batch - stored)}"


def held_move(
    db_url: str, move: str, before: str, after: str, marker: str, writer: Callable[[Any], None], batch: set[int]
) -> list[str]:
    """A database seeded at 0013 (chunk 0, two rows) migrated from ``before`` to ``after`` (``move``
    "up") or back ("down"), held at its first DROP/DELETE after ``marker`` while ``writer`` commits
    ``batch``'s steps; nothing stored before is lost, nor anything committed. Returns the writer's outcome."""
    store = SqlStore(db_url)
    try:
        migrate.upgrade(store.engine, "0013_webhooks")
        _seed(store.engine, pending=False, rows=[32, 33], chunk0=True)
        migrate.upgrade(store.engine, after if move == "down" else before)
        stored = _stored_steps(store.engine)
        assert set(range(16)) <= stored
        gap = Gap(db_url, marker, writer)
        target = (
            (lambda: migrate.upgrade(store.engine, after))
            if move == "up"
            else (lambda: migrate.downgrade(store.engine, before))
        )
        _run_held(store, gap, target)
        _check(store, gap, stored, batch)
        return gap.outcome
    finally:
        store.close()


def test_0006_downgrade_keeps_a_batch_committed_in_the_gap(db_url: str) -> None:
    store = SqlStore(db_url)
    try:
        pg = store.engine.dialect.name == "postgresql"
        migrate.upgrade(store.engine, "0006_pending_batches")
        _seed(store.engine, pending=pg, rows=[32, 33], chunk0=True)
        before = _stored_steps(store.engine)
        gap = Gap(db_url, "INSERT INTO metric_points", _pending_batch if pg else _chunk_batch)
        _run_held(store, gap, lambda: migrate.downgrade(store.engine, "0005_metric_chunks"))
        assert migrate.current_revision(store.engine) == "0005_metric_chunks"
        _check(store, gap, before, {41} if pg else set(range(16, 32)))
        # the migration took its tables first: the writer was kept out until it was done
        assert gap.outcome[0].startswith("refused"), gap.outcome
    finally:
        store.close()


def test_0005_downgrade_keeps_a_chunk_committed_in_the_gap(db_url: str) -> None:
    store = SqlStore(db_url)
    try:
        migrate.upgrade(store.engine, "0005_metric_chunks")
        _seed(store.engine, pending=False, rows=[32, 33], chunk0=True)
        before = _stored_steps(store.engine)
        gap = Gap(db_url, "INSERT INTO metric_points", _chunk_batch)
        _run_held(store, gap, lambda: migrate.downgrade(store.engine, "0004_alert_source"))
        assert migrate.current_revision(store.engine) == "0004_alert_source"
        _check(store, gap, before, set(range(16, 32)))
        assert gap.outcome[0].startswith("refused"), gap.outcome
    finally:
        store.close()


def test_packing_upgrade_keeps_a_point_committed_in_the_gap(db_url: str) -> None:
    """PostgreSQL packs in 0005, SQLite in 0006: a late step written between pack's read of a series
    and its delete of the rows it packed would be deleted unread."""
    store = SqlStore(db_url)
    try:
        pg = store.engine.dialect.name == "postgresql"
        start, target = (
            ("0004_alert_source", "0005_metric_chunks") if pg else ("0005_metric_chunks", "0006_pending_batches")
        )
        migrate.upgrade(store.engine, start)
        _seed(store.engine, pending=False, rows=[s for s in range(40) if s != 5], chunk0=False)
        before = _stored_steps(store.engine)
        gap = Gap(db_url, "SELECT step, tokens, value FROM metric_points", _row_batch)
        _run_held(store, gap, lambda: migrate.upgrade(store.engine, target))
        _check(store, gap, before, {5})
        if pg:  # it waited for the migration, then went in
            assert gap.outcome == ["committed"], gap.outcome
        else:  # SQLite: kept out by the migration's write lock
            assert gap.outcome[0].startswith("refused"), gap.outcome
    finally:
        store.close()


@pytest.mark.parametrize("move", ["up", "down"])
def test_every_data_moving_migration_locks_before_its_first_read(sqlite_url: str, move: str) -> None:
    """By hand (``alembic`` with its own deferred transaction) on SQLite the lock is taken by the
    migration itself: the no-op write comes before the first read of the rows it moves."""
    store = SqlStore(sqlite_url)
    seen: list[str] = []
    try:
        migrate.upgrade(store.engine, "0004_alert_source" if move == "up" else "0006_pending_batches")

        def record(_c: object, _cur: object, statement: str, *_a: object) -> None:
            seen.append(" ".join(statement.split()))

        event.listen(store.engine, "before_cursor_execute", record)
        if move == "up":
            migrate.upgrade(store.engine, "0006_pending_batches")
        else:
            migrate.downgrade(store.engine, "0004_alert_source")
        event.remove(store.engine, "before_cursor_execute", record)
    finally:
        store.close()
    lock = "UPDATE alembic_version SET version_num = version_num"
    reads = [i for i, s in enumerate(seen) if s.startswith(("SELECT run_id, name_id", "SELECT step, tokens"))]
    locks = [i for i, s in enumerate(seen) if s == lock]
    assert reads and locks and locks[0] < reads[0], seen


def test_0006_downgrade_waits_for_a_writer_inside_and_moves_its_batch(db_url: str) -> None:
    """A batch being written when the downgrade starts: the migration waits for it to commit and
    then moves it too (before issue 25 the copy ran past its uncommitted row and the drop waited
    for the commit, then dropped it: answered 201, gone)."""
    store = SqlStore(db_url)
    try:
        pg = store.engine.dialect.name == "postgresql"
        migrate.upgrade(store.engine, "0006_pending_batches")
        _seed(store.engine, pending=pg, rows=[32, 33], chunk0=True)
        before = _stored_steps(store.engine)
        if pg:
            writer: Any = psycopg.connect(db_url.replace("+psycopg", ""))
        else:
            writer = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
            writer.execute("BEGIN IMMEDIATE")
        (_pending_batch if pg else _chunk_batch)(writer)  # written, not committed yet
        behind_writer(db_url, writer, lambda: migrate.downgrade(store.engine, "0005_metric_chunks"))
        assert migrate.current_revision(store.engine) == "0005_metric_chunks"
        batch = {41} if pg else set(range(16, 32))
        stored = _stored_steps(store.engine)
        assert before | batch <= stored, f"lost: {sorted((before | batch) - stored)}"
    finally:
        store.close()


def behind_writer(url: str, writer: Any, migration: Callable[[], None]) -> None:
    """Run ``migration`` while ``writer`` (a DB-API connection inside a write transaction: PostgreSQL's
    psycopg, or SQLite's after ``BEGIN IMMEDIATE``) has written and not committed: it must still be
    waiting when the writer commits, and then finish without an error."""
    failed: list[BaseException] = []

    def move() -> None:
        try:
            migration()
        except BaseException as exc:  # reported below
            failed.append(exc)

    pg = not isinstance(writer, sqlite3.Connection)
    mover = threading.Thread(target=move, daemon=True)
    mover.start()
    deadline = time.monotonic() + 30
    while pg and time.monotonic() < deadline and not _someone_waits_on_a_lock(url):
        time.sleep(0.05)  # the migration is queued behind the writer's lock
    mover.join(0.5)
    assert mover.is_alive(), "the migration finished while a writer was inside the tables it moves"
    if pg:
        writer.commit()
    else:
        writer.execute("COMMIT")
    writer.close()
    mover.join(60)
    assert not mover.is_alive() and not failed, failed


def _someone_waits_on_a_lock(url: str) -> bool:
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as c:
        row = c.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
    return row is not None and row[0] > 0
