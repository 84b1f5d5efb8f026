"""Database faults: a kill mid-ingest, an unreachable database, SQLite lock contention.

- SIGKILL while large batches are being written leaves every batch whole or absent (one
  transaction per batch), on SQLite and PostgreSQL.
- A database that cannot be reached answers 503 with ``Retry-After``; the hooks' sink keeps
  retrying and delivers once the database is there.
- SQLite "database is locked" never reaches a client: a writer waits its turn; one that waited
  too long gets a 503 with ``Retry-After`` whose message does not mention the lock, and nothing
  half-written.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from hyperwatch.app import create_app
from hyperwatch.hooks.schema import Batch, Point
from hyperwatch.hooks.sinks import HttpSink, RunInfo
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.store import SqlStore, chunks
from hyperwatch.monitor.store.points import batch_id_of
from tests.monitor.conftest import PG_ADMIN_URL
from tests.reliability.support import AUTH, WRITE_TOKEN, Service, stored, upgrade, wait_until

BIG = 5000  # points per batch in the kill test: each batch is a transaction of some weight


def test_kill_mid_ingest_leaves_no_partial_batch(service: Service) -> None:
    posted: list[tuple[str, int]] = []  # (batch_id, first step) of every batch sent
    stop = threading.Event()

    def pump() -> None:
        with httpx.Client(base_url=service.url, headers=AUTH, timeout=30) as c:
            assert c.post("/api/v1/runs", json={"name": "mid-1"}).status_code == 201
            i = 0
            while not stop.is_set():
                first = i * 100  # a batch covers steps first .. first + BIG // 64 (< 100)
                points = [
                    {"name": "attention_z", "layer": j % 64, "step": first + j // 64, "value": float(j)}
                    for j in range(BIG)
                ]
                bid = uuid.uuid4().hex
                posted.append((bid, first))
                try:
                    c.post("/api/v1/points", json={"batch_id": bid, "run": "mid-1", "points": points})
                except httpx.HTTPError:
                    return  # the service died under us
                i += 1

    thread = threading.Thread(target=pump)
    thread.start()
    assert wait_until(lambda: stored(service.db_url, "mid-1").batches >= 3, timeout=90)
    service.kill()
    stop.set()
    thread.join(60)
    service.start()

    engine = create_engine(service.db_url)
    try:
        with engine.connect() as conn:
            done = {batch_id_of(r[0]) for r in conn.execute(text("SELECT batch_id FROM ingested_batches"))}
            per_step: dict[int, int] = Counter(p[3] for p in chunks.all_points(conn))  # hot and chunked
    finally:
        engine.dispose()
    assert len(done) >= 3
    for bid, first in posted:
        n = sum(per_step.get(first + k, 0) for k in range(BIG // 64 + 1))
        assert n == (BIG if bid in done else 0), f"batch {bid}: {n} of {BIG} points stored"
    assert set(done) <= {bid for bid, _ in posted}


@pytest.fixture
def absent_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(kind, url) of a database that does not exist yet: a SQLite file in a missing folder, or a
    PostgreSQL database not yet created. ``create_db(kind, url)`` brings it into being."""
    if request.param == "sqlite":
        yield "sqlite", f"sqlite:///{tmp_path}/not-yet/hyperwatch.db"
        return
    name = f"hw_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect():
            pass
    except OperationalError:
        admin.dispose()
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}")
    try:
        yield "postgresql", PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def create_db(kind: str, url: str) -> None:
    if kind == "sqlite":
        Path(url.removeprefix("sqlite:///")).parent.mkdir()
    else:
        admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{url.rsplit("/", 1)[1]}"'))
        admin.dispose()
    upgrade(url)


@pytest.mark.parametrize("absent_db", ["sqlite", "postgresql"], indirect=True)
def test_unreachable_database_is_503_with_retry_after_and_the_client_retries(
    absent_db: tuple[str, str], tmp_path: Path
) -> None:
    kind, url = absent_db
    svc = Service(url, tmp_path / "service.log", HYPERWATCH_CHECK_SCHEMA="false")
    svc.start()
    sink = HttpSink(svc.url, token=WRITE_TOKEN, spool=tmp_path / "spool", backoff=(0.05, 0.3))
    try:
        with httpx.Client(base_url=svc.url, headers=AUTH, timeout=30) as c:
            r = c.post("/api/v1/runs", json={"name": "down-1"})
            assert r.status_code == 503, r.text
            assert int(r.headers["Retry-After"]) > 0
            assert "database" in r.json()["detail"] and "Traceback" not in r.text
            assert c.get("/readyz").status_code == 503
        sink.start(RunInfo("down-1"))
        for step in range(5):
            sink.write(Batch("down-1", [Point("loss", step, float(step))]))
        assert wait_until(lambda: "503" in sink.last_error, timeout=60)
        create_db(kind, url)  # the database comes back
        assert sink.flush(90), sink.last_error
        got = stored(url, "down-1")
        assert got.points == got.ingested == 5
    finally:
        sink.close()
        svc.kill()


def _hold_write_lock(path: str) -> sqlite3.Connection:
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another process's writer holds the database
    other.execute("INSERT INTO projects (name, created_at) VALUES ('locker', '2024-01-01')")
    return other


def test_sqlite_lock_contention_never_reaches_the_client(sqlite_url: str) -> None:
    upgrade(sqlite_url)
    path = sqlite_url.removeprefix("sqlite:///")
    store = SqlStore(sqlite_url, busy_timeout_ms=100)
    app = create_app(
        Settings(database_url="sqlite://", write_token=WRITE_TOKEN), store=store, registry=CollectorRegistry()
    )
    c = TestClient(app, headers=AUTH)
    assert c.post("/api/v1/runs", json={"name": "lock-1"}).status_code == 201
    batch = {"batch_id": "contended-batch-1", "run": "lock-1", "points": [{"name": "loss", "step": 1, "value": 1.0}]}

    other = _hold_write_lock(path)
    r = c.post("/api/v1/points", json=batch)  # waits 100 ms x 3 attempts, then gives a clean 503
    other.execute("ROLLBACK")
    other.close()
    assert r.status_code == 503 and int(r.headers["Retry-After"]) > 0
    assert "busy" in r.json()["detail"] and "database is locked" not in r.text.lower()
    assert stored(sqlite_url, "lock-1").points == 0  # nothing half-written
    assert c.post("/api/v1/points", json=batch).status_code == 201  # the client's retry
    store.close()

    # With a realistic busy timeout a writer simply waits for the lock and succeeds.
    patient = SqlStore(sqlite_url, busy_timeout_ms=20_000)
    app = create_app(
        Settings(database_url="sqlite://", write_token=WRITE_TOKEN), store=patient, registry=CollectorRegistry()
    )
    c = TestClient(app, headers=AUTH)
    other = _hold_write_lock(path)
    result: dict[str, int] = {}
    body = {**batch, "batch_id": "contended-batch-2", "points": [{"name": "loss", "step": 2, "value": 2.0}]}
    t = threading.Thread(target=lambda: result.update(code=c.post("/api/v1/points", json=body).status_code))
    t.start()
    time.sleep(0.3)  # the request is now waiting on the lock (not an assertion on time)
    other.execute("ROLLBACK")
    other.close()
    t.join(60)
    assert result["code"] == 201
    assert stored(sqlite_url, "lock-1").points == 2
    patient.close()
