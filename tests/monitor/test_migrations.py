"""Alembic owns the schema: one head, upgrade and downgrade on both databases, refusal when behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from sqlalchemy import inspect

from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.core.errors import SchemaOutOfDateError
from hyperwatch.monitor.main import create_app
from hyperwatch.monitor.store import SqlStore, migrate
from hyperwatch.monitor.store.models import Base

TABLES = {
    "projects",
    "groups",
    "runs",
    "run_tags",
    "metric_names",
    "metric_points",
    "metric_rollups",
    "series_latest",
    "ingested_batches",
    "alert_events",
}
REPO = Path(__file__).resolve().parents[2]


def test_exactly_one_head() -> None:
    assert len(migrate.heads()) == 1
    assert migrate.head_revision() == migrate.heads()[0]


def test_upgrade_then_downgrade(db_url: str) -> None:
    store = SqlStore(db_url)
    try:
        assert migrate.current_revision(store.engine) is None
        migrate.upgrade(store.engine)
        assert migrate.current_revision(store.engine) == migrate.head_revision()
        assert set(inspect(store.engine).get_table_names()) >= TABLES
        pk = inspect(store.engine).get_pk_constraint("metric_points")["constrained_columns"]
        assert pk == ["run_id", "name_id", "layer", "step"]
        migrate.downgrade(store.engine, "base")
        assert migrate.current_revision(store.engine) is None
        assert not TABLES & set(inspect(store.engine).get_table_names())
        migrate.upgrade(store.engine)  # and back up again
        assert migrate.current_revision(store.engine) == migrate.head_revision()
    finally:
        store.close()


def test_models_match_migrations(db_url: str) -> None:
    """The ORM tables the store queries are the tables the migrations create."""
    store = SqlStore(db_url)
    try:
        migrate.upgrade(store.engine)
        with store.engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": False})
            diffs = [d for d in compare_metadata(ctx, Base.metadata) if not _is_alembic_table(d)]
        assert diffs == []
    finally:
        store.close()


def _is_alembic_table(diff: object) -> bool:
    return "alembic_version" in repr(diff)


def test_service_refuses_out_of_date_schema(sqlite_url: str) -> None:
    store = SqlStore(sqlite_url)
    settings = Settings(database_url=sqlite_url, write_token="w" * 20)
    with pytest.raises(SchemaOutOfDateError, match="hyperwatch db upgrade"):
        create_app(settings, store=store, registry=CollectorRegistry())
    # With the check off at start-up, /readyz still reports it.
    app = create_app(settings.model_copy(update={"check_schema": False}), store=store, registry=CollectorRegistry())
    r = TestClient(app).get("/readyz")
    assert r.status_code == 503
    assert "hyperwatch db upgrade" in r.json()["detail"]
    migrate.upgrade(store.engine)
    assert TestClient(app).get("/readyz").status_code == 200
    store.close()


def test_db_command_works_from_any_directory(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    cmd = [sys.executable, "-m", "hyperwatch", "db"]
    up = subprocess.run([*cmd, "upgrade", "--db", url], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert up.returncode == 0, up.stderr
    assert "current" in up.stdout
    cur = subprocess.run([*cmd, "current", "--db", url], cwd="/", capture_output=True, text=True, timeout=120)
    assert migrate.head_revision() in cur.stdout
    down = subprocess.run(
        [*cmd, "downgrade", "base", "--db", url], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert down.returncode == 0, down.stderr
    assert "out of date" in down.stdout


def test_serve_refuses_placeholder_token_and_old_schema(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/serve.db"
    env = {"PATH": "/usr/bin:/bin", "HYPERWATCH_WRITE_TOKEN": "changethis", "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [sys.executable, "-m", "hyperwatch", "serve", "--db", url],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 2
    assert "HYPERWATCH_WRITE_TOKEN" in r.stderr
    env["HYPERWATCH_WRITE_TOKEN"] = "a-real-secret-of-some-length"
    r = subprocess.run(
        [sys.executable, "-m", "hyperwatch", "serve", "--db", url],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 2
    assert "hyperwatch db upgrade" in r.stderr
