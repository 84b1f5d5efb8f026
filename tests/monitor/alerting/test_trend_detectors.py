"""Trend detectors and incidents on recorded-style series, through the real service, on both databases.

Series as the hooks send them (one logged step per batch): a steady climb of attention Z, a head
over the logit ceiling from the first step, loss and grad-norm spikes, a NaN, and a healthy noisy
run that must stay silent.
"""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from hyperwatch.monitor.alerting.trends import (
    _growing,
    _GrowthWindow,
    fitted_log_rise,
    mean_shift,
    persistent_spike,
    recent_rise,
    sigma_spike,
    theil_sen_slope,
)
from hyperwatch.monitor.thresholds.defaults import DEFAULT_THRESHOLDS
from tests.monitor.conftest import AUTH, create_run, post_points

LAYERS = 4
LIMIT = DEFAULT_THRESHOLDS["attention_lse_max_limit"]  # the defaults may be recalibrated: tests read them


def _stream(client: TestClient, run: str, steps: list[int], point_of: Any) -> None:
    """One batch per logged step, as the hooks send them."""
    for step in steps:
        post_points(client, run, point_of(step))


def _incidents(client: TestClient, run_id: Any) -> list[dict[str, Any]]:
    r = client.get("/api/v1/incidents", params={"run_id": str(run_id)})
    assert r.status_code == 200, r.text
    body: list[dict[str, Any]] = r.json()
    return body


def _healthy(rng: random.Random, step: int) -> list[dict[str, object]]:
    """A healthy noisy step: Z and max LSE wander around their level, loss drifts down with noise."""
    pts: list[dict[str, object]] = [
        {"name": "loss", "step": step, "value": 3.0 - 0.002 * step + rng.gauss(0, 0.03)},
        {"name": "grad_norm", "step": step, "value": abs(1.0 + rng.gauss(0, 0.1))},
        {"name": "output_z", "step": step, "value": 160.0 * (1 + rng.gauss(0, 0.05))},
    ]
    for layer in range(LAYERS):
        pts.append({"name": "attention_z", "layer": layer, "step": step, "value": 60.0 * (1 + rng.gauss(0, 0.1))})
        for h in range(2):
            v = 9.0 + rng.gauss(0, 0.5)
            pts.append({"name": f"attention_lse_max.h{h}", "layer": layer, "step": step, "value": v})
    return pts


def test_theil_sen_and_sigma_spike_on_plain_series() -> None:
    assert theil_sen_slope([0, 1, 2, 3, 4], [0.0, 2.0, 4.0, 100.0, 8.0]) == 2.0  # the outlier moves nothing
    climb = [(s, 10.0 * math.exp(0.1 * s)) for s in range(0, 31, 2)]
    assert fitted_log_rise(climb) == pytest.approx(3.0, rel=1e-9)
    assert math.isnan(fitted_log_rise([(0, -1.0), (1, float("nan"))]))
    th = dict(DEFAULT_THRESHOLDS)
    flat = [3.0 + 0.01 * (i % 3) for i in range(128)]
    assert sigma_spike(3.5, flat, th)[0]
    assert not sigma_spike(3.02, flat, th)[0]
    assert not sigma_spike(3.5, flat[:5], th)[0]  # too little history
    assert persistent_spike([3.5, 3.4], flat, th) == (True, pytest.approx(3.01, abs=1e-3))  # held: both above one bar
    assert not persistent_spike([3.5, 3.01], flat, th)[0]  # a blip the next logged point does not repeat
    assert not persistent_spike([3.5, math.nan], flat, th)[0]  # a NaN is no confirmation (it has its own rule)


def test_a_climb_that_settles_stops_counting_with_growth_recent() -> None:
    """growth_recent: the window's last half must keep the pace the whole window needs. A steady climb
    keeps it; one that rose 30x in its first half and went flat (logits while a model learns) does not."""
    steps = list(range(0, 64, 4))  # 16 logged points
    steady = [(s, 10.0 * math.exp(0.06 * s)) for s in steps]  # 37x over the window, the same pace throughout
    settled = [(s, 10.0 * math.exp(0.12 * min(s, 28)) * (1 + 0.01 * (s % 8))) for s in steps]  # 29x, flat from 28
    rise = math.log(8.0)
    assert recent_rise(steady, 16) == pytest.approx(fitted_log_rise(steady)) and recent_rise(steady, 16) > rise
    assert fitted_log_rise(settled) > rise > recent_rise(settled, 16)
    cases = ((steady, True, True), (steady, False, True), (settled, False, True), (settled, True, False))
    for window, on, want in cases:
        assert _growing(_GrowthWindow(window, 16), 8, rise, floor=50.0, recent=on) is want
    assert math.isnan(recent_rise([(0, 1.0), (0, 2.0)], 16))  # no span: no verdict


