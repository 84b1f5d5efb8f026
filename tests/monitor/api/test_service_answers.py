"""Issue 25, item 4: answers that were untrue or blamed the wrong side.

Ids beyond the integer range are unknown ids (404, not a 422 on the request's value); a database
at a newer schema is told that the service is older (not to run ``db upgrade``); a full disk is a
503 saying so, with ``/readyz`` not ready; weak write tokens are refused outside dev mode.
"""

from __future__ import annotations

import sqlite3

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from pydantic import ValidationError
from sqlalchemy import event, text

from hyperwatch.monitor.api.app import create_app
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.core.errors import SchemaOutOfDateError
from hyperwatch.monitor.store import SqlStore, migrate
from tests.monitor.conftest import AUTH, WRITE_TOKEN, create_run, make_client, post_points

BEYOND = [2**31, 2**63, 10**30, -(2**31) - 1]


@pytest.mark.parametrize("value", BEYOND)
def test_ids_beyond_the_integer_range_are_unknown(client: TestClient, value: int) -> None:
    for path in (f"/api/v1/runs/{value}", f"/api/v1/runs/{value}/series", f"/api/v1/groups/{value}"):
        r = client.get(path)
        assert r.status_code == 404, (path, r.status_code, r.text)
        assert str(value) in r.json()["detail"]
    r = client.patch(f"/api/v1/runs/{value}", json={"status": "finished"}, headers=AUTH)
    assert r.status_code == 404, r.text
    assert client.get("/api/v1/runs/2147483647").status_code == 404  # the largest id: an ordinary miss
    assert client.get("/api/v1/runs/x").status_code == 422  # not a number: the route's own validation
    for odd in ("\u00b2", "\u0663", "1\u00b2"):  # "²" passes str.isdigit(), "٣" int(): neither is an id here
        assert client.get(f"/api/v1/runs/{odd}/series").status_code == 422, odd


@pytest.mark.parametrize("value", BEYOND)
def test_query_ids_beyond_the_integer_range_are_unknown(client: TestClient, value: int) -> None:
    create_run(client, "r")
    for path in (
        f"/api/v1/alerts?run_id={value}",
        f"/api/v1/incidents?group_id={value}",
        f"/api/v1/compare?run_id=1&run_id={value}&name=loss",
        f"/api/v1/compare?group_id={value}&name=loss",
    ):
        r = client.get(path)
        assert r.status_code == 404, (path, r.status_code, r.text)
        assert str(value) in r.json()["detail"] and "at most 2147483647" in r.json()["detail"]
    assert client.get("/api/v1/alerts?run_id=2147483647").json() == []  # in range, unknown: the filter's answer
    assert client.get("/api/v1/compare?run_id=2147483647&name=loss").status_code == 404  # the lookup's answer


def test_a_newer_schema_is_told_the_service_is_older(store: SqlStore) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999_from_the_future'"))
    settings = Settings(database_url=store.engine.url.render_as_string(hide_password=False), write_token=WRITE_TOKEN)
    with pytest.raises(SchemaOutOfDateError, match="newer than this version of hyperwatch") as info:
        create_app(settings, store=store, registry=CollectorRegistry())
    assert "9999_from_the_future" in str(info.value) and "db downgrade" in str(info.value)
    assert "db upgrade" not in str(info.value)
    client = make_client(store, check_schema=False)
    r = client.get("/readyz")
    assert r.status_code == 503 and "newer" in r.json()["detail"]


def test_an_older_schema_is_still_told_to_upgrade(sqlite_url: str) -> None:
    store = SqlStore(sqlite_url)
    migrate.upgrade(store.engine, "0001_initial")
    try:
        with pytest.raises(SchemaOutOfDateError, match="hyperwatch db upgrade"):
            create_app(Settings(database_url=sqlite_url, write_token=WRITE_TOKEN), store=store)
    finally:
        store.close()


def _limit_size(dbapi_conn: sqlite3.Connection, _record: object) -> None:
    # SQLite's own size limit: a write that needs one more page fails with SQLITE_FULL, as on a full disk.
    pages = dbapi_conn.execute("PRAGMA page_count").fetchone()[0]
    dbapi_conn.execute(f"PRAGMA max_page_count = {pages}")


def _assert_full_then_recovers(client: TestClient, store: SqlStore, fill: object, free: object) -> None:
    """With the disk full (``fill()``): 503 saying so, Retry-After, /readyz not ready, nothing of the
    batch stored. With space again (``free()``): the same batch goes through and /readyz is ready."""
    create_run(client, "r")
    post_points(client, "r", [{"name": "loss", "layer": None, "step": 0, "value": 1.0}])
    assert client.get("/readyz").status_code == 200
    points = [{"name": f"user.n{i}", "layer": None, "step": s, "value": 1.0} for i in range(50) for s in range(40)]
    body = {"batch_id": "disk-full-batch", "run": "r", "points": points}
    fill()  # type: ignore[operator]
    try:
        r = client.post("/api/v1/points", json=body, headers=AUTH)
        assert r.status_code == 503, r.text
        detail = r.json()["detail"]
        assert "disk is full" in detail and "nothing of this request was stored" in detail
        assert "schema is current" not in detail
        assert int(r.headers["Retry-After"]) > 0
        ready = client.get("/readyz")
        assert ready.status_code == 503 and "disk is full" in ready.json()["detail"]
    finally:
        free()  # type: ignore[operator]
    with store.engine.connect() as conn:
        stored = conn.execute(text("SELECT COUNT(*) FROM ingested_batches WHERE batch_id = 'disk-full-batch'"))
        assert stored.scalar() == 0
    r = client.post("/api/v1/points", json=body, headers=AUTH)
    assert r.status_code in (200, 201), r.text
    assert client.get("/readyz").status_code == 200


