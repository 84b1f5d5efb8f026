"""Engine construction and the managed session.

SQLite gets WAL (readers never block the writer), ``synchronous=NORMAL`` (safe with WAL), a 30 s
busy timeout (concurrent writers wait instead of failing with "database is locked") and foreign
keys on. PostgreSQL gets a pool that pings a connection before use when it sat idle
(:func:`_ping_if_idle`). :func:`managed` commits or rolls back and turns database errors into
:class:`~monitor.core.errors.StoreUnavailableError` naming the operation.

Lock contention never reaches a user as "database is locked": a writer first waits under the busy
timeout; if it still loses (SQLite busy, PostgreSQL deadlock or serialization failure), managed
raises :class:`~monitor.core.errors.StoreBusyError`, and the write methods wrapped in
:func:`retry_busy` run their whole transaction again; only after those attempts does the client
get a 503 with ``Retry-After`` (its sink retries under the same idempotency key). A value that
cannot be bound (an integer beyond 64 bits) is the request's fault: 422, not an outage.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DataError, DBAPIError, DisconnectionError, IntegrityError, OperationalError, SQLAlchemyError

from hyperwatch.monitor.core.errors import (
    InvalidInputError,
    MonitorError,
    StoreBusyError,
    StoreFullError,
    StoreUnavailableError,
)
from hyperwatch.monitor.store.bulk import register_pg_types

log = logging.getLogger(__name__)
BUSY_TIMEOUT_MS = 30_000
BUSY_ATTEMPTS = 3
PING_AFTER_IDLE_S = 1.0
"""A pooled PostgreSQL connection idle this long is pinged before use (see :func:`_ping_if_idle`)."""
_BUSY_MARKERS = ("database is locked", "database is busy", "deadlock detected", "could not serialize access")
# SQLite's SQLITE_FULL; PostgreSQL's disk_full (53100) and the OS's ENOSPC in its message.
_FULL_MARKERS = ("database or disk is full", "no space left on device", "disk full")
SQLITE_PAGE_SIZE = 2048
"""The page size of a new SQLite file (an existing one keeps its own until ``hyperwatch db compact``
rewrites it, with the service stopped). Since revision 0015 ``metric_chunks`` is a rowid table: a row
that fits a leaf's share stays whole in it, and a longer one (a 1,024-step segment, 2.5-6.5 KB) fills
whole overflow pages and keeps the remainder in its leaf. Bytes per point of new files, side by side
(``bench/storage.py``'s sets, SQLite, 2026-12-01): 1 KB pages 4.79 (issue 36's workload) / 9.74 (the
real-hooks fixture of 50-point series) / 3.46 (a 2,000-step hooks run); 2 KB 4.74 / 9.13 / 3.44; 4 KB
5.97 / 8.68 / 4.32 (a segment of 2.5-4 KB takes a leaf alone). 2 KB pages also touch fewer pages per
batch: the store's time per batch 0.92x of 1 KB's (``bench/store_ingest.py --db sqlite --against``).
Before 0015 (``WITHOUT ROWID``, where a row kept only ~230 bytes in a 1 KB leaf) 1 KB was the best."""
SQLITE_WAL_AUTOCHECKPOINT = 8000
"""WAL pages (of ``SQLITE_PAGE_SIZE``) after which a commit checkpoints them into the file (SQLite's default 1,000).
A one-step batch of issue 36's workload writes 30-190 pages (one per hot leaf it touches), so at 1,000 every
~7th commit copied the WAL into the file and synced both; at 8,000 (8 MB of WAL with 1 KB pages, 16 MB with
the 2 KB pages since 2026-12-01) one in ~60 does."""
_P = ParamSpec("_P")
_R = TypeVar("_R")


def make_engine(url: str, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> Engine:
    """An engine for ``url`` (``sqlite:///file.db`` or ``postgresql+psycopg://...``).

    ``busy_timeout_ms``: how long a SQLite writer waits for the lock before giving up (tests shorten it).
    """
    if busy_timeout_ms < 0:
        raise ValueError(f"busy_timeout_ms: must be >= 0 milliseconds, got {busy_timeout_ms}")
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": busy_timeout_ms / 1000, "check_same_thread": False})
        event.listen(engine, "connect", functools.partial(_sqlite_pragmas, busy_timeout_ms=busy_timeout_ms))
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    engine = create_engine(url, pool_size=8, max_overflow=8)
    event.listen(engine, "connect", lambda dbapi_conn, _record: register_pg_types(dbapi_conn))
    event.listen(engine, "checkin", _checked_in)
    event.listen(engine, "checkout", functools.partial(_ping_if_idle, engine.dialect))
    return engine


def _checked_in(_dbapi_conn: Any, record: Any) -> None:
    record.info["checked_in"] = time.monotonic()


def _ping_if_idle(dialect: Any, dbapi_conn: Any, record: Any, _proxy: Any) -> None:
    """Ping a connection that sat in the pool for ``PING_AFTER_IDLE_S`` or more before handing it out.

    A server restart, a fail-over or an idle timeout closes connections while they wait in the pool;
    the ping (the dialect's own, outside any transaction) finds it, and :class:`DisconnectionError`
    makes the pool open a fresh one (up to three tries) before the caller sees anything. A connection
    checked in a moment ago (the next batch of a stream) is handed out as it is: ``pool_pre_ping``
    pinged every checkout: one round trip more on each transaction (a plain batch makes five without it:
    BEGIN, the run's lock with its batch id, the pending append, series_latest, COMMIT; issue 36).
    Were the server to drop it within that second, the first statement fails, SQLAlchemy invalidates
    the whole pool, and the request is answered 503 (the hooks' sink sends it again under its id).
    """
    since = record.info.get("checked_in")
    if since is None or time.monotonic() - since < PING_AFTER_IDLE_S:
        return
    try:
        dialect.do_ping(dbapi_conn)
    except Exception as exc:  # any failure of the ping: the connection is not fit to hand out
        raise DisconnectionError(f"the pooled connection failed its ping after idling: {exc}") from exc


def _sqlite_pragmas(dbapi_conn: Any, _record: Any, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
    dbapi_conn.isolation_level = None  # the driver's own implicit BEGIN off: _sqlite_begin emits it
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")  # a new file only: before WAL writes its header
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute(f"PRAGMA wal_autocheckpoint={SQLITE_WAL_AUTOCHECKPOINT}")
    cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
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

    ``write=True`` marks a transaction that will write (on SQLite: BEGIN IMMEDIATE). A read-only
    one on PostgreSQL runs at REPEATABLE READ: all its statements see one snapshot, as SQLite's WAL
    readers do, so a read of hot rows and chunks (two statements) never straddles a writer moving
    points from one to the other (it would see them twice or not at all). Read-only transactions
    never fail to serialize.

    Domain errors pass through unchanged; SQLAlchemy errors become ``StoreUnavailableError`` whose
    message names ``operation`` and the database's own complaint.
    """
    try:
        with engine.connect() as conn:
            if write:
                conn.execution_options(hyperwatch_write=True)
            elif engine.dialect.name == "postgresql":
                conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                yield conn
    except MonitorError:
        raise
    except OverflowError as exc:
        # sqlite3 cannot bind an integer beyond 64 bits.
        log.info("input the database cannot store during %s: %s", operation, exc)
        raise InvalidInputError(
            f"a number in the request does not fit the database while trying to {operation} "
            "(integers are 64-bit: at most 9223372036854775807); send a smaller value"
        ) from exc
    except IntegrityError as exc:
        if _is_race(exc):
            # A unique or foreign-key clash is another writer's row arriving first: retry, like a lock race.
            log.info("write race during %s: %s", operation, _first_line(exc))
            raise StoreBusyError(
                f"another writer changed the same rows while trying to {operation}; retry in a few seconds"
            ) from exc
        raise _refused(operation, exc) from exc
    except DataError as exc:
        raise _refused(operation, exc) from exc
    except (OperationalError, DBAPIError, SQLAlchemyError) as exc:
        for hook in DB_ERRORS_HOOK:
            hook(exc)
        detail = _first_line(exc)
        sqlstate = getattr(getattr(exc, "orig", None), "sqlstate", None)
        if sqlstate == "53100" or any(m in detail.lower() for m in _FULL_MARKERS):
            log.error("database full during %s: %s", operation, detail)
            raise StoreFullError(
                f"the database's disk is full while trying to {operation} ({detail}); nothing of this "
                "request was stored: free disk space on the database's volume (or raise its size limit), "
                "then send it again"
            ) from exc
        if any(marker in detail.lower() for marker in _BUSY_MARKERS):
            log.info("database busy during %s: %s", operation, detail)
            raise StoreBusyError(
                f"the database is busy with other writers while trying to {operation}; "
                "retry in a few seconds (the hooks' sink and 'hyperwatch upload' retry by themselves)"
            ) from exc
        log.warning("database error during %s: %s", operation, exc)
        raise StoreUnavailableError(
            f"database error while trying to {operation}: {detail}; check that the database is reachable "
            "and its schema is current (hyperwatch db upgrade)"
        ) from exc


def _is_race(exc: IntegrityError) -> bool:
    code = getattr(exc.orig, "sqlstate", None)  # psycopg
    if code is not None:
        return code in ("23505", "23503")  # unique_violation, foreign_key_violation
    text = str(exc.orig).upper()
    return "UNIQUE CONSTRAINT" in text or "FOREIGN KEY CONSTRAINT" in text


def _refused(operation: str, exc: DBAPIError) -> InvalidInputError:
    """The request's values, not the database: a value a column cannot hold (PostgreSQL: an integer
    beyond 64 bits, a NUL in text) or a constraint it breaks (NOT NULL, CHECK). A 4xx naming the
    column, never a 503 that clients would retry forever."""
    detail = _first_line(exc)
    log.info("input the database refused during %s: %s", operation, detail)
    return InvalidInputError(
        f"the database refused a value while trying to {operation}: {detail}; "
        "fix that field of the request (integers are 64-bit, text holds no NUL character)"
    )


def _first_line(exc: Exception) -> str:
    text = str(getattr(exc, "orig", exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def retry_busy(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run a whole write transaction again when it lost a lock race (:class:`StoreBusyError`).

    Each attempt is a fresh transaction, so a retry never sees half of a failed one.
    """

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        for attempt in range(1, BUSY_ATTEMPTS + 1):
            try:
                return method(*args, **kwargs)
            except StoreBusyError:
                if attempt == BUSY_ATTEMPTS:
                    raise
                time.sleep(0.05 * attempt)
        raise AssertionError("unreachable")

    return wrapper