def test_mean_shift_sees_a_step_that_stays_up_and_not_a_blip() -> None:
    th = dict(DEFAULT_THRESHOLDS)
    rng = random.Random(3)
    base = [3.0 + rng.gauss(0, 0.1) for _ in range(16)]
    sigma = float(np.std(base))
    up = [float(np.mean(base)) + 2 * sigma] * 6  # 2 sigma, no point of it a 4-sigma spike
    shifted, mean, recent = mean_shift(base + up, th)
    assert shifted and mean == pytest.approx(np.mean(base)) and recent == pytest.approx(up[0])
    assert not any(sigma_spike(v, base, th)[0] for v in up)  # the spike rule cannot see it
    assert not mean_shift(base + [up[0]] + [float(np.mean(base))] * 5, th)[0]  # one point up is no shift
    assert not mean_shift(base + [30.0] + [float(np.mean(base))] * 5, th)[0]  # nor one spike, however tall
    assert not mean_shift(base[4:] + up, th)[0]  # 12 values of history: too few
    assert not mean_shift(base + up[:5] + [math.nan], th)[0]  # NaN has its own rule


def test_steady_climb_is_one_growth_incident_not_one_alert_per_step(client: TestClient) -> None:
    run = create_run(client, "climb")
    rng = random.Random(1)

    def step(s: int) -> list[dict[str, object]]:
        i = s // 10
        z = 40.0 * math.exp(0.16 * i) * (1 + rng.gauss(0, 0.02))  # 11x over a 16-point window
        return [
            {"name": "attention_z", "layer": layer, "step": s, "value": z * (1 + 0.1 * layer)}
            for layer in range(LAYERS)
        ]

    _stream(client, "climb", list(range(0, 600, 10)), step)
    alerts = client.get("/api/v1/alerts", params={"run_id": str(run["id"]), "rule": "z_growth"}).json()
    assert sorted(a["layer"] for a in alerts) == list(range(LAYERS))  # one onset per layer, not per step
    first = min(a["step"] for a in alerts)
    assert first <= 250  # warned within the first ~40% of a climb that ends 12,000x up
    (inc,) = [i for i in _incidents(client, run["id"]) if i["rule"] == "z_growth"]
    assert inc["layers"] == list(range(LAYERS)) and inc["events"] == LAYERS
    assert inc["first_step"] == first and "attention_z" in inc["summary"] and "grew" in inc["message"]
    assert any("QK-norm" in r for r in inc["remedies"])
    assert inc["link"] == f"/runs/{run['id']}?name=attention_z&step={first}"
    # the climb later passes the attention Z ceiling (limit^2 = 10^4): a critical incident of its own, later
    (ceiling,) = [i for i in _incidents(client, run["id"]) if i["rule"] == "logit_ceiling"]
    assert ceiling["name"] == "attention_z" and ceiling["severity"] == "critical" and ceiling["first_step"] > first


def test_head_over_the_ceiling_at_step_one_is_warned_at_step_one(client: TestClient) -> None:
    run = create_run(client, "blowup")

    def step(s: int) -> list[dict[str, object]]:
        pts: list[dict[str, object]] = []
        for layer in range(LAYERS):
            for h in range(4):
                hot = layer == 1 and h == 2
                v = 1.5 * LIMIT * (1 + s) if hot else 8.0
                pts.append({"name": f"attention_lse_max.h{h}", "layer": layer, "step": s, "value": v})
            pts.append(
                {
                    "name": "attention_lse_max",
                    "layer": layer,
                    "step": s,
                    "value": 1.5 * LIMIT * (1 + s) if layer == 1 else 8.0,
                }
            )
        return pts

    _stream(client, "blowup", [1, 2, 3, 4, 5], step)
    alerts = client.get("/api/v1/alerts", params={"run_id": str(run["id"]), "rule": "logit_ceiling"}).json()
    assert [(a["name"], a["layer"], a["step"]) for a in alerts] == [("attention_lse_max.h2", 1, 1)]  # crossing only
    assert alerts[0]["severity"] == "critical" and alerts[0]["baseline"] == LIMIT
    (inc,) = _incidents(client, run["id"])
    assert inc["rule"] == "logit_ceiling" and inc["heads"] == [{"layer": 1, "head": 2}] and inc["first_step"] == 1
    assert "1.2" in inc["summary"]  # "heads (layer.head) 1.2"


