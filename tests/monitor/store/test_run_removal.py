"""Deleting and archiving runs (issue 35): the API with the write token, the store's counts, migration 0012.

Every test runs on SQLite and on PostgreSQL (``store`` / ``client`` / ``db_url``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import inspect, text

from hyperwatch.hooks.columns import PointColumns
from hyperwatch.monitor.read.lines import group_runs
from hyperwatch.monitor.store import SqlStore, migrate
from hyperwatch.monitor.store.entities import NewAlert
from hyperwatch.monitor.store.removal import OWNED, referencing_tables
from tests.monitor.conftest import AUTH, create_run, post_points

TABLES = [row.__tablename__ for row in OWNED]


def _count(store: SqlStore, sql: str, **params: object) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text(sql), params).scalar() or 0)


def _rows_of(store: SqlStore, run_id: int) -> dict[str, int]:
    return {t: _count(store, f"SELECT count(*) FROM {t} WHERE run_id = :r", r=run_id) for t in TABLES}


def _fill(client: TestClient, store: SqlStore, name: str, steps: int = 40) -> int:
    """A run with sealed chunks, rollups, hot points (pending batches on PostgreSQL), alerts and tags."""
    run = create_run(client, name, group="g", tags=["smoke"])
    for step in range(steps):
        points: list[dict[str, object]] = [{"name": "loss", "layer": None, "step": step, "value": 1.0 + step}]
        points += [{"name": "attention_z", "layer": la, "step": step, "value": 2.0} for la in (0, 1)]
        post_points(client, name, points)
    run_id = int(run["id"])  # type: ignore[call-overload]
    store.add_alerts(run_id, [NewAlert("nan", "critical", "loss", None, 3, float("nan"), None, "NaN loss")])
    return run_id


def test_every_table_that_references_runs_is_deleted_from() -> None:
    assert set(TABLES) == referencing_tables()


def test_delete_removes_the_run_and_all_it_owns_and_keeps_the_counts(client: TestClient, store: SqlStore) -> None:
    gone, kept = _fill(client, store, "test-run"), _fill(client, store, "real-run", steps=20)
    before = _rows_of(store, gone)
    assert all(before[t] > 0 for t in ("open_chunks", "series_latest", "alert_events", "incidents")), (
        before
    )  # 40 steps seal no rollup block (1,024 steps, revision 0014) and no range: metric_rollups and
    # metric_chunks are in TABLES still
    assert _count(store, "SELECT series_count FROM projects") == 6
    kept_rows = _rows_of(store, kept)

    assert client.delete(f"/api/v1/runs/{gone}").status_code == 401
    assert client.delete(f"/api/v1/runs/{gone}", headers={"Authorization": "Bearer nope"}).status_code == 403
    r = client.delete(f"/api/v1/runs/{gone}", headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json() == {"id": gone, "project": "default", "name": "test-run", "series": 3}

    assert _rows_of(store, gone) == dict.fromkeys(TABLES, 0)
    assert _count(store, "SELECT count(*) FROM runs WHERE id = :r", r=gone) == 0
    assert _rows_of(store, kept) == kept_rows
    assert _count(store, "SELECT series_count FROM projects") == 3  # only the kept run's series
    assert client.get(f"/api/v1/runs/{gone}").status_code == 404
    assert client.delete(f"/api/v1/runs/{gone}", headers=AUTH).status_code == 404
    assert [a["run"] for a in client.get("/api/v1/alerts").json()] == ["real-run"]
    # the name is free again, and a new run of it starts empty
    create_run(client, "test-run")
    post_points(client, "test-run", [{"name": "loss", "layer": None, "step": 0, "value": 1.0}])
    assert _count(store, "SELECT series_count FROM projects") == 4


def test_delete_waits_for_an_ingest_of_the_run_and_removes_what_it_stored(client: TestClient, store: SqlStore) -> None:
    run_id = int(create_run(client, "racing")["id"])  # type: ignore[call-overload]
    inside, release = threading.Event(), threading.Event()

    def detector(_reader: Any) -> Sequence[NewAlert]:
        inside.set()  # the batch holds the run's row, its points written, not committed
        assert release.wait(30)
        return [NewAlert("spike", "warning", "loss", None, 1, 9.0, 1.0, "spike")]

    batch = PointColumns.build(["loss", "grad_norm"], [1, 1], [1.0, 2.0], [None, None], [None, None])
    ingest = threading.Thread(target=store.ingest, args=(run_id, "b-racing", batch, detector))
    ingest.start()
    assert inside.wait(30)
    done: list[Any] = []
    deleter = threading.Thread(target=lambda: done.append(store.delete_run(run_id)))
    deleter.start()
    time.sleep(0.5)
    assert not done, "the delete did not wait for the run's row"
    release.set()
    ingest.join(30)
    deleter.join(30)
    assert done == [("default", "racing", 2)]
    assert _rows_of(store, run_id) == dict.fromkeys(TABLES, 0)
    assert _count(store, "SELECT series_count FROM projects") == 0


def test_archive_hides_the_run_from_lists_scale_and_alerts_until_unarchived(
    client: TestClient, store: SqlStore
) -> None:
    test_id, real_id = _fill(client, store, "test-run", steps=3), _fill(client, store, "real-run", steps=3)

    assert client.patch(f"/api/v1/runs/{test_id}", json={"archived": True}).status_code == 401
    r = client.patch(f"/api/v1/runs/{test_id}", json={"archived": True}, headers=AUTH)
    assert r.status_code == 200 and r.json()["archived"] is True
    assert client.patch(f"/api/v1/runs/{test_id}", json={"archived": None}, headers=AUTH).status_code == 422

    def names(**params: str) -> list[str]:
        got = client.get("/api/v1/runs", params=params)
        assert got.status_code == 200, got.text
        return [run["name"] for run in got.json()]

    assert names() == ["real-run"]
    assert names(group="g") == ["real-run"]
    assert names(archived="true") == ["test-run"]
    assert names(include_archived="true") == ["test-run", "real-run"]
    group_id = int(client.get(f"/api/v1/runs/{real_id}").json()["group_id"])
    assert [run.name for run in group_runs(store, group_id)[1]] == ["real-run"]  # the scale comparison
    assert [a["run"] for a in client.get("/api/v1/alerts").json()] == ["real-run"]
    assert [a["run"] for a in client.get("/api/v1/alerts", params={"run_id": test_id}).json()] == ["test-run"]
    assert {i["run"] for i in client.get("/api/v1/incidents").json()} <= {"real-run"}
    assert client.get(f"/api/v1/runs/{test_id}").json()["archived"] is True  # still readable by id
    # archiving keeps everything; a hooks process re-posting the run does not unarchive it
    assert _rows_of(store, test_id)["series_latest"] == 3
    create_run(client, "test-run", status="finished")
    assert names(archived="true") == ["test-run"]

    r = client.patch(f"/api/v1/runs/{test_id}", json={"archived": False}, headers=AUTH)
    assert r.status_code == 200 and r.json()["archived"] is False
    assert names() == ["test-run", "real-run"]
    assert [run.name for run in group_runs(store, group_id)[1]] == ["test-run", "real-run"]


def test_migration_0012_adds_archived_and_goes_back(db_url: str) -> None:
    store = SqlStore(db_url)
    try:
        migrate.upgrade(store.engine, "0011_series_counts")
        with store.engine.begin() as conn:
            conn.execute(text("INSERT INTO projects (id, name, created_at) VALUES (1, 'p', CURRENT_TIMESTAMP)"))
            conn.execute(
                text(
                    "INSERT INTO runs (id, project_id, name, status, config, summary, export_layers, created_at, "
                    "updated_at) VALUES (1, 1, 'old', 'finished', '{}', '{}', false, CURRENT_TIMESTAMP, "
                    "CURRENT_TIMESTAMP)"
                )
            )
        migrate.upgrade(store.engine)
        assert [r.name for r in store.list_runs()] == ["old"]  # an existing run is not archived
        store.update_run(1, {"archived": True})
        assert store.list_runs() == [] and [r.name for r in store.list_runs(archived=True)] == ["old"]
        migrate.downgrade(store.engine, "0011_series_counts")
        with store.engine.connect() as conn:
            assert "archived" not in {c["name"] for c in inspect(conn).get_columns("runs")}
            assert conn.execute(text("SELECT count(*) FROM runs")).scalar() == 1
        migrate.upgrade(store.engine)
        assert [r.name for r in store.list_runs()] == ["old"]
    finally:
        store.close()
