"""The real service in a subprocess (``hyperwatch serve``), killed and restarted; database counts.

:class:`Service` runs ``python -m hyperwatch serve --db URL --port P`` exactly as a user would, with
its output in a log file (the access tests grep it for secrets). ``kill()`` is SIGKILL: no
shutdown handler runs, an open transaction is cut where it stands. ``start()`` again reuses the
same port and database.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine, text

from hyperwatch.monitor.processes import children
from hyperwatch.monitor.processes.children import ServiceProcess, free_port
from hyperwatch.monitor.store import SqlStore, chunks, migrate
from hyperwatch.monitor.store.engine import make_engine, managed

__all__ = ["AUTH", "READ_TOKEN", "REPO", "WRITE_TOKEN", "Service", "free_port", "python_env"]

REPO = Path(__file__).resolve().parents[2]
WRITE_TOKEN = "reliability-write-token-0123456789"
READ_TOKEN = "reliability-read-token-0123456789"
AUTH = {"Authorization": f"Bearer {WRITE_TOKEN}"}


def wait_until(cond: Callable[[], bool], timeout: float = 60.0, every: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every)
    return cond()


def upgrade(url: str) -> None:
    store = SqlStore(url)
    try:
        migrate.upgrade(store.engine)
    finally:
        store.close()


def python_env(**extra: str) -> dict[str, str]:
    """The environment of a child process: this checkout importable, no inherited HYPERWATCH_* settings."""
    return children.python_env(keep_hyperwatch=False, **extra)


class Service(ServiceProcess):
    """``hyperwatch serve`` on 127.0.0.1:``port`` over ``db_url``, as a child process (the shared
    helper, :class:`hyperwatch.monitor.processes.children.ServiceProcess`, with the reliability tests' defaults:
    the write token set, no dev mode, no inherited HYPERWATCH_* settings, ready when /healthz answers)."""

    def __init__(self, db_url: str, log_path: Path, port: int | None = None, **env: str) -> None:
        super().__init__(
            db_url,
            port=port or 0,
            log_path=log_path,
            dev=False,
            upgrade=False,
            env={"HYPERWATCH_WRITE_TOKEN": WRITE_TOKEN, **env},
            keep_hyperwatch_env=False,
            ready_path="/healthz",
            timeout=90.0,
        )


@dataclass
class Stored:
    """What the database holds for one run."""

    points: int  # points stored (hot rows in metric_points and points in metric_chunks)
    distinct: int  # distinct (name, layer, step) keys
    ingested: int  # sum of n_points over the run's stored batches: each point ingested once -> == points
    batches: int  # stored batch ids (a sequence range's numbers each count)
    keys: set[tuple[str, int, int]]
    claim_rows: int = 0  # rows that record them: ingested_batches' and batch_ranges'


def stored(db_url: str, run: str) -> Stored:
    """Read in one snapshot: one transaction (REPEATABLE READ on PostgreSQL, an explicit BEGIN on
    SQLite), so a name registered and a point stored by a writer still running are seen together
    or not at all (two snapshots once saw a point whose name was not there yet: KeyError)."""
    engine = make_engine(db_url)
    try:
        with managed(engine, f"read what run {run} holds") as conn:
            run_ids = [r[0] for r in conn.execute(text("SELECT id FROM runs WHERE name = :n"), {"n": run})]
            if not run_ids:
                return Stored(0, 0, 0, 0, set())
            rid = run_ids[0]
            # hot rows and chunked points alike: a key stored in both would count twice
            points = chunks.all_points(conn, rid)
            names: dict[int, str] = dict(conn.execute(text("SELECT id, name FROM metric_names")).tuples().all())
            keys = [(str(names[n]), la, s) for _r, n, la, s, _t, _v in points]
            # the hooks' sequence ids are claimed as ranges (revision 0019), any other id as a row
            ingested, batches, rows = conn.execute(
                text(
                    "SELECT COALESCE(SUM(n), 0), COALESCE(SUM(k), 0), COUNT(*) FROM (SELECT n_points AS n, 1 AS k "
                    "FROM ingested_batches WHERE run_id = :r UNION ALL SELECT n_points, hi - lo + 1 "
                    "FROM batch_ranges WHERE run_id = :r) AS claimed"
                ),
                {"r": rid},
            ).one()
    finally:
        engine.dispose()
    return Stored(len(keys), len(set(keys)), int(ingested), int(batches), set(keys), int(rows))


def count_rows(db_url: str, table: str) -> int:
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar() or 0)
    finally:
        engine.dispose()
