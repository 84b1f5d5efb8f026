"""The service's detector raises spike, NaN and MaxVio alerts as stored, listed events."""

from __future__ import annotations

import math

from fastapi.testclient import TestClient

from monitor.detectors import DEFAULT_THRESHOLDS, is_spike
from tests.monitor.conftest import AUTH, create_run, post_points


def _z_points(values: list[float], layer: int = 3, start: int = 0) -> list[dict[str, object]]:
    return [{"name": "attention_z", "layer": layer, "step": start + i, "value": v} for i, v in enumerate(values)]


def test_is_spike_uses_a_robust_trailing_baseline() -> None:
    th = dict(DEFAULT_THRESHOLDS)
    history = [150.0 + (i % 5) for i in range(40)]
    assert is_spike(900.0, history, th, 100.0)[0]
    assert not is_spike(160.0, history, th, 100.0)[0]  # ordinary noise
    assert not is_spike(90.0, [10.0] * 40, th, 100.0)[0]  # big jump but below the absolute minimum
    assert not is_spike(900.0, history[:5], th, 100.0)[0]  # too little history to judge
    # An earlier spike inside the window does not lift the baseline (median, MAD).
    assert is_spike(900.0, [*history[:-1], 5000.0], th, 100.0)[0]


def test_spike_and_nan_alerts_are_stored_and_listed(client: TestClient) -> None:
    run = create_run(client, "z-run")
    noise = [150.0 + (i % 5) for i in range(30)]
    first = post_points(client, "z-run", _z_points(noise))
    assert first["alerts"] == 0
    # The spike arrives in a later batch: its baseline is read back from the database.
    spike = post_points(client, "z-run", _z_points([151.0, 900.0, 152.0], start=30))
    assert spike["alerts"] == 1
    nan = post_points(client, "z-run", [{"name": "loss", "step": 40, "value": "NaN"}])
    assert nan["alerts"] == 1
    alerts = client.get("/api/v1/alerts", params={"run_id": str(run["id"])}).json()
    assert [a["rule"] for a in alerts] == ["nan_loss", "z_spike"]
    z = alerts[1]
    assert (z["name"], z["layer"], z["step"], z["value"]) == ("attention_z", 3, 31, 900.0)
    assert 150.0 <= z["baseline"] <= 155.0
    assert alerts[0]["value"] == "NaN" and "NaN" in alerts[0]["message"]
    # A replayed batch raises nothing new.
    again = client.post(
        "/api/v1/points",
        json={"batch_id": "replay-000001", "run": "z-run", "points": _z_points([151.0, 900.0], start=30)},
        headers=AUTH,
    ).json()
    assert again["alerts"] == 0
    assert len(client.get("/api/v1/alerts", params={"rule": "z_spike"}).json()) == 1


def test_thresholds_per_group(client: TestClient) -> None:
    r = client.post(
        "/api/v1/groups",
        json={"name": "strict", "thresholds": {"attention_z_min": 1000.0, "max_vio_limit": 0.5}},
        headers=AUTH,
    )
    assert r.status_code == 201 and r.json()["thresholds"] == {"attention_z_min": 1000.0, "max_vio_limit": 0.5}
    create_run(client, "grouped", group="strict")
    post_points(client, "grouped", _z_points([150.0 + (i % 5) for i in range(30)]))
    out = post_points(client, "grouped", _z_points([900.0], start=30))
    assert out["alerts"] == 0  # 900 is below this group's minimum of 1000
    out = post_points(client, "grouped", [{"name": "max_vio", "layer": 1, "step": 31, "value": 0.8}])
    assert out["alerts"] == 1  # above this group's MaxVio limit of 0.5 (default 2.0)
    alert = client.get("/api/v1/alerts", params={"rule": "max_vio_collapse"}).json()[0]
    assert alert["layer"] == 1 and math.isclose(alert["value"], 0.8)
    bad = client.post("/api/v1/groups", json={"name": "x", "thresholds": {"spike_windw": 3}}, headers=AUTH)
    assert bad.status_code == 422 and "spike_windw" in bad.json()["message"]
