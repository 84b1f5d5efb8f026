"""Bearer tokens for writes (and optionally reads), placeholder secrets, CORS closed by default."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.store import SqlStore
from tests.monitor.conftest import AUTH, READ_TOKEN, WRITE_TOKEN, make_client

BATCH = {"batch_id": "batch-auth-1", "run": "r1", "points": [{"name": "loss", "step": 1, "value": 1.0}]}


def test_writes_need_the_write_token(sqlite_store: SqlStore) -> None:
    client = make_client(sqlite_store)
    r = client.post("/api/v1/runs", json={"name": "r1"})
    assert r.status_code == 401 and "HYPERWATCH_WRITE_TOKEN" in r.json()["detail"]
    r = client.post("/api/v1/runs", json={"name": "r1"}, headers={"Authorization": "Bearer wrong-token-xxxxxxxx"})
    assert r.status_code == 403
    assert client.post("/api/v1/runs", json={"name": "r1"}, headers=AUTH).status_code == 201
    assert client.post("/api/v1/points", json=BATCH).status_code == 401
    assert client.patch("/api/v1/runs/1", json={"status": "finished"}).status_code == 401
    assert client.post("/api/v1/points", json=BATCH, headers=AUTH).status_code == 201
    # Nothing was written by the refused calls.
    assert client.get("/api/v1/runs/1").json()["status"] == "running"
    # Reads are open without a read token.
    assert client.get("/api/v1/runs").status_code == 200


def test_read_token_guards_reads(sqlite_store: SqlStore) -> None:
    client = make_client(sqlite_store, read_token=READ_TOKEN)
    assert client.get("/api/v1/runs").status_code == 401
    assert client.get("/metrics").status_code == 401
    assert client.get("/api/v1/runs", headers={"Authorization": "Bearer nope-nope-nope-nope"}).status_code == 403
    assert client.get("/api/v1/runs", headers={"Authorization": f"Bearer {READ_TOKEN}"}).status_code == 200
    assert client.get("/api/v1/runs", headers=AUTH).status_code == 200  # the write token reads too
    # The read token does not write.
    r = client.post("/api/v1/runs", json={"name": "x"}, headers={"Authorization": f"Bearer {READ_TOKEN}"})
    assert r.status_code == 403
    assert client.get("/healthz").status_code == 200  # probes stay open


@pytest.mark.parametrize("token", [None, "", "changethis", "changeme", "short"])
def test_placeholder_write_token_refused_outside_dev_mode(token: str | None) -> None:
    with pytest.raises(ValidationError, match="HYPERWATCH_WRITE_TOKEN"):
        Settings(write_token=token)
    assert Settings(write_token=token, dev_mode=True).dev_mode


def test_placeholder_read_token_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="HYPERWATCH_READ_TOKEN"):
        Settings(write_token=WRITE_TOKEN, read_token="changethis")
    monkeypatch.setenv("HYPERWATCH_WRITE_TOKEN", WRITE_TOKEN)
    monkeypatch.setenv("HYPERWATCH_READ_TOKEN", "")  # empty = unset, as docker-compose passes it
    assert Settings().read_token is None


def test_dev_mode_without_token_allows_writes(sqlite_store: SqlStore) -> None:
    client = make_client(sqlite_store, write_token=None, dev_mode=True)
    assert client.post("/api/v1/runs", json={"name": "dev-run"}).status_code == 201


def test_cors_closed_by_default_and_open_when_configured(sqlite_store: SqlStore) -> None:
    headers = {"Origin": "https://dash.example", "Access-Control-Request-Method": "GET"}
    closed = make_client(sqlite_store)
    r = closed.options("/api/v1/runs", headers=headers)
    assert "access-control-allow-origin" not in r.headers
    assert (
        "access-control-allow-origin"
        not in closed.get("/api/v1/runs", headers={"Origin": "https://dash.example"}).headers
    )
    opened = make_client(sqlite_store, cors_origins=["https://dash.example"])
    r = opened.options("/api/v1/runs", headers=headers)
    assert r.headers.get("access-control-allow-origin") == "https://dash.example"
    r = opened.get("/api/v1/runs", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers


def test_cors_origins_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPERWATCH_CORS_ORIGINS", "https://a.example, https://b.example")
    assert Settings(write_token=WRITE_TOKEN).cors_origins == ["https://a.example", "https://b.example"]
