"""End to end over real HTTP: uvicorn on a free localhost port, httpx as the client."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from prometheus_client import CollectorRegistry

from hyperwatch.hooks.schema import Batch, Point
from hyperwatch.monitor.api.app import create_app
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.store import SqlStore
from tests.monitor.conftest import AUTH, WRITE_TOKEN


@pytest.fixture
def base_url(store: SqlStore) -> Iterator[str]:
    settings = Settings(database_url="sqlite://", write_token=WRITE_TOKEN, check_schema=True)
    app = create_app(settings, store=store, registry=CollectorRegistry())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_real_http_round_trip(base_url: str) -> None:
    with httpx.Client(base_url=base_url, timeout=30) as c:
        assert c.get("/healthz").json()["status"] == "ok"
        assert c.get("/readyz").status_code == 200
        run = c.post("/api/v1/runs", json={"name": "http-run", "tokens": 1000}, headers=AUTH)
        assert run.status_code == 201
        batch = Batch(
            "http-run",
            [
                Point("loss", 1, 3.0, tokens=10),
                Point("loss", 2, float("inf"), tokens=20),
                Point("loss", 3, float("nan"), tokens=30),
            ],
        )
        r = c.post("/api/v1/points", json=batch.to_json(), headers=AUTH)
        assert r.status_code == 201 and r.json()["accepted"] == 3
        assert c.post("/api/v1/points", json=batch.to_json(), headers=AUTH).json()["duplicate"] is True
        series = c.get(f"/api/v1/runs/{run.json()['id']}/series", params={"name": "loss"})
        assert series.status_code == 200
        # The raw JSON text carries the wire strings, never bare NaN/Infinity literals.
        assert '"value":"Infinity"' in series.text.replace(" ", "") and "NaN" in series.text
        assert [p["value"] for p in series.json()["points"]] == [3.0, "Infinity", "NaN"]
        assert "hyperwatch_run_nan" in c.get("/metrics").text
        assert c.get("/openapi.json").json()["paths"]["/api/v1/points"]["post"]["summary"]
