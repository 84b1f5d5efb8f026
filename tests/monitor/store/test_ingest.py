"""Batch ingestion: idempotency, unknown runs, limits, field errors, NaN/Inf faithfully stored."""

from __future__ import annotations

import json
import math
import random
import sqlite3
import threading

from fastapi.testclient import TestClient
from sqlalchemy import text

from hyperwatch.hooks.schema import MAX_POINTS_PER_BATCH, Batch, Point
from hyperwatch.monitor.store import SqlStore, chunks
from hyperwatch.monitor.store.models import hot_relation
from tests.monitor.conftest import AUTH, create_run, make_client, post_points


def _values(client: TestClient, run_id: int, name: str, layer: int | None = None) -> dict[int, object]:
    params: dict[str, str | int] = {"name": name}
    if layer is not None:
        params["layer"] = layer
    r = client.get(f"/api/v1/runs/{run_id}/series", params=params)
    assert r.status_code == 200, r.text
    return {p["step"]: p["value"] for p in r.json()["points"]}


def test_ingest_is_idempotent_by_batch_and_by_key(client: TestClient) -> None:
    run = create_run(client)
    pts = [{"name": "loss", "step": s, "tokens": s * 10, "value": 3.0 - s / 100} for s in range(5)]
    first = client.post("/api/v1/points", json={"batch_id": "batch-0001", "run": "r1", "points": pts}, headers=AUTH)
    assert first.status_code == 201
    assert first.json()["accepted"] == 5 and first.json()["duplicate"] is False
    again = client.post("/api/v1/points", json={"batch_id": "batch-0001", "run": "r1", "points": pts}, headers=AUTH)
    assert again.status_code == 200
    assert again.json() == {"accepted": 5, "duplicate": True, "run_id": run["id"], "alerts": 0}
    # Same keys under a new batch id: stored once, last write wins.
    post_points(client, "r1", [{"name": "loss", "step": 2, "tokens": 20, "value": 9.5}])
    values = _values(client, int(run["id"]), "loss")  # type: ignore[call-overload]
    assert len(values) == 5
    assert values[2] == 9.5
    # Within one batch the last occurrence wins too.
    post_points(client, "r1", [{"name": "loss", "step": 3, "value": 1.0}, {"name": "loss", "step": 3, "value": 2.0}])
    assert _values(client, int(run["id"]), "loss")[3] == 2.0  # type: ignore[call-overload]


def test_hooks_batch_json_is_the_body(client: TestClient) -> None:
    run = create_run(client, "wire-run")
    batch = Batch("wire-run", [Point("attention_z", 7, 12.5, layer=2, tokens=700), Point("loss", 7, math.nan)])
    r = client.post(
        "/api/v1/points", content=json.dumps(batch.to_json()), headers={**AUTH, "Content-Type": "application/json"}
    )
    assert r.status_code == 201, r.text
    assert _values(client, int(run["id"]), "attention_z", 2) == {7: 12.5}  # type: ignore[call-overload]
    assert _values(client, int(run["id"]), "loss") == {7: "NaN"}  # type: ignore[call-overload]


def test_unknown_run_is_404_naming_the_fix(client: TestClient) -> None:
    r = client.post("/api/v1/points", json={"batch_id": "batch-0002", "run": "ghost", "points": []}, headers=AUTH)
    assert r.status_code == 404
    assert "ghost" in r.json()["detail"] and "POST /api/v1/runs" in r.json()["detail"]
    create_run(client, "ghost", project="other")
    r = client.post(
        "/api/v1/points?project=other", json={"batch_id": "batch-0003", "run": "ghost", "points": []}, headers=AUTH
    )
    assert r.status_code == 201


