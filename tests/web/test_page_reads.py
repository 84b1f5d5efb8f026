"""The run page's figure reads (issue 35): one layer matrix per per-layer indicator and run state.

A 64-layer run page read 21 layer x step matrices per open (the mean line, the max line and the
heatmap of each of its 7 per-layer indicators, each its own store read), every open. Now the line
and the heatmap share one matrix, and the read layer keeps it for the run's state
(monitor/read/matrix_cache.py): a second open reads no matrix, a new point makes the next one read
again, and the numbers stay the API's (GET /api/v1/runs/{id}/layers), NaN and Inf included.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from hyperwatch.app import create_app
from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.read.matrix_cache import matrices
from hyperwatch.monitor.store import SqlStore, migrate

WRITE = "page-reads-write-token-0123456789"
LAYERS = 4


def value(layer: int, step: int) -> float:
    if (layer, step) == (2, 17):
        return math.nan
    if (layer, step) == (1, 23):
        return math.inf
    return 10.0 + layer + 0.1 * step


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    s = SqlStore(f"sqlite:///{tmp_path / 'reads.db'}")
    migrate.upgrade(s.engine)
    run, _ = s.upsert_run("p", "wide", {"group": "g", "depth": LAYERS})
    pts = [Point("attention_z", i, value(la, i), layer=la) for i in range(40) for la in range(LAYERS)]
    s.ingest(run.id, "batch-0001", pts + [Point("loss", i, 3.0 - 0.01 * i) for i in range(40)])
    matrices.clear()
    yield s
    s.close()


@pytest.fixture
def reads(store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Every ``store.layer_matrix`` call the requests make."""
    calls: list[tuple[Any, ...]] = []
    original = store.layer_matrix

    def counted(*args: Any) -> Any:
        calls.append(args)
        return original(*args)

    monkeypatch.setattr(store, "layer_matrix", counted)
    return calls


def client(store: SqlStore) -> TestClient:
    url = store.engine.url.render_as_string(hide_password=False)
    app = create_app(Settings(database_url=url, write_token=WRITE), store=store, registry=CollectorRegistry())
    return TestClient(app)


def indicator(c: TestClient, buckets: int = 20) -> dict[str, Any]:
    r = c.get("/ui/data/runs/1/indicator", params={"name": "attention_z", "x": "step", "buckets": buckets})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_lines_and_heatmap_share_one_matrix_read(store: SqlStore, reads: list[tuple[Any, ...]]) -> None:
    c = client(store)
    body = indicator(c)
    assert len(reads) == 1  # was 3: the mean line, the max line and the heatmap read it each
    assert body["heatmap"]["data"][0]["x"] == body["line"]["data"][0]["x"]  # its columns are the lines' points
    indicator(c)
    assert len(reads) == 1  # the same run state: the matrix kept


def test_a_new_point_reads_again_and_the_numbers_stay_the_apis(store: SqlStore, reads: list[tuple[Any, ...]]) -> None:
    c = client(store)
    indicator(c)
    store.ingest(1, "batch-0002", [Point("attention_z", 40, 99.0, layer=la) for la in range(LAYERS)])
    body = indicator(c)
    assert len(reads) == 2
    api = c.get("/api/v1/runs/1/layers", params={"name": "attention_z", "buckets": 20}).json()
    assert api["values"][0][-1] == 99.0  # the new step is in the last column
    heat, marks = body["heatmap"]["data"][:2]
    assert heat["x"] == [float(s) for s in api["bucket_starts"]]
    finite = [[v if isinstance(v, float) else None for v in row] for row in api["values"]]
    assert heat["z"] == finite  # every finite cell the API's; NaN and Inf blank there and marked on top
    assert sorted(zip(marks["y"], marks["text"], strict=True)) == [(1, "Infinity"), (2, "NaN")]
    mean, peak = body["line"]["data"][:2]
    assert peak["y"][-1] == 99.0 and mean["y"][-1] == 99.0


def test_the_cache_is_bounded_by_its_cells(store: SqlStore) -> None:
    from hyperwatch.monitor.read.matrix_cache import MatrixCache

    run = store.get_run(1)
    cache = MatrixCache(size=16, max_cells=LAYERS * 25)
    first = cache.get(store, run, "attention_z", 20, None, None)
    assert cache.get(store, run, "attention_z", 20, None, None) is first and cache.reads == 1
    cache.get(store, run, "attention_z", 10, None, None)
    assert cache.reads == 2 and len(cache.items) == 1  # 4 x 20 + 4 x 10 cells passed 100: the oldest went
    assert cache.held == LAYERS * 10
