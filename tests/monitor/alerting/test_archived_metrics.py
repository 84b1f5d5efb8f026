"""/metrics leaves archived runs out (issue 35), on SQLite and PostgreSQL: an archived run that is still
"running" (a test run nobody finished) exports no gauge, and unarchiving it brings its gauges back;
the store's reads for /metrics (``active_runs``, ``latest_for_active_runs``) say the same."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from hyperwatch.monitor.store import SqlStore
from tests.monitor.conftest import AUTH, create_run, post_points


def _exported_runs(client: TestClient) -> dict[str, set[str]]:
    """Run name -> the names of the run gauges /metrics exports for it."""
    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            if "run" in s.labels:
                out.setdefault(s.labels["run"], set()).add(s.name)
    return out


def test_archived_runs_are_not_exported_on_metrics(client: TestClient, store: SqlStore) -> None:
    kept = create_run(client, "kept")
    scratch = create_run(client, "scratch")
    pts: list[dict[str, object]] = [
        {"name": "loss", "step": 3, "value": 2.5},
        {"name": "attention_z", "layer": 0, "step": 3, "value": 40.0},
    ]
    post_points(client, "kept", pts)
    post_points(client, "scratch", pts)
    before = _exported_runs(client)
    assert {"hyperwatch_run_step", "hyperwatch_run_loss_nats"} <= before["scratch"]
    assert before["scratch"] == before["kept"]

    r = client.patch(f"/api/v1/runs/{scratch['id']}", json={"archived": True}, headers=AUTH)
    assert r.status_code == 200 and r.json()["status"] == "running", r.text
    after = _exported_runs(client)
    assert "scratch" not in after and after["kept"] == before["kept"]
    assert [a.run for a in store.active_runs()] == ["kept"]
    assert {lv.run for lv in store.latest_for_active_runs()} == {"kept"}
    assert {lv.run for lv in store.latest_for_active_runs(["loss"])} == {"kept"}

    r = client.patch(f"/api/v1/runs/{scratch['id']}", json={"archived": False}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert _exported_runs(client)["scratch"] == before["scratch"]
    assert sorted(a.run for a in store.active_runs()) == ["kept", "scratch"]
    assert kept["status"] == "running"