def test_a_full_disk_is_a_503_saying_so_and_readyz_is_not_ready(sqlite_store: SqlStore) -> None:
    def fill() -> None:
        event.listen(sqlite_store.engine, "connect", _limit_size)
        sqlite_store.engine.dispose()

    def free() -> None:
        event.remove(sqlite_store.engine, "connect", _limit_size)
        sqlite_store.engine.dispose()

    _assert_full_then_recovers(make_client(sqlite_store), sqlite_store, fill, free)


# PostgreSQL's own error for a full disk: SQLSTATE 53100 (disk_full), as it raises when a write cannot
# extend a relation file ("could not extend file ...: No space left on device"). Raised by the server
# from a trigger on the first table a batch writes, so it reaches the service through psycopg as on a
# real full volume (a tablespace on a tiny mount would need the server's host and root).
_PG_FULL = """
CREATE FUNCTION hw_test_disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'could not extend file "base/1/2": No space left on device'
        USING ERRCODE = 'disk_full', HINT = 'Check free disk space.';
END $$;
CREATE TRIGGER hw_test_disk_full BEFORE INSERT ON ingested_batches FOR EACH ROW EXECUTE FUNCTION hw_test_disk_full();
"""


def test_a_full_disk_on_postgresql_is_a_503_saying_so(pg_store: SqlStore) -> None:
    def fill() -> None:
        with pg_store.engine.begin() as conn:
            conn.exec_driver_sql(_PG_FULL)

    def free() -> None:
        with pg_store.engine.begin() as conn:
            conn.exec_driver_sql(
                "DROP TRIGGER hw_test_disk_full ON ingested_batches; DROP FUNCTION hw_test_disk_full()"
            )

    _assert_full_then_recovers(make_client(pg_store), pg_store, fill, free)


@pytest.mark.parametrize(
    ("token", "why"),
    [
        ("aaaaaaaaaaaaaaaa", "distinct characters"),
        ("abababababababababab", "distinct characters"),
        (" " * 20 + "x", "whitespace"),
        ("a-real-secret-with a-space", "whitespace"),
        ("s3cr3t-t0k3n", "shorter than 16"),
        ("changethis", "placeholder"),
    ],
)
def test_weak_write_tokens_are_refused_outside_dev_mode(token: str, why: str) -> None:
    with pytest.raises(ValidationError, match=f"HYPERWATCH_WRITE_TOKEN .*{why}.*secrets.token_urlsafe"):
        Settings(write_token=token)
    with pytest.raises(ValidationError, match=f"HYPERWATCH_READ_TOKEN .*{why}"):
        Settings(write_token=WRITE_TOKEN, read_token=token)
    assert Settings(write_token=token, dev_mode=True).dev_mode  # dev mode: local use, any token


def test_random_tokens_pass() -> None:
    import secrets

    for _ in range(200):
        assert Settings(write_token=secrets.token_urlsafe(32), read_token=secrets.token_hex(8)).write_token


def test_a_422_from_the_service_has_the_schemas_detail_list(client: TestClient) -> None:
    """The OpenAPI schema declares every 422 as HTTPValidationError: ``detail`` a list of errors.
    The service's own 422s (a value the data does not allow) keep that shape; the words are also in
    ``message``, as for the validation 422s."""
    run = create_run(client, "bare")
    post_points(client, "bare", [{"name": "loss", "layer": None, "step": 1, "value": 3.0}])
    r = client.get("/api/v1/compare", params={"name": "loss", "x": "flops", "run_id": str(run["id"])})
    assert r.status_code == 422
    body = r.json()
    assert isinstance(body["detail"], list) and len(body["detail"]) == 1
    (error,) = body["detail"]
    assert error["loc"] == ["query"] and error["type"] == "invalid_input"
    assert "bare" in error["msg"] and error["msg"] == body["message"]
    schema = client.get("/openapi.json").json()
    declared = schema["components"]["schemas"]["HTTPValidationError"]["properties"]["detail"]
    assert declared["type"] == "array"
    points = [{"name": "loss", "layer": None, "step": s, "value": 1.0} for s in range(11)]
    limited = make_client(client.app.state.store, max_points_per_batch=10)  # type: ignore[attr-defined]
    r = limited.post("/api/v1/points", json={"batch_id": "batch-0422", "run": "bare", "points": points}, headers=AUTH)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body"], r.text
