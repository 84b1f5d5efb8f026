"""The Alertmanager webhook stores a large notification in a few transactions, not a few per alert.

Issue 25: 2,000 alerts took 15.5 s, each one its own run lookup, series read and write
transaction. The speed itself is measured side by side in bench/alertmanager_webhook.py; here the
work is counted (transactions begun on the store's engine), and what is stored is checked.
"""

from __future__ import annotations

import math

from fastapi.testclient import TestClient
from sqlalchemy import event

from hyperwatch.monitor.store import SqlStore
from tests.monitor.conftest import AUTH, create_run, post_points

N = 2000


def _alert(i: int, run: str, status: str = "firing") -> dict[str, object]:
    labels = {"alertname": f"HyperWatchTest{i}", "project": "default", "run": run, "severity": "critical"}
    return {"status": status, "labels": labels, "annotations": {"summary": f"alert {i}"}}


def test_two_thousand_alerts_of_two_runs_are_stored_in_a_few_transactions(client: TestClient, store: SqlStore) -> None:
    create_run(client, "a")
    create_run(client, "b")
    post_points(client, "a", [{"name": "loss", "layer": None, "step": 7, "value": "NaN"}])
    post_points(client, "b", [{"name": "loss", "layer": None, "step": 3, "value": 2.5}])
    alerts = [_alert(i, "a" if i % 2 else "b") for i in range(N)]
    alerts += [_alert(0, "nobody"), _alert(1, "a", status="resolved"), {"status": "firing", "labels": {}}]
    begun: list[object] = []

    def count(conn: object) -> None:
        begun.append(conn)

    event.listen(store.engine, "begin", count)
    try:
        r = client.post("/api/v1/alerts/prometheus", json={"version": "4", "alerts": alerts}, headers=AUTH)
    finally:
        event.remove(store.engine, "begin", count)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["stored"] == N
    assert len(body["ignored"]) == 3
    assert any("no run default/nobody" in why for why in body["ignored"])
    # Per run: a lookup, a series read and one write; the path before issue 25 began three
    # transactions per alert, 6,000 here.
    assert len(begun) <= 10, len(begun)

    stored = client.get("/api/v1/alerts", params={"limit": 1000, "rule": "HyperWatchTest1"}).json()
    assert len(stored) == 1
    assert stored[0]["source"] == "prometheus" and stored[0]["step"] == 7 and math.isnan(float(stored[0]["value"]))
    again = client.post("/api/v1/alerts/prometheus", json={"alerts": alerts[:N]}, headers=AUTH).json()
    assert again["stored"] == 0  # a re-sent notification stores nothing twice
