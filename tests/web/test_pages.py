"""Pages and static files over HTTP (no browser): caching, CSP, plotly.js from the package, auth, validation."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from hyperwatch.app import create_app
from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.store import SqlStore, migrate
from hyperwatch.web.router import plotly_js_path

WRITE = "pages-test-write-token-0123456789"
READ = "pages-test-read-token-0123456789"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    s = SqlStore(f"sqlite:///{tmp_path / 'pages.db'}")
    migrate.upgrade(s.engine)
    run, _ = s.upsert_run("p", "r1", {"group": "g", "depth": 4, "total_params": 10**6})
    s.ingest(run.id, "batch-0001", [Point("attention_z", i, 10.0 + i, layer=0) for i in range(50)])
    yield s
    s.close()


def client(store: SqlStore, **settings: Any) -> TestClient:
    url = store.engine.url.render_as_string(hide_password=False)
    app = create_app(
        Settings(database_url=url, write_token=WRITE, **settings), store=store, registry=CollectorRegistry()
    )  # type: ignore[arg-type]
    return TestClient(app)


@pytest.mark.parametrize("path", ["/runs", "/runs/1", "/groups/1", "/groups/1/sweeps", "/alerts"])
def test_pages_are_shells_with_a_strict_csp(store: SqlStore, path: str) -> None:
    r = client(store).get(path)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "'unsafe-inline'" not in csp.split("script-src")[1].split(";")[0]
    assert "<script>" not in r.text  # no inline script: every script is a file from /ui/static
    assert "cdn" not in r.text.lower()


def test_home_redirects_and_bad_ids_are_rejected(store: SqlStore) -> None:
    c = client(store)
    r = c.get("/", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/runs"
    assert c.get("/runs/abc").status_code == 422


def test_plotly_js_comes_from_the_installed_package_with_caching(store: SqlStore) -> None:
    c = client(store)
    page = c.get("/groups/1").text
    url = next(part.split('"')[1] for part in page.split("<script src=")[1:] if "plotly.min.js" in part)
    body = plotly_js_path().read_bytes()
    r = c.get(url, headers={"Accept-Encoding": "identity"})
    assert r.status_code == 200 and r.content == body
    assert r.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert r.headers["content-type"].startswith("text/javascript")
    etag = r.headers["etag"]
    assert c.get(url, headers={"If-None-Match": etag}).status_code == 304
    z = c.get(url, headers={"Accept-Encoding": "gzip"})
    assert z.headers["content-encoding"] == "gzip" and z.content == body  # httpx decodes; the bytes match
    assert len(gzip.compress(body)) < len(body) / 2
    stale = c.get(url.replace(url.split("/")[3], "0" * 16))
    assert stale.status_code == 200 and stale.headers["cache-control"] == "no-cache"
    missing = c.get("/ui/static/0/nope.js")
    assert missing.status_code == 404 and "nope.js" in missing.json()["detail"]


def test_data_needs_the_read_token_when_one_is_set(store: SqlStore) -> None:
    c = client(store, read_token=READ)
    assert c.get("/runs").status_code == 200  # the shell holds no data
    r = c.get("/ui/data/groups/1/compare", params={"name": "attention_z"})
    assert r.status_code == 401 and "HYPERWATCH_READ_TOKEN" in r.json()["detail"]
    assert c.get("/ui/data/alerts", headers={"Authorization": "Bearer wrong-token-0123456789"}).status_code == 403
    ok = c.get("/ui/data/groups/1/compare", params={"name": "attention_z"}, headers={"Authorization": f"Bearer {READ}"})
    assert ok.status_code == 200 and ok.json()["runs"] == 1


@pytest.mark.parametrize(
    ("url", "params", "needle"),
    [
        ("/ui/data/groups/1/compare", {"name": "not_a_metric"}, "unknown metric name"),
        ("/ui/data/groups/1/compare", {"name": "attention_z", "x": "time"}, "x"),
        ("/ui/data/groups/1/compare", {"name": "attention_z", "buckets": 10**6}, "HYPERWATCH_MAX_BUCKETS"),
        ("/ui/data/groups/1/compare", {"name": "attention_z", "agg": "median"}, "agg"),
        ("/ui/data/runs/1/indicator", {"name": "attention_z", "x": "flops"}, "x"),
        ("/ui/data/runs/1/indicator", {"name": "attention_z", "x": "tokens"}, "carry no tokens"),
        ("/ui/data/groups/1/sweeps", {"baseline": "nope"}, "baseline"),
    ],
)
def test_data_endpoints_validate(store: SqlStore, url: str, params: dict[str, Any], needle: str) -> None:
    r = client(store).get(url, params=params)
    assert r.status_code == 422, r.text
    assert needle in r.text


def test_unknown_ids_are_404(store: SqlStore) -> None:
    c = client(store)
    assert c.get("/ui/data/groups/99/compare", params={"name": "attention_z"}).status_code == 404
    assert c.get("/ui/data/runs/99/indicator", params={"name": "attention_z"}).status_code == 404


def test_run_indicator_has_lines_and_heatmap(store: SqlStore) -> None:
    body = client(store).get("/ui/data/runs/1/indicator", params={"name": "attention_z", "buckets": 10}).json()
    assert body["per_layer"] is True
    # the lines, then the (empty) alert trace in its strip, which live alerts join
    assert [t["name"] for t in body["line"]["data"]] == ["mean over layers", "max over layers", "alerts"]
    heat = body["heatmap"]["data"][0]
    assert heat["y"] == [0] and max(v for v in heat["z"][0] if v is not None) == 59.0  # the max survives
