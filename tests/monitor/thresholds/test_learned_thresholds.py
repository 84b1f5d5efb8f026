"""A group's thresholds with where each came from (monitor.thresholds.learned): default, override, or learned
from its finished healthy runs; GET /api/v1/groups/{id}/thresholds on SQLite and PostgreSQL; the
detectors and the exported Prometheus gauges use the learned values."""

from __future__ import annotations

import math
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hyperwatch.monitor.store.entities import GroupThresholds, RunHealth
from hyperwatch.monitor.thresholds.defaults import DEFAULT_THRESHOLDS
from hyperwatch.monitor.thresholds.learned import (
    LEARNED_FROM,
    behind_the_best,
    effective_thresholds,
    learn,
    provenance,
    unhealthy,
)
from tests.monitor.conftest import AUTH, create_run, post_points

LIMIT = DEFAULT_THRESHOLDS["attention_lse_max_limit"]
MULTIPLE = 3.0  # the groups here set learn_multiple 3: the figures below are the mechanism's, not the default's


def _g(overrides: dict[str, Any], on: bool | None, learned: dict[str, Any] | None) -> GroupThresholds:
    """A group's settings with learn_multiple at MULTIPLE unless ``overrides`` set it."""
    return GroupThresholds({"learn_multiple": MULTIPLE, **overrides}, on, learned)


def _runs() -> tuple[list[RunHealth], dict[tuple[int, str], float]]:
    """a, b, f healthy (f's incidents: expert load, an info climb); c a loss spike, d NaN loss, e running, g no loss."""
    runs = [
        RunHealth(1, "a", "finished", 2.9),
        RunHealth(2, "b", "finished", 3.1),
        RunHealth(3, "c", "finished", 3.0, (("loss_spike", "warning"),)),
        RunHealth(4, "d", "finished", math.nan),
        RunHealth(5, "e", "running", 3.0),
        RunHealth(6, "f", "finished", 3.0, (("max_vio_collapse", "warning"), ("z_growth", "info"))),
        RunHealth(7, "g", "finished", None),
    ]
    peaks = {
        (1, "attention_z"): 20.0,
        (2, "attention_z"): 30.0,
        (3, "attention_z"): 500.0,
        (4, "attention_z"): 600.0,
        (5, "attention_z"): 700.0,
        (7, "attention_z"): 800.0,
        (2, "attention_lse_max"): 15.0,
        (6, "attention_lse_max.h2"): 25.0,  # a head: counts for the ceiling, not for the floor
        (3, "attention_lse_max.h0"): 90.0,
        (1, "output_z"): 10.0,
    }
    return runs, peaks


def _rows(group: GroupThresholds | None) -> dict[str, Any]:
    return {r.key: r for r in provenance(group, 7)}


def test_defaults_overrides_and_learned_values_each_say_where_they_came_from() -> None:
    learned = learn(*_runs())
    assert learned["runs"] == ["a", "b", "f"]
    assert set(learned["excluded"]) == {"c", "d", "g"}  # e is not finished: not listed
    overrides = {"attention_z_growth_floor": 70.0, "growth_factor": 3.0}
    rows = _rows(_g(overrides, True, learned))
    assert set(rows) == set(DEFAULT_THRESHOLDS)
    z = rows["attention_z_growth_floor"]
    assert (z.source, z.value) == ("override", 70.0)  # the override beats the learned 90
    assert "PATCH /api/v1/groups/7" in z.detail and "without it" in z.detail and "peak 30" in z.detail
    assert (rows["growth_factor"].source, rows["growth_factor"].value) == ("override", 3.0)
    floor = rows["attention_lse_max_growth_floor"]
    assert (floor.source, floor.value) == ("learned", MULTIPLE * 15.0)
    assert "run b" in floor.detail and "3 finished healthy runs: a, b, f" in floor.detail
    ceiling = rows["attention_lse_max_limit"]
    assert (ceiling.source, ceiling.value, ceiling.default) == ("learned", MULTIPLE * 25.0, LIMIT)  # f's head
    out = rows["output_z_growth_floor"]
    assert (out.source, out.value) == ("default", DEFAULT_THRESHOLDS["output_z_growth_floor"])
    assert "not above the default" in out.detail  # 3 x 10 = 30 < 150: learning never lowers a threshold
    assert (
        rows["router_z_growth_floor"].source == "default" and "logged router_z" in rows["router_z_growth_floor"].detail
    )
    assert rows["spike_window"].source == "default" and rows["spike_window"].detail == ""
    for r in rows.values():
        assert r.source == "override" or r.value >= r.default
    values = effective_thresholds(_g(overrides, True, learned))
    assert {k: values[k] for k in rows} == {k: r.value for k, r in rows.items()}