def test_field_errors_are_422_naming_the_field(client: TestClient) -> None:
    create_run(client)
    bad = [
        ({"name": "not_a_metric", "step": 1, "value": 1.0}, "name"),
        ({"name": "loss", "step": -1, "value": 1.0}, "step"),
        ({"name": "loss", "step": 1, "value": "nan"}, "value"),
        ({"name": "loss", "step": 1, "value": True}, "value"),
        ({"name": "attention_z", "layer": 5000, "step": 1, "value": 1.0}, "layer"),
        ({"name": "loss", "step": 1, "value": 1.0, "extra": 1}, "extra"),
    ]
    for point, field in bad:
        r = client.post("/api/v1/points", json={"batch_id": "batch-0004", "run": "r1", "points": [point]}, headers=AUTH)
        assert r.status_code == 422, (point, r.text)
        assert f"points.0.{field}" in r.json()["message"], r.json()
    r = client.post("/api/v1/points", json={"batch_id": "short", "run": "r1", "points": []}, headers=AUTH)
    assert r.status_code == 422 and "batch_id" in r.json()["message"]


def test_limits_413_and_422(store: SqlStore) -> None:
    client = make_client(store, max_body_bytes=4096, max_points_per_batch=10)
    create_run(client)
    pts = [{"name": "loss", "step": s, "value": 1.0} for s in range(11)]
    r = client.post("/api/v1/points", json={"batch_id": "batch-0005", "run": "r1", "points": pts}, headers=AUTH)
    assert r.status_code == 422
    assert "limit is 10" in r.json()["message"]
    big = {"batch_id": "batch-0006", "run": "r1", "points": [{"name": "loss", "step": 1, "value": 1.0}] * 200}
    r = client.post("/api/v1/points", json=big, headers=AUTH)
    assert r.status_code == 413
    assert "HYPERWATCH_MAX_BODY_BYTES" in r.json()["detail"]

    def chunks():  # no Content-Length: the streamed size is counted
        payload = json.dumps(big).encode()
        for i in range(0, len(payload), 1000):
            yield payload[i : i + 1000]

    r = client.post("/api/v1/points", content=chunks(), headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 413
    # The wire format's own ceiling is enforced too.
    huge = {
        "batch_id": "batch-0007",
        "run": "r1",
        "points": [{"name": "loss", "step": 1, "value": 1}] * (MAX_POINTS_PER_BATCH + 1),
    }
    r = make_client(store).post("/api/v1/points", json=huge, headers=AUTH)
    assert r.status_code == 422 and "points" in r.json()["message"]


def test_nonfinite_round_trip_http_and_sql(store: SqlStore, client: TestClient) -> None:
    run = create_run(client, summary={"val_loss": "NaN", "best": "-Infinity"})
    assert run["summary"] == {"val_loss": "NaN", "best": "-Infinity"}
    sent = {1: "NaN", 2: "Infinity", 3: "-Infinity", 4: 1.5e308, 5: -0.0, 6: 5e-324}
    post_points(client, "r1", [{"name": "loss", "step": s, "value": v} for s, v in sent.items()])
    assert _values(client, int(run["id"]), "loss") == sent  # type: ignore[call-overload]
    # In SQL: +-Inf as IEEE values, NaN as NULL (the documented encoding), nothing else NULL.
    with store.engine.connect() as conn:
        # hot points as the reads see them (PostgreSQL: rows and pending batches, see store.pending)
        sql = text(f"SELECT step, value FROM {hot_relation(store.engine.dialect.name)} ORDER BY step")
        rows: dict[int, float | None] = dict(conn.execute(sql).all())
    assert rows[1] is None
    assert rows[2] == math.inf and rows[3] == -math.inf and rows[4] == 1.5e308
    # Through the store API the values are real IEEE floats again.
    got = {p.step: p.value for p in store.series(int(run["id"]), "loss", None, 100, None, None).points}  # type: ignore[call-overload]
    assert math.isnan(got[1]) and got[2] == math.inf and got[3] == -math.inf


def test_sqlite_really_loses_nan_in_real_columns(tmp_path: object) -> None:
    """Why NaN is stored as NULL: SQLite itself turns a bound NaN into NULL."""
    con = sqlite3.connect(f"{tmp_path}/raw.db")
    con.execute("CREATE TABLE t (v REAL)")
    con.execute("INSERT INTO t VALUES (?)", (math.nan,))
    con.execute("INSERT INTO t VALUES (?)", (math.inf,))
    assert [r[0] for r in con.execute("SELECT v FROM t")] == [None, math.inf]
    con.close()


def test_concurrent_writers_on_sqlite(sqlite_store: SqlStore) -> None:
    """Several training processes posting at once: every batch lands (writers queue, none fail)."""
    run, _ = sqlite_store.upsert_run("default", "busy", {})
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        try:
            for i in range(5):
                pts = [Point("attention_z", 100 * k + i, float(k), layer=layer) for layer in range(8)]
                sqlite_store.ingest(run.id, f"w{k}-batch-{i:04d}", pts)
        except BaseException as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with sqlite_store.engine.connect() as conn:
        assert len(chunks.all_points(conn)) == 6 * 5 * 8  # hot rows and chunked points
        assert conn.execute(text("SELECT count(*) FROM ingested_batches")).scalar() == 30


def test_integer_beyond_double_range_is_infinity_not_500(client: TestClient) -> None:
    """Issue 14 item 3: 10**400 as a JSON integer is +Infinity (as 1e400 is), -10**400 is -Infinity."""
    run = create_run(client, "huge")
    big = "1" + "0" * 400
    for step_text, batch_id in (("1", "huge-fast-1"), ("2.0", "huge-slow-2")):  # fast parser, then BatchIn
        body = (
            f'{{"batch_id": "{batch_id}", "run": "huge", "points": ['
            f'{{"name": "attention_z", "layer": 0, "step": {step_text}, "value": {big}}}, '
            f'{{"name": "attention_z", "layer": 1, "step": {step_text}, "value": -{big}}}]}}'
        )
        r = client.post("/api/v1/points", content=body, headers={**AUTH, "Content-Type": "application/json"})
        assert r.status_code == 201, r.text
        assert r.json()["alerts"] == 2  # nonfinite_value, stored with the points
    for layer, want in ((0, "Infinity"), (1, "-Infinity")):
        r = client.get(f"/api/v1/runs/{run['id']}/series", params={"name": "attention_z", "layer": layer})
        assert r.status_code == 200, r.text
        assert [p["value"] for p in r.json()["points"]] == [want, want]


def test_values_stored_bit_exact_by_copy_and_by_upsert(store: SqlStore) -> None:
    """Every float lands bit-exact in ``metric_points`` and ``series_latest``, whether its step is new
    (COPY on PostgreSQL) or re-sent (the upsert, whose numeric arrays travel as text literals)."""
    rng = random.Random(16)
    run, _ = store.upsert_run("default", "exact", {})
    special = [math.inf, -math.inf, -0.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 0.1]
    for attempt in range(2):  # the second send re-sends every step with other values: last write wins
        vals = special + [rng.uniform(-1, 1) * 10 ** rng.randint(-300, 300) for _ in range(200)]
        pts = [Point("attention_z", s, v, layer=s % 3) for s, v in enumerate(vals)]
        store.ingest(run.id, f"exact-{attempt}", pts)
        got = {
            p.step: p.value for la in range(3) for p in store.series(run.id, "attention_z", la, 1000, None, None).points
        }
        with store.engine.connect() as conn:
            latest = conn.execute(
                text("SELECT layer, step, value FROM series_latest WHERE run_id = :r ORDER BY layer"), {"r": run.id}
            ).all()
        assert got == dict(enumerate(vals))
        last = {la: max(s for s in range(len(vals)) if s % 3 == la) for la in range(3)}
        assert [tuple(r) for r in latest] == [(la, last[la], vals[last[la]]) for la in range(3)]
    # a late re-send of early steps changes those points but not the series' latest step and value
    store.ingest(run.id, "exact-late", [Point("attention_z", s, -1.0, layer=s % 3) for s in range(6)])
    with store.engine.connect() as conn:
        sql = text("SELECT layer, step, value FROM series_latest WHERE run_id = :r ORDER BY layer")
        assert [tuple(r) for r in conn.execute(sql, {"r": run.id}).all()] == [tuple(r) for r in latest]
