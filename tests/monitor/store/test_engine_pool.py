"""PostgreSQL's pool pings a connection only when it sat idle (``engine._ping_if_idle``, issue 36).

Each test ends a pooled connection's server process (``pg_terminate_backend``), as a server restart
or an idle timeout does, and shows what the next transaction sees: after an idle spell, nothing (the
ping finds the dead connection and the pool opens another); right after the connection was checked
in, one failed transaction (no ping, by design: a stream of batches pays no round trip for it), and
the pool is whole again at the next.
"""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from hyperwatch.monitor.core.errors import StoreUnavailableError
from hyperwatch.monitor.store import engine as engine_module
from hyperwatch.monitor.store.engine import make_engine, managed


def _pid(engine: object) -> int:
    with managed(engine, "read the backend's pid") as conn:  # type: ignore[arg-type]
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(pg_url: str, pid: int) -> None:
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar_one()
            # the process is gone once no row of pg_stat_activity names it
            for _ in range(200):
                if not conn.execute(text("SELECT 1 FROM pg_stat_activity WHERE pid = :p"), {"p": pid}).first():
                    break
                conn.execute(text("SELECT pg_sleep(0.01)"))
    finally:
        admin.dispose()


def test_a_connection_that_died_while_idle_is_replaced_before_use(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(pg_url)
    try:
        monkeypatch.setattr(engine_module, "PING_AFTER_IDLE_S", 0.0)  # every checkout counts as idle
        first = _pid(engine)
        _terminate(pg_url, first)
        second = _pid(engine)  # the ping found it dead: a fresh connection, no error
        assert second != first
        assert _pid(engine) == second  # and the fresh one stays in the pool
    finally:
        engine.dispose()


def test_a_connection_checked_in_a_moment_ago_is_not_pinged(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(pg_url)
    try:
        monkeypatch.setattr(engine_module, "PING_AFTER_IDLE_S", 3600.0)  # never idle long enough
        first = _pid(engine)
        _terminate(pg_url, first)
        # handed out unpinged: the transaction meets the dead connection and fails with the store's error
        with pytest.raises(StoreUnavailableError, match="read the backend's pid"):
            _pid(engine)
        # SQLAlchemy invalidated the pool on the disconnect: the next transaction gets a live connection
        assert _pid(engine) != first
    finally:
        engine.dispose()


def test_sqlite_connections_checkpoint_the_wal_at_the_stores_size(sqlite_url: str) -> None:
    """Every pooled SQLite connection runs with the store's settings, the WAL's checkpoint size included (each
    batch writes one WAL page per hot leaf it touches: at SQLite's default 1,000 pages every ~7th commit
    checkpointed; ``bench/store_ingest.py --db sqlite``: 0.92x the time per batch at 8,000)."""
    eng = make_engine(sqlite_url)
    try:
        with eng.connect() as conn:
            got = [conn.exec_driver_sql(f"PRAGMA {p}").scalar() for p in ("wal_autocheckpoint", "journal_mode")]
        assert got == [engine_module.SQLITE_WAL_AUTOCHECKPOINT, "wal"]
        assert engine_module.SQLITE_WAL_AUTOCHECKPOINT > 1000
    finally:
        eng.dispose()
