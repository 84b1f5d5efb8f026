"""Alembic owns the schema: one head, upgrade and downgrade on both databases, refusal when behind."""

from __future__ import annotations

import math
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from sqlalchemy import event, inspect, text

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.api.app import create_app
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.core.errors import SchemaOutOfDateError
from hyperwatch.monitor.store import SqlStore, chunks, migrate
from hyperwatch.monitor.store.models import Base

TABLES = {
    "projects",
    "groups",
    "runs",
    "run_tags",
    "metric_names",
    "metric_points",
    "metric_chunks",
    "metric_rollups",
    "series_latest",
    "ingested_batches",
    "batch_ranges",
    "alert_events",
}
REPO = Path(__file__).resolve().parents[3]


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


def test_sqlite_upgrade_holds_the_write_lock_from_its_first_read(tmp_path: Path) -> None:
    """Another connection that commits while Alembic is between reading and writing the schema
    (a service opening the same fresh file) must wait for the upgrade, not fail it: a deferred
    transaction's first CREATE TABLE would fail at once with "database is locked" (CI saw it)."""
    path = tmp_path / "fresh.db"
    store = SqlStore(f"sqlite:///{path}")
    intruder: list[str] = []

    def other_writer() -> None:
        other = sqlite3.connect(path, timeout=0.3, isolation_level=None)
        try:
            other.execute("CREATE TABLE intruder (x INTEGER)")
            intruder.append("committed")
        except sqlite3.OperationalError as e:
            intruder.append(str(e))
        finally:
            other.close()

    def before(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if "CREATE TABLE alembic_version" in statement and not intruder:
            t = threading.Thread(target=other_writer)
            t.start()
            t.join(30)

    event.listen(store.engine, "before_cursor_execute", before)
    try:
        migrate.upgrade(store.engine)
        assert migrate.current_revision(store.engine) == migrate.head_revision()
    finally:
        event.remove(store.engine, "before_cursor_execute", before)
        store.close()
    assert intruder == ["database is locked"]  # it waited for the upgrade's lock and gave up


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
    settings = Settings(database_url=sqlite_url, write_token="test-write-token-0123456789")
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
    old = SqlStore(url)  # an older schema (a new, empty file is created instead: test_serve_schema.py)
    migrate.upgrade(old.engine, "0001_initial")
    old.close()
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


def test_0005_moves_existing_points_into_chunks_and_back(db_url: str) -> None:
    """Points stored before revision 0005 read the same after it, and after a downgrade back."""
    store = SqlStore(db_url)
    try:
        migrate.upgrade(store.engine, "0004_alert_source")
        dense = [(0, s, s * 10, [None, math.inf, -math.inf, 0.5 * s][s % 4]) for s in range(100)]
        sparse = [(1, s, None, float(s)) for s in (0, 5, 40, 41, 300)]  # and no series_latest row
        with store.engine.begin() as conn:
            conn.execute(text("INSERT INTO projects (id, name, created_at) VALUES (1, 'p', CURRENT_TIMESTAMP)"))
            conn.execute(
                text(
                    "INSERT INTO runs (id, project_id, name, status, config, summary, export_layers, created_at, "
                    "updated_at) VALUES (1, 1, 'r', 'running', '{}', '{}', false, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )
            conn.execute(text("INSERT INTO metric_names (id, name) VALUES (1, 'loss')"))
            conn.execute(
                text("INSERT INTO metric_points VALUES (1, 1, :la, :s, :t, :v)"),
                [{"la": la, "s": s, "t": t, "v": v} for la, s, t, v in dense + sparse],
            )
            conn.execute(text("INSERT INTO series_latest VALUES (1, 1, 0, 99, 49.5)"))
        want = sorted((1, 1, la, s, t, v) for la, s, t, v in dense + sparse)

        migrate.upgrade(store.engine, "0005_metric_chunks")
        with store.engine.connect() as conn:
            hot = conn.execute(text("SELECT layer, step FROM metric_points ORDER BY 1, 2")).all()
            if store.engine.dialect.name == "sqlite":
                assert len(hot) == len(want)  # SQLite kept one row per point until 0006
            assert conn.execute(text("SELECT step FROM series_latest WHERE layer = 1")).scalar() == 300
        migrate.upgrade(store.engine)
        with store.engine.connect() as conn:
            assert chunks.all_points(conn) == want
            hot = conn.execute(text("SELECT layer, step FROM metric_points ORDER BY 1, 2")).all()
            assert hot == [(0, 96), (0, 97), (0, 98), (0, 99), (1, 300)]  # the rest is chunked, on both
        read = store.series(1, "loss", 0, 1000, None, None).points
        assert [(p.step, p.tokens) for p in read] == [(s, t) for _la, s, t, _v in dense]
        assert math.isnan(read[0].value) and read[1].value == math.inf and read[2].value == -math.inf
        store.ingest(1, "after-0005", [Point("loss", 100, 7.0, layer=0, tokens=1000)])  # writes go on

        migrate.downgrade(store.engine, "0004_alert_source")
        assert "metric_chunks" not in inspect(store.engine).get_table_names()
        with store.engine.connect() as conn:
            back = conn.execute(text("SELECT * FROM metric_points ORDER BY 1, 2, 3, 4")).all()
        assert [tuple(r) for r in back] == sorted([*want, (1, 1, 0, 100, 1000, 7.0)])
        migrate.upgrade(store.engine)
        with store.engine.connect() as conn:
            assert chunks.all_points(conn) == sorted([*want, (1, 1, 0, 100, 1000, 7.0)])
    finally:
        store.close()


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_migration_benchmark_round_trip_keeps_every_point(database: str) -> None:
    """The short version of ``bench/migration.py``: a database filled at head, down to 0005 and up
    again, reads back every point, NaN included (the script exits 1 otherwise)."""
    args = [sys.executable, str(REPO / "bench" / "migration.py"), "--steps", "40"]
    done = subprocess.run(args + (["--pg"] if database == "postgresql" else []), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "20,480 of 20,480, identical: True" in done.stdout
