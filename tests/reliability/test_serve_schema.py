"""``hyperwatch serve`` on a new, empty SQLite file creates its schema; an older schema is refused.

Issue 25: a first ``hyperwatch serve --db sqlite:///new.db`` refused to start and asked for
``db upgrade`` (MLflow's server creates its schema on an empty database). Upgrading a database
that holds data stays the operator's decision: an older schema is still refused, with the command.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

from hyperwatch.monitor.store import SqlStore, migrate
from tests.reliability.support import AUTH, REPO, WRITE_TOKEN, Service, python_env


def test_serve_creates_the_schema_of_a_new_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/new.db"
    svc = Service(url, tmp_path / "service.log")
    svc.start()
    try:
        assert httpx.get(f"{svc.url}/readyz").status_code == 200
        r = httpx.post(f"{svc.url}/api/v1/runs", json={"name": "first"}, headers=AUTH)
        assert r.status_code in (200, 201), r.text
        assert "created its schema" in svc.log()
    finally:
        svc.kill()
    store = SqlStore(url)
    try:
        assert migrate.current_revision(store.engine) == migrate.head_revision()
    finally:
        store.close()
    # Started again on the same file: nothing to create, and the run is still there.
    again = Service(url, tmp_path / "again.log")
    again.start()
    try:
        assert [r["name"] for r in httpx.get(f"{again.url}/api/v1/runs").json()] == ["first"]
        assert "created its schema" not in again.log()
    finally:
        again.kill()


def test_serve_still_refuses_an_older_schema(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/old.db"
    store = SqlStore(url)
    migrate.upgrade(store.engine, "0001_initial")
    store.close()
    r = subprocess.run(
        [sys.executable, "-m", "hyperwatch", "serve", "--db", url, "--port", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=python_env(HYPERWATCH_WRITE_TOKEN=WRITE_TOKEN),
    )
    assert r.returncode == 2, r.stderr
    assert "hyperwatch db upgrade" in r.stderr and "0001_initial" in r.stderr
    store = SqlStore(url)
    try:
        assert migrate.current_revision(store.engine) == "0001_initial"  # left as it was
    finally:
        store.close()
