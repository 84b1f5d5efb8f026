"""The service's detector raises spike, NaN and MaxVio alerts as stored, listed events."""

from __future__ import annotations

import math
import random
import uuid

from fastapi.testclient import TestClient

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.alerting.detectors import DEFAULT_THRESHOLDS, detect, is_spike
from hyperwatch.monitor.store import SqlStore
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
    # above this group's MaxVio limit of 0.5 (default 2.0) on 3 logged points in a row (max_vio_persist),
    # the earlier ones read back from the store: one point over, a dip, then three over
    for step, v, alerts in ((31, 0.8, 0), (32, 0.4, 0), (33, 0.9, 0), (34, 0.6, 0), (35, 0.7, 1)):
        out = post_points(client, "grouped", [{"name": "max_vio", "layer": 1, "step": step, "value": v}])
        assert out["alerts"] == alerts, step
    alert = client.get("/api/v1/alerts", params={"rule": "max_vio_collapse"}).json()[0]
    assert alert["layer"] == 1 and alert["step"] == 35 and math.isclose(alert["value"], 0.7)
    many = [{"name": "max_vio", "layer": 0, "step": s, "value": 0.8} for s in range(40, 44)]  # one batch
    assert post_points(client, "grouped", many)["alerts"] == 2  # steps 42 and 43 end runs of >= 3
    bad = client.post("/api/v1/groups", json={"name": "x", "thresholds": {"spike_windw": 3}}, headers=AUTH)
    assert bad.status_code == 422 and "spike_windw" in bad.json()["message"]


def _reference_alerts(
    values: dict[int, float], batch_steps: list[int], th: dict[str, float]
) -> list[tuple[int, float]]:
    """is_spike applied point by point over every value stored before (the rule, written plainly)."""
    out = []
    window = int(th["spike_window"])
    for step in batch_steps:
        history = [values[s] for s in sorted(values) if s < step][-window:]
        spike, med = is_spike(values[step], history, th, th["attention_z_min"])
        if spike:
            assert med is not None
            out.append((step, med))
    return out


def test_sliding_window_detector_matches_the_rule_point_by_point(store: SqlStore) -> None:
    """Batches read their windows from the store in one query and slide them: same alerts as the plain rule."""
    rng = random.Random(7)
    th = {**DEFAULT_THRESHOLDS, "spike_window": 12, "spike_min_points": 5, "attention_z_min": -1e9}
    run, _ = store.upsert_run("default", "slide", {})
    values: dict[int, float] = {}
    pool = [0.0, -0.0, 1.0, 150.0, 151.0, 152.0, math.nan, math.inf, -math.inf, 900.0, -900.0]
    got: list[tuple[int, float]] = []
    want: list[tuple[int, float]] = []
    for b in range(25):
        steps = list(range(20 * b, 20 * b + 20))
        batch = {s: rng.choice(pool) if rng.random() < 0.5 else 150.0 + rng.gauss(0, 2) for s in steps}
        values.update(batch)
        pts = [Point("attention_z", s, v, layer=1) for s, v in batch.items()]
        store.ingest(run.id, uuid.uuid4().hex, pts)
        got += [(a.step, a.baseline) for a in detect(store, run.id, pts, th) if a.rule == "z_spike"]  # type: ignore[misc]
        want += _reference_alerts(values, steps, th)
    assert len(want) >= 10
    assert got == want
    assert [math.copysign(1.0, b) for _s, b in got] == [math.copysign(1.0, b) for _s, b in want]


def test_trailing_windows_of_many_series_in_one_read(store: SqlStore) -> None:
    run, _ = store.upsert_run("default", "windows", {})
    pts = [Point("attention_z", s, float(s * 1000 + layer), layer=layer) for layer in range(230) for s in range(6)]
    pts += [Point("loss", s, math.nan if s == 3 else float(s)) for s in range(6)]
    store.ingest(run.id, uuid.uuid4().hex, pts)
    keys: list[tuple[str, int | None, int]] = [("attention_z", la, 4) for la in range(230)]  # > one statement
    keys += [("loss", None, 5), ("router_z", 0, 9), ("attention_z", 999, 3), ("attention_z", 7, 0)]
    windows = store.trailing_windows(run.id, keys, 3)
    assert [windows[la] for la in (0, 229)] == [[1000.0, 2000.0, 3000.0], [1229.0, 2229.0, 3229.0]]
    assert windows[230][:1] == [2.0] and math.isnan(windows[230][1]) and windows[230][2] == 4.0
    assert windows[231:] == [[], [], []]  # unknown name, unknown layer, nothing before step 0
    assert store.trailing_values(run.id, "attention_z", 5, 4, 10) == [5.0, 1005.0, 2005.0, 3005.0]
