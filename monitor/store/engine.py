"""Engine construction and the managed session.

SQLite gets WAL (readers never block the writer), ``synchronous=NORMAL`` (safe with WAL), a 30 s
busy timeout (concurrent writers wait instead of failing with "database is locked") and foreign
keys on. PostgreSQL gets a pre-ping pool. :func:`managed` commits or rolls back and turns database
errors into :class:`~monitor.core.errors.StoreUnavailableError` naming the operation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError, SQLAlchemyError

from monitor.core.errors import MonitorError, StoreUnavailableError

log = logging.getLogger(__name__)
BUSY_TIMEOUT_MS = 30_000


def make_engine(url: str) -> Engine:
    """An engine for ``url`` (``sqlite:///file.db`` or ``postgresql+psycopg://...``)."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": False})
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=8, max_overflow=8)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.isolation_level = None  # the driver's own implicit BEGIN off: _sqlite_begin emits it
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _sqlite_begin(conn: Connection) -> None:
    # A write transaction takes the write lock up front (BEGIN IMMEDIATE) and so waits its turn
    # under busy_timeout; a deferred one that reads and then writes would fail at once with
    # "database is locked" when another writer committed in between (WAL snapshot rule).
    immediate = conn.get_execution_options().get("hyperwatch_write", False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


DB_ERRORS_HOOK: list[Any] = []
"""Callables run with the exception on every database error (the Prometheus counter hooks in here)."""


@contextmanager
def managed(engine: Engine, operation: str, write: bool = False) -> Iterator[Connection]:
    """A connection in a transaction: commit on success, roll back on any error.

    ``write=True`` marks a transaction that will write (on SQLite: BEGIN IMMEDIATE).

    Domain errors pass through unchanged; SQLAlchemy errors become ``StoreUnavailableError`` whose
    message names ``operation`` and the database's own complaint.
    """
    try:
        with engine.connect() as conn:
            if write:
                conn.execution_options(hyperwatch_write=True)
            with conn.begin():
                yield conn
    except MonitorError:
        raise
    except (OperationalError, DBAPIError, SQLAlchemyError) as exc:
        for hook in DB_ERRORS_HOOK:
            hook(exc)
        log.warning("database error during %s: %s", operation, exc)
        detail = str(getattr(exc, "orig", exc)).strip().splitlines()[0] if str(exc) else type(exc).__name__
        raise StoreUnavailableError(
            f"database error while trying to {operation}: {detail}; check that the database is reachable "
            "and its schema is current (hyperwatch db upgrade)"
        ) from exc