def test_unhealthy_or_unfinished_runs_are_never_learned_from() -> None:
    runs, peaks = _runs()
    learned = learn(runs, peaks)
    assert learned["peaks"]["attention_z_growth_floor"] == [30.0, "b"]  # not c, d, e or g's 500-800
    assert learned["peaks"]["attention_lse_max_limit"] == [25.0, "f"]  # not c's head at 90
    assert "warning loss_spike" in learned["excluded"]["c"]
    assert "NaN" in learned["excluded"]["d"] and "no loss" in learned["excluded"]["g"]


def test_a_run_is_judged_healthy_by_its_loss_not_by_the_indicator_rules_learning_corrects() -> None:
    """A ceiling or growth incident on a run whose loss ended among the group's best does not stop
    learning from it (that is the false alarm to silence); a final loss behind the best does."""
    runs = [
        RunHealth(1, "a", "finished", 2.9, (("logit_ceiling", "critical"), ("z_growth", "warning"))),
        RunHealth(2, "b", "finished", 2.9, (("z_spike", "warning"),)),
        RunHealth(3, "c", "finished", 3.0, (("grad_norm_spike", "warning"),)),
        RunHealth(4, "d", "finished", 3.2),
    ]
    assert [unhealthy(r) for r in runs[:2]] == [None, None]
    assert "grad_norm_spike" in (unhealthy(runs[2]) or "")
    finals = {1: 2.50, 2: 2.54, 4: 2.70, 5: math.nan}
    behind = behind_the_best(finals, 0.05)
    assert set(behind) == {4, 5} and "0.2 nats above the group's best 2.5" in behind[4]
    learned = learn(runs, {(1, "attention_lse_max.h0"): 70.0, (4, "attention_lse_max.h0"): 300.0}, behind)
    assert learned["runs"] == ["a", "b"] and learned["peaks"]["attention_lse_max_limit"] == [70.0, "a"]
    assert "above the group's best" in learned["excluded"]["d"] and "grad_norm_spike" in learned["excluded"]["c"]
    assert behind_the_best({1: math.nan}, 0.05) == {}  # no finite final loss: nothing to compare with


def test_too_few_healthy_runs_learning_off_or_no_group_give_the_defaults() -> None:
    learned = learn(*_runs())
    for group in (
        _g({"learn_min_runs": 4}, True, learned),  # 3 healthy runs
        _g({}, False, learned),
        _g({}, True, None),  # on, nothing read yet
        None,
    ):
        rows = _rows(group)
        assert all(rows[k].source == "default" and rows[k].value == rows[k].default for k in LEARNED_FROM), group
        values = effective_thresholds(group)
        assert {k: values[k] for k in LEARNED_FROM} == {k: DEFAULT_THRESHOLDS[k] for k in LEARNED_FROM}
    few = _rows(_g({"learn_min_runs": 4}, True, learned))["attention_z_growth_floor"].detail
    assert "3 finished healthy runs" in few and "learn_min_runs is 4" in few and "c (a warning loss_spike" in few
    assert "learning is off" in _rows(_g({}, False, learned))["attention_z_growth_floor"].detail
    # a group that never set learn_thresholds learns (the service's default, LEARN_BY_DEFAULT)
    assert _rows(_g({}, None, learned))["attention_z_growth_floor"].source == "learned"
    lone = learn([RunHealth(1, "a", "finished", 2.0)], {(1, "attention_z"): 40.0})
    assert _rows(_g({}, True, lone))["attention_z_growth_floor"].source == "default"  # 1 < 2 runs
    more = _rows(GroupThresholds({"learn_multiple": 5}, True, learned))["attention_z_growth_floor"]
    assert (more.source, more.value) == ("learned", 150.0)


