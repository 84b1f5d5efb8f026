"""The Alertmanager webhook with N firing alerts of one run: alert by alert (before issue 25) and batched.

Before, the route looked the run up, read its series and stored the alert in its own transaction,
once per alert (the issue measured 15.5 s for 2,000 alerts). That path is run here as
``store_firing(store, [alert])`` for each alert, which does exactly that work; the batched path is
one ``POST /api/v1/alerts/prometheus`` with all N through the app. Each path gets its own run (with
the same points) so neither finds the other's alerts stored; both must store all N.

    .venv/bin/python bench/alertmanager_webhook.py              # 2,000 alerts, SQLite and PostgreSQL
    .venv/bin/python bench/alertmanager_webhook.py --alerts 5000 --only sqlite
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from bench.ingest import pg_database
from hyperwatch.monitor.alerting.alertmanager import store_firing
from hyperwatch.monitor.api.app import create_app
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.store import SqlStore, migrate

TOKEN = "bench-write-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def alerts_for(run: str, n: int) -> list[dict[str, object]]:
    """N firing alerts about ``run``, each its own rule (so each is a new alert event)."""
    return [
        {
            "status": "firing",
            "labels": {"alertname": f"HyperWatchBench{i}", "project": "default", "run": run, "severity": "warning"},
            "annotations": {"summary": f"bench alert {i}"},
        }
        for i in range(n)
    ]


def seed(client: TestClient, run: str) -> None:
    r = client.post("/api/v1/runs", json={"name": run}, headers=AUTH)
    assert r.status_code in (200, 201), r.text
    points = [{"name": "loss", "layer": None, "step": s, "value": 3.0 - s / 100} for s in range(50)]
    points += [{"name": "attention_z", "layer": layer, "step": 49, "value": 20.0 + layer} for layer in range(8)]
    body = {"batch_id": f"seed-{run}", "run": run, "points": points}
    r = client.post("/api/v1/points", json=body, headers=AUTH)
    assert r.status_code in (200, 201), r.text


def measure(url: str, n: int) -> tuple[float, float]:
    store = SqlStore(url)
    migrate.upgrade(store.engine)
    settings = Settings(database_url=url, write_token=TOKEN)  # type: ignore[call-arg]
    client = TestClient(create_app(settings, store=store, registry=CollectorRegistry()))
    seed(client, "one-by-one")
    seed(client, "batched")

    before = [(str(a["status"]), a["labels"], a["annotations"]) for a in alerts_for("one-by-one", n)]
    t0 = time.perf_counter()
    stored_before = 0
    for alert in before:
        stored_before += store_firing(store, [alert])[0]  # type: ignore[list-item]
    t_before = time.perf_counter() - t0

    body = {"version": "4", "alerts": alerts_for("batched", n)}
    t0 = time.perf_counter()
    r = client.post("/api/v1/alerts/prometheus", json=body, headers=AUTH)
    t_after = time.perf_counter() - t0
    assert r.status_code == 200, r.text
    stored_after = r.json()["stored"]
    store.close()
    if stored_before != n or stored_after != n:
        raise SystemExit(f"stored {stored_before} alert by alert and {stored_after} batched; expected {n} each")
    return t_before, t_after


@contextmanager
def database(kind: str) -> Iterator[str]:
    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{tmp}/bench.db"
    else:
        with pg_database() as url:
            yield url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alerts", type=int, default=2000)
    parser.add_argument("--only", choices=("sqlite", "pg"))
    args = parser.parse_args()
    for kind in ("sqlite", "pg"):
        if args.only and args.only != kind:
            continue
        with database(kind) as url:
            before, after = measure(url, args.alerts)
        print(
            f"alertmanager webhook, {args.alerts} alerts of one run, {kind}: alert by alert {before:.2f} s, "
            f"batched {after:.2f} s, {before / after:.1f}x faster"
        )


if __name__ == "__main__":
    main()
