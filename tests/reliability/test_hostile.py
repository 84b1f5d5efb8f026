"""Hostile input to the API: fuzzed from its OpenAPI spec (schemathesis) and hand-made cases.

Every answer is below 500 and carries no traceback; a rejected request (4xx) leaves the database
exactly as it was (same count of runs, groups, points, batches and alerts).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from prometheus_client import CollectorRegistry
from sqlalchemy import text

from hyperwatch.app import create_app
from hyperwatch.hooks.columns import COLUMNS_MEDIA_TYPE
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.store import SqlStore, migrate
from tests.reliability.support import AUTH, WRITE_TOKEN

TABLES = ("runs", "groups", "metric_points", "ingested_batches", "alert_events", "metric_names")
# What a leaked exception looks like in a body: a traceback, a source path, a driver error as SQLAlchemy
# renders it ("(sqlite3.OperationalError) ... [SQL: ...] (Background on this error at: sqlalche.me/...)").
# Not bare words: hypothesis draws strings from the code under test, and a run's config key
# "sqlalchemy.url" (from migrate.py) echoed back by POST and GET /runs is the user's data, not a leak.
LEAKS = ("Traceback (most recent call last)", 'File "/', "(sqlite3.", "(psycopg.", "[SQL: ", "sqlalche.me")

# The schema is loaded at import time (schemathesis parametrizes from it): an app on a private SQLite file.
_DIR = tempfile.mkdtemp(prefix="hw-fuzz-")
_STORE = SqlStore(f"sqlite:///{_DIR}/fuzz.db")
migrate.upgrade(_STORE.engine)
APP = create_app(
    Settings(database_url="sqlite://", write_token=WRITE_TOKEN), store=_STORE, registry=CollectorRegistry()
)
# the ingest route's binary columns body (hooks.columns) is fuzzed as raw bytes, like any binary body
schemathesis.serializer.alias(COLUMNS_MEDIA_TYPE, "application/octet-stream")
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)
schema.config.generation.update(
    modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE],
    max_examples=25,
    deterministic=True,
)


def fingerprint(store: SqlStore) -> dict[str, int]:
    with store.engine.connect() as conn:
        return {t: int(conn.execute(text(f"SELECT COUNT(*) FROM {t}")).scalar() or 0) for t in TABLES}


def _seed() -> None:
    """A run, a group and points, so that generated ids and names sometimes hit real rows."""
    c = TestClient(APP, headers=AUTH)
    # by name, not by id: a fuzzed DELETE /api/v1/runs/{id} may have removed the first seed run
    made = c.post("/api/v1/runs", json={"name": "seed", "group": "g", "depth": 2}).status_code
    assert made in (200, 201)
    if made == 201:
        pts = [{"name": "attention_z", "layer": i % 2, "step": i, "value": 1.0} for i in range(20)]
        r = c.post("/api/v1/points", json={"batch_id": "seed-batch-1", "run": "seed", "points": pts})
        assert r.status_code == 201


@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_fuzzed_requests_never_5xx_never_leak_never_store_when_rejected(case: Any) -> None:
    _seed()
    before = fingerprint(_STORE)
    response = case.call(headers=AUTH)
    assert response.status_code < 500, (
        f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:500]}"
    )
    assert not any(leak in response.text for leak in LEAKS), response.text[:500]
    if response.status_code >= 400:
        assert fingerprint(_STORE) == before, f"{case.method} {case.path} was refused but wrote something"


@pytest.fixture
def api(tmp_path: Path) -> tuple[TestClient, SqlStore]:
    store = SqlStore(f"sqlite:///{tmp_path}/h.db")
    migrate.upgrade(store.engine)
    settings_ = Settings(database_url="sqlite://", write_token=WRITE_TOKEN, max_body_bytes=256 * 1024)
    client = TestClient(create_app(settings_, store=store, registry=CollectorRegistry()), headers=AUTH)
    assert client.post("/api/v1/runs", json={"name": "r1"}).status_code == 201
    return client, store


def point(**over: Any) -> dict[str, Any]:
    return {"name": "loss", "layer": None, "step": 1, "value": 1.0, **over}


def batch(*points: dict[str, Any], run: str = "r1", batch_id: str = "hostile-batch-1") -> bytes:
    return json.dumps({"batch_id": batch_id, "run": run, "points": list(points)}).encode()


HOSTILE: dict[str, tuple[bytes, int, str]] = {
    # name: (raw body, expected status, a word the message must contain)
    "oversized body": (b'{"pad": "' + b"x" * (300 * 1024) + b'"}', 413, "HYPERWATCH_MAX_BODY_BYTES"),
    "deep JSON": (b'{"batch_id": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", 400, "nested"),
    "not UTF-8": (b'{"batch_id": "\xff\xfe\xfa", "run": "r1", "points": []}', 400, "UTF-8"),
    "not UTF-8 at the start": (b"\xff\xfe{}", 422, "JSON"),
    "not JSON": (b"batch_id=1&run=r1", 422, "JSON"),
    "wrong type: points": (json.dumps({"batch_id": "hostile-1", "run": "r1", "points": "many"}).encode(), 422, "list"),
    "wrong type: step": (batch(point(step="12")), 422, "step"),
    "boolean layer": (batch(point(layer=True)), 422, "layer"),
    "wrong type: value": (batch(point(value=[1.0])), 422, "value"),
    "boolean value": (batch(point(value=True)), 422, "value"),
    "huge layer": (batch(point(layer=10**30)), 422, "layer"),
    "layer beyond the limit": (batch(point(layer=4097)), 422, "layer"),
    "negative step": (batch(point(step=-1)), 422, "step"),
    "negative layer": (batch(point(layer=-2)), 422, "layer"),
    "unknown metric name": (batch(point(name="lossy")), 422, "unknown metric name"),
    "SQL in a name": (batch(point(name="loss'; DROP TABLE runs; --")), 422, "name"),
    "HTML in a name": (batch(point(name="<script>alert(1)</script>")), 422, "name"),
    "SQL in the run": (batch(point(), run="r1' OR '1'='1"), 422, "run"),
    "HTML in the run": (batch(point(), run="<img src=x onerror=alert(1)>"), 422, "run"),
    "unknown field": (batch(point(extra=1)), 422, "extra"),
    "bad batch id": (batch(point(), batch_id="../../etc/passwd"), 422, "batch_id"),
    "unknown run": (batch(point(), run="nobody"), 404, "POST /api/v1/runs"),
    "string value not a non-finite": (batch(point(value="1e3")), 422, "value"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_bodies_are_clear_4xx_and_store_nothing(api: tuple[TestClient, SqlStore], case: str) -> None:
    client, store = api
    raw, status, word = HOSTILE[case]
    before = fingerprint(store)
    r = client.post("/api/v1/points", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text[:300]
    assert word.lower() in r.text.lower(), r.text[:300]
    assert not any(leak in r.text for leak in LEAKS)
    assert fingerprint(store) == before


def test_a_batch_with_one_bad_point_stores_none_of_it(api: tuple[TestClient, SqlStore]) -> None:
    client, store = api
    before = fingerprint(store)
    good = [point(step=s) for s in range(100)]
    r = client.post(
        "/api/v1/points", content=batch(*good, point(step=-5)), headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 422 and "points.100.step" in r.json()["message"]
    assert fingerprint(store) == before


def test_huge_ids_and_query_numbers_are_never_5xx(api: tuple[TestClient, SqlStore]) -> None:
    client, _ = api
    huge = 10**30  # beyond any 64-bit integer column: must not reach the driver as an overflow
    cases: list[tuple[str, dict[str, str | int], bool]] = [
        (f"/api/v1/runs/{huge}", {}, True),
        (f"/api/v1/runs/{huge}/series", {"name": "loss"}, True),
        (f"/api/v1/groups/{huge}", {}, True),
        ("/api/v1/alerts", {"run_id": huge}, True),
        ("/api/v1/runs/1/series", {"name": "loss", "start": huge}, False),  # an empty range is an answer
    ]
    for path, params, must_refuse in cases:
        r = client.get(path, params=params)
        assert r.status_code < 500 and not any(leak in r.text for leak in LEAKS), (path, r.status_code, r.text[:200])
        assert (400 <= r.status_code < 500) or not must_refuse, (path, r.status_code)
    r = client.patch(f"/api/v1/runs/{huge}", json={"status": "finished"})
    assert 400 <= r.status_code < 500


def test_names_with_markup_are_stored_and_returned_as_data(api: tuple[TestClient, SqlStore]) -> None:
    client, _ = api
    name = "user.x<script>"  # not a valid qualifier: refused
    r = client.post("/api/v1/points", content=batch(point(name=name)), headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    r = client.post(
        "/api/v1/runs", json={"name": "r2", "config": {"note": "<script>alert(1)</script>'; DROP TABLE runs"}}
    )
    assert r.status_code == 201  # free-form config is data: stored as JSON, returned as JSON
    got = client.get(f"/api/v1/runs/{r.json()['id']}").json()
    assert got["config"]["note"] == "<script>alert(1)</script>'; DROP TABLE runs"
    assert client.get("/api/v1/runs").status_code == 200  # the runs table is still there
