"""The read layer's series-index cache is bounded by the series it holds, not only by its entries."""

from __future__ import annotations

from fastapi.testclient import TestClient

from hyperwatch.monitor.read.reader import _IndexCache
from hyperwatch.monitor.store.sql import SqlStore
from tests.monitor.conftest import create_run, post_points


def test_index_cache_drops_the_oldest_runs_past_its_series_bound(
    sqlite_store: SqlStore, sqlite_client: TestClient
) -> None:
    runs = []
    for i in range(4):
        run = create_run(sqlite_client, f"r{i}")
        post_points(
            sqlite_client, f"r{i}", [{"name": "attention_z", "step": 0, "value": 1.0, "layer": la} for la in range(30)]
        )
        runs.append(sqlite_store.get_run(int(run["id"])))
    cache = _IndexCache(size=512, max_series=70)
    for run in runs:
        assert len(cache.get(sqlite_store, run)) == 30
    assert cache.held == 60 and len(cache.items) == 2  # 4 x 30 series held at most 70: the newest two stay
    assert [key[1] for key in cache.items] == [runs[2].id, runs[3].id]
    assert cache.get(sqlite_store, runs[3]) is cache.items[next(reversed(cache.items))]  # a hit: the same list
