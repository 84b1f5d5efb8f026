"""The attention branch's output RMS climb, on series ``bench/early_warning.py`` recorded, through both
alert sources (the service's ``z_growth`` on ``attention_rms``; ``HyperWatchAttentionRMSGrowth``).

It is the only indicator that moves on QK-norm runs at too high an LR (their logits stay bounded
by the norm): the plain GPT with QK-norm at LR 0.1 ended 0.34 nats worse than its healthy twin and
no other rule warned it. A run at LR 0.03 whose loss ended inside the 0.1-nat margin climbs to
24.9 and must stay quiet, as must a healthy run and a MoE run that tops out at 28.1 without a 4x
climb above the floor.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hyperwatch.monitor.detect.defaults import DEFAULT_THRESHOLDS
from tests.monitor.conftest import AUTH, create_run, post_points, promtool

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from ew_prom import from_columns, replay  # noqa: E402

SERIES = Path(__file__).parent / "data" / "ew_series"
RMS = "hyperwatch_run_attention_rms_max"
FLOOR = "hyperwatch_run_attention_rms_growth_floor"
ALERT = "HyperWatchAttentionRMSGrowth"

# recorded run -> first step both sources warn on the attention branch (None: never)
CASES: dict[str, int | None] = {
    "qk_high_lr": 28,  # attn_growth-gpt-lr0.1-qk-s100: 4.2 at step 4, 32.2 at 28; loss +0.34 nats
    "borderline": None,  # attn_growth-trainer-lr0.03-qk-s0: peaks at 24.9 (step 196); loss +0.092, inside the margin
    "router_wide": None,  # the MoE at LR 0.03 without gates: reaches 28.1 after its climb has flattened
    "healthy": None,  # a safe-LR plain GPT: at most 1.1
}


def _recorded(name: str) -> tuple[str, list[int], dict[str, list[Any]]]:
    """The run's scrapes with the floor gauge the service exports now (older recordings lack it)."""
    rec = json.loads((SERIES / f"{name}.json").read_text())
    cols: dict[str, list[Any]] = {k: list(v) for k, v in rec["series"].items()}
    (rms,) = [k for k in cols if k.startswith(RMS + "{")]
    labels = rms[len(RMS) :]
    floor = DEFAULT_THRESHOLDS["attention_rms_growth_floor"]
    cols.setdefault(FLOOR + labels, [None if v is None else floor for v in cols[rms]])
    return rec["run"], rec["logged_steps"], cols


def _rms(cols: dict[str, list[Any]]) -> list[Any]:
    (key,) = [k for k in cols if k.startswith(RMS + "{")]
    return cols[key]


@pytest.fixture(scope="module")
def prometheus_first(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int | None]:
    recorded = {name: _recorded(name) for name in CASES}
    fired = replay(
        {run: from_columns(cols) for run, _, cols in recorded.values()},
        REPO / "prometheus" / "rules.yml",
        tmp_path_factory.mktemp("rms"),
        promtool(),
    )
    out: dict[str, int | None] = {}
    for name, (run, steps, _) in recorded.items():
        at = fired.get(run, {}).get(ALERT)
        out[name] = steps[at[0]] if at else None
    return out


def _service_first(client: TestClient, name: str) -> int | None:
    """The recorded max over layers sent as one layer's attention_rms, a batch per logged step."""
    _, steps, cols = _recorded(name)
    create_run(client, name)
    for step, value in zip(steps, _rms(cols)):
        if value is not None:
            v: object = "NaN" if math.isnan(value) else value
            post_points(client, name, [{"name": "attention_rms", "layer": 0, "step": step, "value": v}])
    alerts = client.get("/api/v1/alerts", params={"rule": "z_growth", "limit": "1000"}).json()
    steps_fired = [a["step"] for a in alerts if a["run"] == name and a["name"] == "attention_rms"]
    return min(steps_fired, default=None)


@pytest.mark.parametrize("name", list(CASES))
def test_both_sources_warn_the_attention_branch_climb_at_the_same_step(
    name: str, client: TestClient, prometheus_first: dict[str, int | None]
) -> None:
    assert prometheus_first[name] == CASES[name]
    assert _service_first(client, name) == CASES[name]


def test_a_group_can_lower_the_floor_and_then_the_borderline_run_warns(client: TestClient) -> None:
    r = client.post(
        "/api/v1/groups",
        json={"name": "eager", "thresholds": {"attention_rms_growth_floor": 5.0}},
        headers=AUTH,
    )
    assert r.status_code == 201, r.text
    _, steps, cols = _recorded("borderline")
    create_run(client, "eager-run", group="eager")
    for step, value in zip(steps, _rms(cols)):
        if value is not None:
            post_points(client, "eager-run", [{"name": "attention_rms", "layer": 0, "step": step, "value": value}])
    alerts = client.get("/api/v1/alerts", params={"rule": "z_growth"}).json()
    mine = [a for a in alerts if a["run"] == "eager-run"]
    assert mine and mine[0]["name"] == "attention_rms" and "grew" in mine[0]["message"]
