"""Access: no write without the token, reads behind a read token when one is set, tokens compared in
constant time, no secret in any log (service or client), the service bound to localhost by default."""

from __future__ import annotations

import hmac
import logging
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from hyperwatch.app import create_app
from hyperwatch.hooks.schema import Batch, Point
from hyperwatch.hooks.sinks import HttpSink, RunInfo
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.store import SqlStore, migrate
from hyperwatch.serve import build_parser
from tests.reliability.support import AUTH, READ_TOKEN, WRITE_TOKEN, Service, wait_until
from tests.reliability.test_hostile import fingerprint

WRITE_METHODS = {"POST", "PATCH", "PUT", "DELETE"}
OPEN_PATHS = {"/healthz", "/readyz"}


@pytest.fixture
def store(tmp_path: Path) -> SqlStore:
    s = SqlStore(f"sqlite:///{tmp_path}/a.db")
    migrate.upgrade(s.engine)
    return s


def app_with(store: SqlStore, **settings: Any) -> TestClient:
    app = create_app(
        Settings(database_url="sqlite://", write_token=WRITE_TOKEN, **settings),
        store=store,
        registry=CollectorRegistry(),
    )
    return TestClient(app)


def concrete(path: str) -> str:
    return (
        path.replace("{run_id}", "1")
        .replace("{group_id}", "1")
        .replace("{webhook_id}", "1")
        .replace("{project}", "default")
    )


def routes(client: TestClient) -> list[tuple[str, str]]:
    """(METHOD, path template) of every operation in the service's OpenAPI document."""
    paths = client.get("/openapi.json").json()["paths"]
    return [(m.upper(), p) for p, ops in paths.items() for m in ops]


def test_no_write_anywhere_without_the_write_token(store: SqlStore) -> None:
    client = app_with(store)
    assert client.post("/api/v1/runs", json={"name": "r1", "group": "g"}, headers=AUTH).status_code == 201
    writes = [(m, p) for m, p in routes(client) if m in WRITE_METHODS]
    assert ("POST", "/api/v1/points") in writes and ("PATCH", "/api/v1/runs/{run_id}") in writes
    before = fingerprint(store)
    body = {"batch_id": "no-token-batch", "run": "r1", "points": [{"name": "loss", "step": 1, "value": 1.0}]}
    for method, path in writes:
        for headers, code in [({}, 401), ({"Authorization": "Bearer wrong-token-0123456789"}, 403),
                              ({"Authorization": f"Basic {WRITE_TOKEN}"}, 401)]:  # fmt: skip
            r = client.request(method, concrete(path), json=body, headers=headers)
            assert r.status_code == code, (method, path, headers, r.status_code, r.text[:200])
    assert fingerprint(store) == before


def test_reads_need_the_read_token_when_one_is_set(store: SqlStore) -> None:
    client = app_with(store, read_token=READ_TOKEN)
    reads = [(m, p) for m, p in routes(client) if m == "GET" and (p.startswith("/api/") or p == "/metrics")]
    assert len(reads) >= 10
    for _, path in reads:
        assert client.get(concrete(path)).status_code == 401, path
        assert client.get(concrete(path), headers={"Authorization": "Bearer not-the-token-at-all"}).status_code == 403
        ok = client.get(concrete(path), headers={"Authorization": f"Bearer {READ_TOKEN}"})
        assert ok.status_code not in (401, 403), path
    for path in OPEN_PATHS:  # probes stay open for orchestrators
        assert client.get(path).status_code in (200, 503)
    r = client.post("/api/v1/runs", json={"name": "x"}, headers={"Authorization": f"Bearer {READ_TOKEN}"})
    assert r.status_code == 403  # the read token never writes


def test_tokens_are_compared_in_constant_time(store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)
    client = app_with(store, read_token=READ_TOKEN)
    assert (
        client.post(
            "/api/v1/runs", json={"name": "x"}, headers={"Authorization": "Bearer guess-guess-guess"}
        ).status_code
        == 403
    )
    assert client.get("/api/v1/runs", headers={"Authorization": "Bearer guess-guess-guess"}).status_code == 403
    assert (b"guess-guess-guess", WRITE_TOKEN.encode()) in calls
    assert (b"guess-guess-guess", READ_TOKEN.encode()) in calls


def test_no_secret_in_service_or_client_logs(db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    secret_pw = "pw-0f3c9e1d77aa"
    url = db_url
    if url.startswith("postgresql"):  # trust auth ignores it, but a password in the URL must never be logged
        url = url.replace("postgres@", f"postgres:{secret_pw}@")
    svc = Service(url, tmp_path / "service.log", HYPERWATCH_READ_TOKEN=READ_TOKEN)
    svc.start("--log-level", "debug")
    caplog.set_level(logging.DEBUG)
    try:
        good = HttpSink(svc.url, token=WRITE_TOKEN, spool=tmp_path / "s1", backoff=(0.05, 0.2))
        good.start(RunInfo("secret-1"))
        good.write(Batch("secret-1", [Point("loss", 1, 1.0), Point("loss", 2, float("nan"))]))
        assert good.flush(60)
        good.close()
        wrong = "wrong-token-4f9e8d7c6b5a"
        bad = HttpSink(svc.url, token=wrong, spool=tmp_path / "s2", backoff=(0.05, 0.2), close_timeout=0.5)
        bad.start(RunInfo("secret-2"))
        bad.write(Batch("secret-2", [Point("loss", 1, 1.0)]))
        assert wait_until(lambda: "403" in bad.last_error, timeout=30)
        bad.close()
    finally:
        svc.kill()
    service_log = svc.log()
    client_log = "\n".join(r.getMessage() for r in caplog.records)
    assert "POST /api/v1/points" in service_log  # the log is real and verbose (debug)
    for text_ in (service_log, client_log):
        for secret in (WRITE_TOKEN, READ_TOKEN, wrong, secret_pw):
            assert secret not in text_


def test_service_binds_localhost_unless_told(sqlite_url: str, tmp_path: Path) -> None:
    assert build_parser("hyperwatch serve").parse_args([]).host == "127.0.0.1"
    from tests.reliability.support import upgrade

    upgrade(sqlite_url)
    svc = Service(sqlite_url, tmp_path / "service.log")
    svc.start()
    try:
        port_hex = f"{svc.port:04X}"
        listening = [
            line.split()[1]
            for name in ("/proc/net/tcp", "/proc/net/tcp6")
            if Path(name).exists()
            for line in Path(name).read_text().splitlines()[1:]
            if line.split()[1].endswith(":" + port_hex) and line.split()[3] == "0A"  # 0A: LISTEN
        ]
        assert listening == ["0100007F:" + port_hex], listening  # 127.0.0.1 only
    finally:
        svc.kill()
