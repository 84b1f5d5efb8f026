"""Fixtures: a real SQLite file and a real PostgreSQL database per test, the app on a fresh registry.

PostgreSQL: a database ``hw_test_<random>`` is created on postgres@127.0.0.1:5432 for each test that
asks for it and dropped afterwards, so parallel runs never collide. Without a reachable server
the PostgreSQL tests skip locally and fail under CI=true.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from hyperwatch.app import create_app  # the API and the pages, as `hyperwatch serve` assembles them
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.store import SqlStore, migrate

PG_ADMIN_URL = os.environ.get("HYPERWATCH_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
WRITE_TOKEN = "test-write-token-0123456789"
READ_TOKEN = "test-read-token-0123456789"
AUTH = {"Authorization": f"Bearer {WRITE_TOKEN}"}


@pytest.fixture
def sqlite_url(tmp_path: object) -> str:
    return f"sqlite:///{tmp_path}/hyperwatch.db"


@pytest.fixture
def pg_url() -> Iterator[str]:
    name = f"hw_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError as exc:
        admin.dispose()
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} is required under CI=true: {exc}")
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}")
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """The same test on a SQLite file and on a fresh PostgreSQL database."""
    return str(request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url"))


@pytest.fixture
def store(db_url: str) -> Iterator[SqlStore]:
    s = SqlStore(db_url)
    migrate.upgrade(s.engine)
    yield s
    s.close()


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[SqlStore]:
    """PostgreSQL alone: the dialect whose writer packs chunks and keeps pending batches (store.compact, .pending)."""
    s = SqlStore(pg_url)
    migrate.upgrade(s.engine)
    yield s
    s.close()


@pytest.fixture
def sqlite_store(sqlite_url: str) -> Iterator[SqlStore]:
    s = SqlStore(sqlite_url)
    migrate.upgrade(s.engine)
    yield s
    s.close()


def make_client(store: SqlStore, **settings: object) -> TestClient:
    base: dict[str, object] = {"database_url": str(store.engine.url.render_as_string(hide_password=False))}
    base.update({"write_token": WRITE_TOKEN, **settings})
    app = create_app(Settings(**base), store=store, registry=CollectorRegistry())  # type: ignore[arg-type]
    return TestClient(app)


@pytest.fixture
def client(store: SqlStore) -> TestClient:
    return make_client(store)


@pytest.fixture
def sqlite_client(sqlite_store: SqlStore) -> TestClient:
    return make_client(sqlite_store)


def create_run(client: TestClient, name: str = "r1", **fields: object) -> dict[str, object]:
    r = client.post("/api/v1/runs", json={"name": name, **fields}, headers=AUTH)
    assert r.status_code in (200, 201), r.text
    body: dict[str, object] = r.json()
    return body


def post_points(
    client: TestClient, run: str, points: list[dict[str, object]], batch_id: str | None = None
) -> dict[str, object]:
    body = {"batch_id": batch_id or uuid.uuid4().hex, "run": run, "points": points}
    r = client.post("/api/v1/points", json=body, headers=AUTH)
    assert r.status_code in (200, 201), r.text
    out: dict[str, object] = r.json()
    return out


def promtool() -> str:
    """promtool's path; missing: a failure in CI, else a skip that says how to install it."""
    found = shutil.which("promtool")
    if found is None:
        message = "promtool is missing; install it with: bash scripts/system-deps.sh"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    return found