# -- through the service -------------------------------------------------------------------------
def _run(
    client: TestClient, name: str, group: str | None, head_peak: float, finish: bool = True, loss_offset: float = 0.0
) -> dict[str, Any]:
    """A run of four logged steps; its heads' max LSE peaks at ``head_peak`` (step 2); its loss is
    ``loss_offset`` above the others'."""
    run = create_run(client, name, **({"group": group} if group else {}))
    for step in range(4):
        head = head_peak if step == 2 else 8.0
        pts: list[dict[str, object]] = [
            {"name": "loss", "step": step, "value": 3.0 - 0.1 * step + loss_offset},
            {"name": "attention_z", "layer": 0, "step": step, "value": 20.0 + step},
            {"name": "attention_lse_max", "layer": 0, "step": step, "value": head},
            {"name": "attention_lse_max.h0", "layer": 0, "step": step, "value": head},
            {"name": "attention_lse_max.h1", "layer": 0, "step": step, "value": 7.0},
        ]
        post_points(client, name, pts)
    if finish:
        r = client.patch(f"/api/v1/runs/{run['id']}", json={"status": "finished"}, headers=AUTH)
        assert r.status_code == 200, r.text
    return run


def _family(client: TestClient, learn_on: bool = True) -> int:
    body = {"name": "fam", "learn_thresholds": learn_on, "thresholds": {"learn_multiple": MULTIPLE}}
    r = client.post("/api/v1/groups", json=body, headers=AUTH)
    assert r.status_code == 201 and r.json()["learn_thresholds"] is learn_on, r.text
    gid = int(r.json()["id"])
    _run(client, "h1", "fam", 18.0)
    _run(client, "h2", "fam", 20.0)
    _run(client, "blew-up", "fam", 80.0, loss_offset=0.5)  # a critical ceiling incident, and a loss 0.5 behind
    _run(client, "still-running", "fam", 45.0, finish=False)
    return gid


def _thresholds(client: TestClient, gid: int) -> dict[str, dict[str, Any]]:
    r = client.get(f"/api/v1/groups/{gid}/thresholds")
    assert r.status_code == 200, r.text
    return {row["key"]: row for row in r.json()}


