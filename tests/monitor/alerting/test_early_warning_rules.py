"""``prometheus/rules.yml`` replayed by ``promtool test rules`` over /metrics scrapes that
``bench/early_warning/run.py`` recorded (one scrape per logged step, one minute apart: see
``bench/early_warning/ew_prom.py``): a steady climb and a blow-up from the first steps are warned within the
first 25% of training, a healthy run never."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench" / "early_warning"))

from ew_gauges import with_step_statistics  # noqa: E402
from ew_prom import fired, from_columns, minutes, promtool_test, replay, to_columns  # noqa: E402

from tests.monitor.conftest import promtool  # noqa: E402

SERIES = Path(__file__).parent / "data" / "ew_series"


def _load(name: str) -> dict:
    return json.loads((SERIES / f"{name}.json").read_text())


def _first_warning(name: str, tmp_path: Path) -> tuple[dict, dict[str, int]]:
    rec = _load(name)
    # the statistics in logged steps the service exports (the recordings predate them)
    rec["scrapes"] = from_columns(with_step_statistics(rec["series"], {}, rec["logged_steps"]))
    at = replay({rec["run"]: rec["scrapes"]}, REPO / "prometheus" / "rules.yml", tmp_path, promtool())
    return rec, {alert: rec["logged_steps"][idx[0]] for alert, idx in at[rec["run"]].items()}


@pytest.mark.parametrize("name", ["climb", "blowup"])
def test_runs_that_went_wrong_are_warned_in_the_first_quarter(name: str, tmp_path: Path) -> None:
    rec, first = _first_warning(name, tmp_path)
    assert first, f"{name}: no rule fired over {len(rec['scrapes'])} scrapes"
    assert min(first.values()) <= 0.25 * rec["steps"], first


def test_a_healthy_run_is_never_warned(tmp_path: Path) -> None:
    rec, first = _first_warning("healthy", tmp_path)
    assert len(rec["scrapes"]) >= 40
    assert first == {}


def test_the_replay_reads_promtools_report() -> None:
    assert minutes("0s") == 0 and minutes("45m") == 45 and minutes("1h3m") == 63 and minutes("2h0m0s") == 120
    report = """FAILED:
    alertname: HyperWatchNaNLoss, time: 2m,
        exp:[],
        got:[
            0:
              Labels:{alertname="HyperWatchNaNLoss", project="default", run="a-b", severity="critical"}
            ]
    alertname: HyperWatchNaNLoss, time: 1h3m,
        exp:[],
        got:[
            0:
              Labels:{alertname="HyperWatchNaNLoss", project="default", run="a-b", severity="critical"}
            ]
"""
    assert fired(report) == {("a-b", "HyperWatchNaNLoss"): [2, 63]}
    scrapes = [{'x{run="r"}': 1.0}, {}, {'x{run="r"}': 2.0, 'y{run="r"}': 3.0}]
    assert from_columns(to_columns(scrapes)) == scrapes
    group = promtool_test([{'x{run="r"}': 1.0}, {}, {'x{run="r"}': float("nan")}], ["A"])
    assert group["input_series"] == [{"series": 'x{run="r"}', "values": "1.0 _ NaN"}]
    assert [c["eval_time"] for c in group["alert_rule_test"]] == ["0m", "1m", "2m"]


def test_a_routing_collapse_is_warned_by_max_vio_not_by_a_router_z_spike(tmp_path: Path) -> None:
    """The MoE at LR 0.03 without SqrtGate or the aux loss: its loss stayed healthy, its expert load
    went wrong (busiest expert 4.9x its fair share over the last 10% of steps). Router Z climbs
    through the warmup to 67.5 at its 11th logged step over a median of 38.2 (1.8x, above the
    minimum of 50) but within 8 robust deviations of a window that is itself the climb: the
    router-Z spike rule stays quiet, as the service's z_spike does (it fired here before the
    deviation test); MaxVio warns at step 12 (3 scrapes in a row above its limit)."""
    rec, first = _first_warning("router_wide", tmp_path)
    assert first == {"HyperWatchMaxVioCollapse": 12}
    deviation = [v for k, v in rec["series"].items() if k.startswith("hyperwatch_run_router_z_baseline_deviation")]
    assert deviation and max(v for v in deviation[0] if v is not None) > 0  # the gauge the rule reads was recorded
