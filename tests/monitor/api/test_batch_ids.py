"""Batch ids are idempotency keys per run (issue 25): the same id for a second run is a new batch."""

from __future__ import annotations

from alembic.script import ScriptDirectory
from sqlalchemy import text

from hyperwatch.monitor.store import SqlStore, migrate
from tests.monitor.conftest import AUTH, create_run, make_client


def _send(client: object, run: str, batch_id: str, value: float) -> dict[str, object]:
    body = {"batch_id": batch_id, "run": run, "points": [{"name": "loss", "step": 0, "value": value}]}
    r = client.post("/api/v1/points", json=body, headers=AUTH)  # type: ignore[attr-defined]
    assert r.status_code in (200, 201), r.text
    out: dict[str, object] = r.json()
    return out


def test_the_same_batch_id_for_a_second_run_is_stored(store: SqlStore) -> None:
    client = make_client(store)
    a, b = int(create_run(client, "a")["id"]), int(create_run(client, "b")["id"])  # type: ignore[call-overload]
    assert _send(client, "a", "same-id-0001", 1.0)["duplicate"] is False
    second = _send(client, "b", "same-id-0001", 2.0)
    assert second["duplicate"] is False and second["run_id"] == b and second["accepted"] == 1
    again = _send(client, "b", "same-id-0001", 3.0)  # a resend to the same run: nothing written
    assert again["duplicate"] is True and again["run_id"] == b
    assert [p.value for p in store.series(a, "loss", None, 100, None, None).points] == [1.0]
    assert [p.value for p in store.series(b, "loss", None, 100, None, None).points] == [2.0]


def test_0007_keeps_batch_records_and_downgrade_keeps_one_per_id(db_url: str) -> None:
    before = ScriptDirectory.from_config(migrate.alembic_config()).get_revision("0007_metric_name_ids").down_revision
    assert isinstance(before, str)
    store = SqlStore(db_url)
    try:
        migrate.upgrade(store.engine, before)
        with store.engine.begin() as conn:
            conn.execute(text("INSERT INTO projects (id, name, created_at) VALUES (1, 'p', CURRENT_TIMESTAMP)"))
            for run in (1, 2):
                conn.execute(
                    text(
                        "INSERT INTO runs (id, project_id, name, status, config, summary, export_layers, created_at, "
                        "updated_at) VALUES (:r, 1, :n, 'running', '{}', '{}', false, CURRENT_TIMESTAMP, "
                        "CURRENT_TIMESTAMP)"
                    ),
                    {"r": run, "n": f"r{run}"},
                )
            conn.execute(
                text("INSERT INTO ingested_batches VALUES ('old-batch-1', 1, 7, CURRENT_TIMESTAMP)"),
            )
        migrate.upgrade(store.engine, "0007_metric_name_ids")  # its text ids; 0017 turns them into keys
        with store.engine.begin() as conn:
            conn.execute(text("INSERT INTO ingested_batches VALUES ('old-batch-1', 2, 9, CURRENT_TIMESTAMP)"))
            rows = conn.execute(text("SELECT batch_id, run_id, n_points FROM ingested_batches ORDER BY 2")).all()
        assert [tuple(r) for r in rows] == [("old-batch-1", 1, 7), ("old-batch-1", 2, 9)]
        migrate.downgrade(store.engine, before)
        with store.engine.connect() as conn:
            rows = conn.execute(text("SELECT batch_id, run_id, n_points FROM ingested_batches")).all()
        assert [tuple(r) for r in rows] == [("old-batch-1", 1, 7)]
        migrate.upgrade(store.engine, "0007_metric_name_ids")
        with store.engine.connect() as conn:
            rows = conn.execute(text("SELECT batch_id, run_id, n_points FROM ingested_batches")).all()
        assert [tuple(r) for r in rows] == [("old-batch-1", 1, 7)]
    finally:
        store.close()