def test_the_route_lists_every_threshold_with_its_source(client: TestClient) -> None:
    gid = _family(client)
    body = {"thresholds": {"growth_factor": 3, "learn_multiple": MULTIPLE}}
    r = client.patch(f"/api/v1/groups/{gid}", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    rows = _thresholds(client, gid)
    assert set(rows) == set(DEFAULT_THRESHOLDS)
    assert set(rows["spike_window"]) == {"key", "value", "source", "default", "detail"}
    ceiling = rows["attention_lse_max_limit"]
    assert (ceiling["source"], ceiling["value"], ceiling["default"]) == ("learned", MULTIPLE * 20.0, LIMIT)
    assert "2 finished healthy runs: h1, h2" in ceiling["detail"] and "run h2" in ceiling["detail"]
    assert rows["attention_z_growth_floor"]["value"] == MULTIPLE * 23.0
    assert (rows["growth_factor"]["source"], rows["growth_factor"]["value"]) == ("override", 3.0)
    assert rows["spike_window"]["source"] == "default"
    assert client.get("/api/v1/groups/99999/thresholds").status_code == 404
    # learning off: the defaults again, at once (what was read stays for when it is turned back on)
    assert client.patch(f"/api/v1/groups/{gid}", json={"learn_thresholds": False}, headers=AUTH).status_code == 200
    assert _thresholds(client, gid)["attention_lse_max_limit"]["source"] == "default"
    assert client.patch(f"/api/v1/groups/{gid}", json={"learn_thresholds": None}, headers=AUTH).status_code == 200
    assert client.get(f"/api/v1/groups/{gid}").json()["learn_thresholds"] is None
    assert _thresholds(client, gid)["attention_lse_max_limit"]["source"] == "learned"  # unset: learning by default


def test_a_run_that_finishes_or_stops_being_finished_changes_what_is_learned(client: TestClient) -> None:
    gid = _family(client)
    _run(client, "h3", "fam", 30.0)
    assert _thresholds(client, gid)["attention_lse_max_limit"]["value"] == MULTIPLE * 30.0
    h3 = client.get("/api/v1/runs", params={"group": "fam"}).json()
    (h3_id,) = [r["id"] for r in h3 if r["name"] == "h3"]
    assert client.patch(f"/api/v1/runs/{h3_id}", json={"status": "failed"}, headers=AUTH).status_code == 200
    assert _thresholds(client, gid)["attention_lse_max_limit"]["value"] == MULTIPLE * 20.0


def test_detectors_and_exported_gauges_use_the_learned_ceiling_and_floor(client: TestClient) -> None:
    _family(client)
    create_run(client, "new", group="fam")
    create_run(client, "alone")
    for name in ("new", "alone"):  # 55: above the default ceiling of 50, below the learned 60
        post_points(client, name, [{"name": "attention_lse_max.h0", "layer": 0, "step": 1, "value": 55.0}])
    fired = {a["run"] for a in client.get("/api/v1/alerts", params={"rule": "logit_ceiling"}).json()}
    assert fired == {"alone", "blew-up"}  # not "new": its group learned a ceiling of 60
    # a climb of attention Z from 7 to 65 over 16 logged points (9.3x, past the growth factor): past the
    # default floor of 50, below the floor of 3 x 23 = 69 learned from h1 and h2
    for step in range(2, 18):
        z = 7.0 * (65.0 / 7.0) ** ((step - 2) / 15)
        for name in ("new", "alone"):
            post_points(client, name, [{"name": "attention_z", "layer": 0, "step": step, "value": z}])
    fired = {a["run"] for a in client.get("/api/v1/alerts", params={"rule": "z_growth"}).json()}
    assert fired == {"alone"}
    metrics = client.get("/metrics").text
    assert f'hyperwatch_run_logit_ceiling{{project="default",run="new"}} {MULTIPLE * 20.0}' in metrics
    assert f'hyperwatch_run_logit_ceiling{{project="default",run="alone"}} {LIMIT}' in metrics
    assert f'hyperwatch_run_attention_z_growth_floor{{project="default",run="new"}} {MULTIPLE * 23.0}' in metrics


def test_without_learning_the_same_runs_change_nothing(client: TestClient) -> None:
    gid = _family(client, learn_on=False)
    rows = _thresholds(client, gid)
    assert rows.pop("learn_multiple")["source"] == "override"
    assert all(row["source"] == "default" for row in rows.values())
    create_run(client, "new", group="fam")
    post_points(client, "new", [{"name": "attention_lse_max.h0", "layer": 0, "step": 1, "value": 55.0}])
    fired = {a["run"] for a in client.get("/api/v1/alerts", params={"rule": "logit_ceiling"}).json()}
    assert "new" in fired
    assert client.patch(f"/api/v1/groups/{gid}", json={"learn_thresholds": True}, headers=AUTH).status_code == 200
    assert _thresholds(client, gid)["attention_lse_max_limit"]["source"] == "learned"  # read when turned on


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"thresholds": {"learn_multiple": 0}}, "learn_multiple"),
        ({"thresholds": {"learn_multiple": -2.5}}, "learn_multiple"),
        ({"thresholds": {"learn_multiple": "Infinity"}}, "learn_multiple"),
        ({"thresholds": {"learn_min_runs": 0}}, "learn_min_runs"),
        ({"thresholds": {"learn_min_runs": 1.5}}, "learn_min_runs"),
        ({"learn_thresholds": "yes"}, "learn_thresholds"),
    ],
)
def test_learning_settings_are_validated_naming_the_field_and_the_fix(
    client: TestClient, body: dict[str, Any], field: str
) -> None:
    r = client.post("/api/v1/groups", json={"name": "bad", **body}, headers=AUTH)
    assert r.status_code == 422 and field in r.json()["message"], r.text
    if field != "learn_thresholds":
        assert "leave it out" in r.json()["message"]
