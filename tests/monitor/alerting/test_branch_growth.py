"""The branches' output RMS climbs, on series ``bench/early_warning/run.py`` recorded, through both alert
sources (the service's ``z_growth`` on ``attention_rms`` / ``mlp_rms``;
``HyperWatchAttentionRMSGrowth`` / ``HyperWatchMLPRMSGrowth``).

They are the only indicators that move on QK-norm runs at too high an LR (the norm bounds their
logits): the plain GPT and the bundled trainer with QK-norm at LR 0.1 ended 0.34 and 0.22 nats worse
than their healthy twins and no other rule warned them. Runs at LR 0.03 whose loss ended inside the
0.1-nat margin climb too, less: the trainer's attention branch to 24.9 and its MLP to 251, the MoE
without gates to 28.1 and 243 after its climb has flattened; they, and a healthy run, stay quiet.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hyperwatch.monitor.thresholds.defaults import DEFAULT_THRESHOLDS
from tests.monitor.conftest import AUTH, create_run, post_points, promtool

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench" / "early_warning"))

from ew_gauges import with_step_statistics  # noqa: E402
from ew_prom import add_threshold, column_key, from_columns, replay  # noqa: E402

SERIES = Path(__file__).parent / "data" / "ew_series"
ALERTS = {"attention_rms": "HyperWatchAttentionRMSGrowth", "mlp_rms": "HyperWatchMLPRMSGrowth"}

# recorded run -> first step both sources warn each branch at (None: never)
CASES: dict[str, dict[str, int | None]] = {
    # attn_growth-gpt-lr0.1-qk-s100: attention 4.2 at step 4, 32.2 at 28; MLP 504 at its peak
    "qk_high_lr": {"attention_rms": 28, "mlp_rms": 36},
    # attn_growth-trainer-lr0.1-qk-s100: attention at most 15.3; MLP 638 at step 12, 3,250 at 28
    "trainer_qk_high_lr": {"attention_rms": None, "mlp_rms": 28},
    "borderline": {"attention_rms": None, "mlp_rms": None},  # attn_growth-trainer-lr0.03-qk-s0, loss +0.092
    "router_wide": {"attention_rms": None, "mlp_rms": None},  # the MoE at LR 0.03 without gates
    "healthy": {"attention_rms": None, "mlp_rms": None},  # a safe-LR plain GPT: at most 1.1 and 1.6
}


def _recorded(name: str) -> tuple[str, list[int], dict[str, list[Any]]]:
    """The run's scrapes with the floor gauges and statistics in logged steps the service exports now
    (older recordings lack them)."""
    rec = json.loads((SERIES / f"{name}.json").read_text())
    cols: dict[str, list[Any]] = {k: list(v) for k, v in rec["series"].items()}
    for metric in ALERTS:
        floor = DEFAULT_THRESHOLDS[f"{metric}_growth_floor"]
        add_threshold(cols, f"hyperwatch_run_{metric}_max", f"hyperwatch_run_{metric}_growth_floor", floor)
    return rec["run"], rec["logged_steps"], with_step_statistics(cols, {}, rec["logged_steps"])


@pytest.fixture(scope="module")
def prometheus_first(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, int | None]]:
    recorded = {name: _recorded(name) for name in CASES}
    fired = replay(
        {run: from_columns(cols) for run, _, cols in recorded.values()},
        REPO / "prometheus" / "rules.yml",
        tmp_path_factory.mktemp("rms"),
        promtool(),
    )
    out: dict[str, dict[str, int | None]] = {}
    for name, (run, steps, _) in recorded.items():
        at = {metric: fired.get(run, {}).get(alert) for metric, alert in ALERTS.items()}
        out[name] = {metric: steps[a[0]] if a else None for metric, a in at.items()}
    return out


def _send(client: TestClient, run: str, name: str) -> None:
    """The recorded max over layers of each branch sent as one layer's value, a batch per logged step."""
    _, steps, cols = _recorded(name)
    series = {metric: cols[column_key(cols, f"hyperwatch_run_{metric}_max")] for metric in ALERTS}
    for i, step in enumerate(steps):
        pts: list[dict[str, object]] = []
        for metric, values in series.items():
            v = values[i]
            if v is not None:
                pts.append({"name": metric, "layer": 0, "step": step, "value": "NaN" if math.isnan(v) else v})
        post_points(client, run, pts)


def _service_first(client: TestClient, run: str) -> dict[str, int | None]:
    alerts = client.get("/api/v1/alerts", params={"rule": "z_growth", "limit": "1000"}).json()
    return {
        metric: min((a["step"] for a in alerts if a["run"] == run and a["name"] == metric), default=None)
        for metric in ALERTS
    }


@pytest.mark.parametrize("name", list(CASES))
def test_both_sources_warn_the_branch_climbs_at_the_same_step(
    name: str, client: TestClient, prometheus_first: dict[str, dict[str, int | None]]
) -> None:
    assert prometheus_first[name] == CASES[name]
    create_run(client, name)
    _send(client, name, name)
    assert _service_first(client, name) == CASES[name]


def test_a_group_can_lower_the_floors_and_then_the_borderline_run_warns(client: TestClient) -> None:
    floors = {"attention_rms_growth_floor": 5.0, "mlp_rms_growth_floor": 50.0}
    r = client.post("/api/v1/groups", json={"name": "eager", "thresholds": floors}, headers=AUTH)
    assert r.status_code == 201, r.text
    create_run(client, "eager-run", group="eager")
    _send(client, "eager-run", "borderline")
    first = _service_first(client, "eager-run")
    assert first["attention_rms"] is not None and first["mlp_rms"] is not None, first
    alerts = client.get("/api/v1/alerts", params={"rule": "z_growth"}).json()
    assert all("grew" in a["message"] for a in alerts if a["run"] == "eager-run")
