"""``bench/http_overhead.py``'s in-process floor: the route's own store call, as the route makes it.

The floor calls the points route's ``_store_batch`` directly; when that function grew a parameter the
benchmark broke and no test noticed. This runs it on a few real batches and counts what was stored."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import http_overhead
from bench.ingest import chunks, encode, fresh, rows
from hyperwatch.monitor.store import SqlStore
from hyperwatch.monitor.store import chunks as stored_chunks


@pytest.mark.parametrize("body", ["json", "columns"])
def test_the_in_process_floor_stores_every_point(tmp_path: Path, body: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_overhead.bench.ingest, "BODY", body)
    url = f"sqlite:///{tmp_path / 'floor.db'}"
    fresh(url)
    data = rows(3)  # three steps of 8 x 64 points
    bodies = [encode(part, "floor") for part in chunks(data, http_overhead.STEP)]
    assert len(bodies) == 3
    store = SqlStore(url)
    try:
        assert http_overhead.in_process(store, "floor", bodies) > 0
        run = next(r for r in store.list_runs() if r.name == "floor")
        with store.engine.connect() as conn:
            got = list(stored_chunks.all_points(conn, run.id))
        assert len(got) == len(data) == 3 * 512
    finally:
        store.close()