def test_loss_and_grad_norm_spikes_and_nan(client: TestClient) -> None:
    run = create_run(client, "spiky")
    rng = random.Random(2)
    values = {s: 3.0 + rng.gauss(0, 0.02) for s in range(150)}
    values[120] = 4.5
    grads = {s: 1.0 + rng.gauss(0, 0.05) for s in range(150)}
    grads[100] = 9.0  # a blip: the next logged point is back near 1, so no grad-norm spike
    grads[130] = grads[131] = 9.0  # held for two logged points (grad_norm_spike_persist): a spike at the second

    def step(s: int) -> list[dict[str, object]]:
        loss: object = "NaN" if s == 140 else values[s]
        return [{"name": "loss", "step": s, "value": loss}, {"name": "grad_norm", "step": s, "value": grads[s]}]

    _stream(client, "spiky", list(range(150)), step)
    alerts = client.get("/api/v1/alerts", params={"run_id": str(run["id"]), "limit": "500"}).json()
    found = sorted((a["rule"], a["step"]) for a in alerts)
    assert found == [("grad_norm_spike", 131), ("loss_spike", 120), ("nan_loss", 140)]
    spike = next(a for a in alerts if a["rule"] == "loss_spike")
    assert 2.95 < spike["baseline"] < 3.05
    assert "of the 16 values before" in spike["message"]  # the loss's own window (loss_spike_window)
    held = next(a for a in alerts if a["rule"] == "grad_norm_spike")
    assert "2 logged points in a row" in held["message"] and 1.0 < held["baseline"] < 1.2
    incidents = {i["rule"]: i for i in _incidents(client, run["id"])}
    assert set(incidents) == {"grad_norm_spike", "loss_spike", "nan_loss"}
    assert incidents["nan_loss"]["peak_value"] == "NaN" and "NaN" in incidents["nan_loss"]["summary"]


def test_healthy_noisy_run_raises_nothing(client: TestClient) -> None:
    run = create_run(client, "healthy")
    rng = random.Random(3)
    _stream(client, "healthy", list(range(0, 300, 2)), lambda s: _healthy(rng, s))
    assert client.get("/api/v1/alerts", params={"run_id": str(run["id"])}).json() == []
    assert _incidents(client, run["id"]) == []


def test_episodes_and_prometheus_alerts_group_into_incidents(client: TestClient) -> None:
    run = create_run(client, "episodes")
    post_points(client, "episodes", [{"name": "loss", "step": 10, "value": "NaN"}])
    post_points(client, "episodes", [{"name": "loss", "step": 20, "value": "NaN"}])
    post_points(client, "episodes", [{"name": "loss", "step": 5000, "value": "Infinity"}])  # a later episode
    incidents = sorted(_incidents(client, run["id"]), key=lambda i: i["first_step"])
    assert [(i["rule"], i["first_step"], i["last_step"], i["events"]) for i in incidents] == [
        ("nan_loss", 10, 20, 2),
        ("nan_loss", 5000, 5000, 1),
    ]
    assert incidents[0]["steps"] == [10, 20] and incidents[1]["peak_value"] == "Infinity"
    hook = {
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "HyperWatchLossSpike", "project": "default", "run": "episodes"},
                "annotations": {"summary": "loss above mean + 6 sigma"},
            }
        ]
    }
    r = client.post("/api/v1/alerts/prometheus", json=hook, headers=AUTH)
    assert r.status_code == 200 and r.json()["stored"] == 1, r.text
    prom = [i for i in _incidents(client, run["id"]) if i["source"] == "prometheus"]
    assert [(i["rule"], i["name"]) for i in prom] == [("HyperWatchLossSpike", "loss")]


def test_metrics_export_the_layer_max_over_heads_and_the_trend_thresholds(client: TestClient) -> None:
    create_run(client, "exported")
    pts: list[dict[str, object]] = [
        {"name": "output_z", "step": 3, "value": 170.0},
        {"name": "grad_norm", "step": 3, "value": 1.5},
    ]
    for layer in range(2):
        for h in range(8):
            pts.append({"name": f"attention_lse_max.h{h}", "layer": layer, "step": 3, "value": 10.0 + h + layer})
        pts.append({"name": "attention_lse_max", "layer": layer, "step": 3, "value": 17.0 + layer})
    post_points(client, "exported", pts)
    text = client.get("/metrics").text
    lab = '{project="default",run="exported"}'
    assert f"hyperwatch_run_attention_lse_max_max{lab} 18.0" in text
    assert f"hyperwatch_run_output_z{lab} 170.0" in text and f"hyperwatch_run_grad_norm{lab} 1.5" in text
    assert f"hyperwatch_run_logit_ceiling{lab} {LIMIT}" in text
    assert f"hyperwatch_run_growth_log_factor{lab} {math.log(DEFAULT_THRESHOLDS['growth_factor'])}" in text
    assert ".h" not in "".join(line for line in text.splitlines() if "exported" in line)  # no per-head series


