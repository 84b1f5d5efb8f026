"""What learning costs a run's finish: the group is re-read before the reply (monitor/thresholds/learned.py).

A learning group (the default) of N finished runs, each with 100 logged losses and an indicator; then
one more run is finished, timed beside a PATCH that changes nothing learning reads, in one process on
SQLite (the app in-process, no HTTP): the ratio is what a group of N runs adds to a finish.

    .venv/bin/python bench/learn_refresh.py [--sizes 10,100,300] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fastapi.testclient import TestClient  # noqa: E402

from hyperwatch.monitor.store import SqlStore, migrate  # noqa: E402
from tests.monitor.conftest import AUTH, make_client  # noqa: E402


def _run(client: TestClient, name: str) -> int:
    created = client.post("/api/v1/runs", json={"name": name, "group": "g"}, headers=AUTH)
    assert created.status_code in (200, 201), created.text
    pts = [{"name": "loss", "step": s, "value": 3.0 - 0.001 * s} for s in range(100)]
    pts += [{"name": "attention_z", "layer": 0, "step": s, "value": 20.0 + s % 7} for s in range(100)]
    r = client.post("/api/v1/points", json={"batch_id": uuid.uuid4().hex, "run": name, "points": pts}, headers=AUTH)
    assert r.status_code in (200, 201), r.text
    return int(created.json()["id"])


def _patch_ms(client: TestClient, run_id: int, body: dict[str, object]) -> float:
    t0 = time.perf_counter()
    r = client.patch(f"/api/v1/runs/{run_id}", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    return (time.perf_counter() - t0) * 1000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="10,100,300", help="finished runs in the group, comma-separated")
    p.add_argument("--repeat", type=int, default=5, help="finishes timed per size (median)")
    args = p.parse_args()
    try:
        sizes = sorted(int(x) for x in args.sizes.split(","))
    except ValueError:
        p.error(f"--sizes {args.sizes!r}: whole numbers separated by commas, e.g. 10,100,300")
    store = SqlStore(f"sqlite:///{tempfile.mkdtemp(prefix='hw-learn-')}/hw.db")
    migrate.upgrade(store.engine)
    client = make_client(store)
    finished = 0
    for n in sizes:
        while finished < n:
            _patch_ms(client, _run(client, f"r{finished}"), {"status": "finished"})
            finished += 1
        finish, plain = [], []
        for i in range(args.repeat):
            rid = _run(client, f"t{n}-{i}")
            plain.append(_patch_ms(client, rid, {"tags": ["timed"]}))
            finish.append(_patch_ms(client, rid, {"status": "finished"}))
            _patch_ms(client, rid, {"status": "failed"})  # out of the group's healthy runs again
        f, q = statistics.median(finish), statistics.median(plain)
        print(f"learn refresh, {n} finished runs: finish {f:.1f} ms / plain PATCH {q:.1f} ms = {f / q:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
