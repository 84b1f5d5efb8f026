"""/metrics on a fresh registry: service metrics, gauges of active runs only, bounded labels."""

from __future__ import annotations

import math

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.monitor.conftest import AUTH, create_run, post_points


def _samples(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = client.get("/metrics")
    assert r.status_code == 200
    out = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_export(client: TestClient) -> None:
    before = _samples(client).get(("hyperwatch_points_ingested_total", ()), 0.0)
    create_run(client, "live")
    create_run(client, "deep", export_layers=True)
    create_run(client, "done")
    pts = [
        {"name": "attention_z", "layer": 0, "step": 5, "value": 40.0},
        {"name": "attention_z", "layer": 1, "step": 5, "value": 70.0},
        {"name": "attention_z", "layer": 1, "step": 4, "value": 900.0},  # older step: not "latest"
        {"name": "max_vio", "layer": 1, "step": 5, "value": 0.25},
        {"name": "loss", "step": 5, "value": 3.5},
    ]
    post_points(client, "live", pts)
    post_points(client, "deep", [*pts[:2], {"name": "loss", "step": 5, "value": "NaN"}])
    post_points(client, "done", pts)
    client.patch("/api/v1/runs/3", json={"status": "finished"}, headers=AUTH)
    s = _samples(client)
    live = (("project", "default"), ("run", "live"))
    deep = (("project", "default"), ("run", "deep"))
    assert s[("hyperwatch_points_ingested_total", ())] - before == 5 + 3 + 5
    assert s[("hyperwatch_run_attention_z_max", live)] == 70.0  # max over layers at the latest step
    assert s[("hyperwatch_run_max_vio_ratio_max", live)] == 0.25
    assert s[("hyperwatch_run_loss_nats", live)] == 3.5
    assert s[("hyperwatch_run_nan", live)] == 0.0
    assert s[("hyperwatch_run_nan", deep)] == 1.0
    assert s[("hyperwatch_run_step", live)] == 5.0
    assert ("hyperwatch_run_last_point_timestamp_seconds", live) in s
    # Finished runs are not exported; layer labels only for the run that asked for them.
    assert not any(dict(labels).get("run") == "done" for _, labels in s)
    layer_runs = {dict(labels)["run"] for name, labels in s if name.startswith("hyperwatch_layer_")}
    assert layer_runs == {"deep"}
    assert s[("hyperwatch_layer_attention_z", (("layer", "1"), *deep))] == 70.0
    # The request histogram is labelled by route template, never by raw path or step.
    routes = {dict(labels).get("route") for name, labels in s if name.startswith("hyperwatch_http_request_duration")}
    assert "/api/v1/runs/{run_id}" in routes and "/api/v1/runs/3" not in routes
    assert ("hyperwatch_database_errors_total", ()) in s
    assert all(name.startswith("hyperwatch_") for name, _ in s)


def test_spike_baseline_is_counted_in_steps_with_the_groups_thresholds(client: TestClient) -> None:
    """The Z-spike rules' inputs: the median of the max over layers over the group's spike_window
    logged steps before the latest (wall-clock time plays no part), and the group's own thresholds."""
    th = {"spike_window": 5, "spike_min_points": 4, "spike_min_relative": 0.25, "attention_z_min": 60}
    r = client.post("/api/v1/groups", json={"name": "g", "thresholds": th}, headers=AUTH)
    assert r.status_code == 201, r.text
    create_run(client, "grouped", group="g")
    create_run(client, "plain")
    create_run(client, "young")
    # Layer 1 leads at steps 0-3, layer 0 at steps 4-6 (max over layers per step), a NaN left out;
    # step 7 is the latest (not in its own baseline).
    by_layer = {
        0: [1.0, 2.0, 3.0, 4.0, 50.0, 60.0, 70.0, 500.0],
        1: [10.0, 20.0, math.nan, 40.0, 5.0, 6.0, 7.0, 8.0],
    }
    pts = [
        {"name": "attention_z", "layer": layer, "step": step, "value": "NaN" if math.isnan(v) else v}
        for layer, values in by_layer.items()
        for step, v in enumerate(values)
    ]
    post_points(client, "grouped", pts)
    post_points(client, "plain", [*pts, *({**p, "name": "router_z"} for p in pts if p["step"] == 7)])
    post_points(client, "young", [p for p in pts if p["step"] < 3])
    s = _samples(client)
    grouped, plain, young = ((("project", "default"), ("run", n)) for n in ("grouped", "plain", "young"))
    # grouped: window of 5 steps before 7 -> steps 2..6, maxima [3 (NaN left out), 40, 50, 60, 70] -> 50
    assert s[("hyperwatch_run_attention_z_baseline", grouped)] == 50.0
    assert s[("hyperwatch_run_attention_z_max", grouped)] == 500.0
    assert s[("hyperwatch_run_attention_z_spike_floor", grouped)] == 60.0
    assert s[("hyperwatch_run_spike_min_relative", grouped)] == 0.25
    # its robust deviation over the same maxima: 1.4826 x median |[3, 40, 50, 60, 70] - 50| = 1.4826 x 10
    assert s[("hyperwatch_run_attention_z_baseline_deviation", grouped)] == pytest.approx(14.826)
    assert s[("hyperwatch_run_spike_mad_multiple", grouped)] == 8.0  # the default: the group sets none
    # plain (default thresholds: window 50, 10 points needed): 7 steps of history is not enough
    assert ("hyperwatch_run_attention_z_baseline", plain) not in s
    assert ("hyperwatch_run_attention_z_baseline_deviation", plain) not in s
    assert s[("hyperwatch_run_attention_z_spike_floor", plain)] == 100.0
    assert s[("hyperwatch_run_router_z_spike_floor", plain)] == 50.0
    assert s[("hyperwatch_run_spike_min_relative", plain)] == 0.5
    assert ("hyperwatch_run_attention_z_baseline", young) not in s
    assert ("hyperwatch_run_router_z_baseline", grouped) not in s  # no router Z in that run
    assert ("hyperwatch_run_router_z_spike_floor", grouped) not in s