def test_every_default_is_a_group_override_and_overrides_reach_the_detectors(client: TestClient) -> None:
    every = {k: int(v) if k.endswith(("window", "points")) else v for k, v in DEFAULT_THRESHOLDS.items()}
    r = client.post("/api/v1/groups", json={"name": "all-defaults", "thresholds": every}, headers=AUTH)
    assert r.status_code == 201, r.text  # every default has its override field
    r = client.post(
        "/api/v1/groups", json={"name": "tight", "thresholds": {"attention_lse_max_limit": 5.0}}, headers=AUTH
    )
    assert r.status_code == 201, r.text
    create_run(client, "tight-run", group="tight")
    create_run(client, "default-run")
    for run in ("tight-run", "default-run"):
        post_points(client, run, [{"name": "attention_lse_max.h0", "layer": 0, "step": 1, "value": 8.0}])
    fired = {a["run"] for a in client.get("/api/v1/alerts", params={"rule": "logit_ceiling"}).json()}
    assert fired == {"tight-run"}  # 8 passes this group's ceiling of 5, not the default 100
    bad = client.post("/api/v1/groups", json={"name": "bad", "thresholds": {"growth_factor": 0.5}}, headers=AUTH)
    assert bad.status_code == 422 and "growth_factor" in bad.json()["message"]


def test_a_climb_below_the_floor_is_info_and_turns_into_a_warning_above_it(client: TestClient) -> None:
    """Two tiers of one rule: a climb between ``growth_info_fraction`` x the floor and the floor is
    raised as info (visible, pages nobody), and as a warning once it climbs past the floor."""
    floor = 400.0
    th = {"attention_z_growth_floor": floor, "growth_info_fraction": 0.1}
    r = client.post("/api/v1/groups", json={"name": "tiers", "thresholds": th}, headers=AUTH)
    assert r.status_code == 201, r.text
    run = create_run(client, "tiers-run", group="tiers")

    def step(s: int) -> list[dict[str, object]]:
        z = 20.0 * math.exp(0.25 * (s // 10))  # 20 -> past 40 (info floor) by step 30 -> past 400 by step 120
        return [{"name": "attention_z", "layer": 0, "step": s, "value": z}]

    _stream(client, "tiers-run", list(range(0, 300, 10)), step)
    alerts = client.get("/api/v1/alerts", params={"run_id": str(run["id"]), "rule": "z_growth"}).json()
    by_tier = {a["severity"]: a for a in alerts}
    assert sorted(a["severity"] for a in alerts) == ["info", "warning"]  # one onset per tier, not per step
    info, warning = by_tier["info"], by_tier["warning"]
    assert 40.0 <= info["value"] < floor and "below the warning floor" in info["message"]
    assert warning["value"] >= floor and warning["step"] > info["step"]
    (inc,) = [i for i in _incidents(client, run["id"]) if i["rule"] == "z_growth"]
    assert inc["severity"] == "warning"  # the incident takes its highest tier
    # with no info tier (the fraction at 1), the same climb raises the warning alone
    r = client.post("/api/v1/groups", json={"name": "one-tier", "thresholds": {**th, "growth_info_fraction": 1}},
                    headers=AUTH)  # fmt: skip
    assert r.status_code == 201, r.text
    run = create_run(client, "one-tier-run", group="one-tier")
    _stream(client, "one-tier-run", list(range(0, 300, 10)), lambda s: [{**p, "step": s} for p in step(s)])
    alerts = client.get("/api/v1/alerts", params={"run_id": str(run["id"]), "rule": "z_growth"}).json()
    assert [a["severity"] for a in alerts] == ["warning"] and alerts[0]["step"] == warning["step"]
    bad = client.post("/api/v1/groups", json={"name": "bad-frac", "thresholds": {"growth_info_fraction": 2}},
                      headers=AUTH)  # fmt: skip
    assert bad.status_code == 422 and "growth_info_fraction" in bad.json()["message"]
