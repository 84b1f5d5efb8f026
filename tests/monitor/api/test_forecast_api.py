"""GET /api/v1/groups/{id}/forecast and /runs/{id}/forecast, the forecast_band alert through the ingest
route, and ``hyperwatch forecast`` (the same numbers, on SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hyperwatch.cli import main
from hyperwatch.monitor.analysis.forecast import forecast
from hyperwatch.monitor.store import SqlStore
from tests.monitor.conftest import AUTH, create_run, post_points

STEPS = 20
PARAMS = {2: 156_544, 3: 457_152, 4: 1_021_184, 5: 1_935_040, 6: 3_285_120}
WIGGLE = {156_544: 1.0, 457_152: 1.06, 1_021_184: 0.95, 1_935_040: 1.03}
"""Each smaller size off the power law by a few percent: the band has a width to stand inside."""


def z(size: float, fraction: float) -> float:
    """Mean-over-layers attention Z of a run: grows with size (x^0.7) and over training."""
    return 0.05 * size**0.7 * (0.5 + fraction) * WIGGLE.get(size, 1.0)


def layer_points(size: float, steps: range, scale: float = 1.0) -> list[dict[str, Any]]:
    """Two layers at z -+ 10% (their mean is z), and a run-level loss."""
    pts: list[dict[str, Any]] = []
    for s in steps:
        v = scale * z(size, (s + 1) / STEPS)
        pts += [{"name": "attention_z", "layer": 0, "step": s, "value": 0.9 * v},
                {"name": "attention_z", "layer": 1, "step": s, "value": 1.1 * v},
                {"name": "loss", "step": s, "value": 3.0}]  # fmt: skip
    return pts


def seed(c: TestClient, depths: tuple[int, ...] = (2, 3, 4, 5), nan_depth: int | None = None) -> int:
    for d in depths:
        size = PARAMS[d]
        create_run(c, f"d{d}", group="ladder", depth=d, total_params=size, total_steps=STEPS, tokens=8192 * STEPS,
                   flops=6.0 * size * 8192 * STEPS)  # fmt: skip
        pts = layer_points(size, range(STEPS))
        if d == nan_depth:
            pts[3 * 7]["value"] = "NaN"
        post_points(c, f"d{d}", pts)
        r = c.post("/api/v1/runs", json={"name": f"d{d}", "status": "finished"}, headers=AUTH)
        assert r.status_code == 200, r.text
    return int(next(g["id"] for g in c.get("/api/v1/groups").json() if g["name"] == "ladder"))


def test_group_forecast_fits_the_peaks_at_the_target(client: TestClient) -> None:
    gid = seed(client, nan_depth=5)
    seed_nothing = client.post("/api/v1/runs", json={"name": "no-size", "group": "ladder"}, headers=AUTH)
    assert seed_nothing.status_code == 201
    r = client.get(f"/api/v1/groups/{gid}/forecast", params={"params": 3.3e6, "name": "attention_z"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["axis"] == "params" and body["target"] == 3.3e6 and body["matched"]["fraction"] == 1.0
    assert body["skipped"] == [{"run": "no-size", "run_id": body["skipped"][0]["run_id"],
                                "reason": "no total_params; set it on the run"}]  # fmt: skip
    ind = body["indicators"]["attention_z"]
    assert ind["threshold"] == 1000.0 and ind["threshold_key"] == "attention_z_limit"
    peak = ind["peak"]
    # the d5 run's peak is NaN (a layer at step 7): shown, left out; three sizes remain
    assert [p["used"] for p in peak["points"]] == [True, True, True, False] and peak["points"][3]["value"] == "NaN"
    sizes = [PARAMS[d] for d in (2, 3, 4)]
    expected = forecast("attention_z", sizes, [z(s, 1.0) for s in sizes], ["d2", "d3", "d4"], target=3.3e6,
                        threshold=1000.0)  # fmt: skip
    assert expected.fit is not None and expected.crossing is not None
    assert peak["fit"]["exponent"] == pytest.approx(expected.fit.slope, rel=1e-9)
    assert (peak["predicted"], peak["lower"], peak["upper"]) == pytest.approx(
        (expected.predicted, expected.lower, expected.upper), rel=1e-9
    )
    assert peak["lower"] < z(3.3e6, 1.0) < peak["upper"]
    assert peak["crossing"]["status"] == "crosses"
    assert peak["crossing"]["size"] == pytest.approx(expected.crossing.size, rel=1e-9)
    assert peak["sentence"] == expected.sentence()[:-1] + "; left out: d5 (peak is NaN)."
    assert peak["sentence"].startswith("peak attention Z: ") and "left out: d5 (peak is NaN)" in peak["sentence"]
    assert ind["final"]["summary"] == "final" and ind["final"]["fit"]["n_sizes"] == 4  # its final value is finite
    assert len(peak["curve"]["size"]) == 60 and body["watched"] == [] and body["held_out"] == []


def test_the_forecast_against_flops_and_the_groups_own_threshold(client: TestClient) -> None:
    gid = seed(client)
    r = client.patch(f"/api/v1/groups/{gid}", json={"thresholds": {"attention_z_limit": 5000}}, headers=AUTH)
    assert r.status_code == 200, r.text
    body = client.get(f"/api/v1/groups/{gid}/forecast", params={"flops": 1e15, "name": "attention_z"}).json()
    peak = body["indicators"]["attention_z"]["peak"]
    assert body["axis"] == "flops" and peak["threshold"] == 5000.0
    assert [p["size"] for p in peak["points"]] == [6.0 * PARAMS[d] * 8192 * STEPS for d in (2, 3, 4, 5)]
    assert "predicted at 1e+15 FLOPs" in peak["sentence"] and "crosses 5,000 at about" in peak["sentence"]
    # no target: the fit and the crossing only
    bare = client.get(f"/api/v1/groups/{gid}/forecast", params={"name": "attention_z"}).json()
    assert bare["target"] is None and bare["indicators"]["attention_z"]["peak"]["predicted"] is None


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"params": 1e9, "flops": 1e21}, "params, flops"),
        ({"params": -5}, "params"),
        ({"params": "inf"}, "params"),
        ({"level": 1.5}, "level"),
        ({"name": "bad name!"}, "name"),
        ({"buckets": 10**9}, "buckets"),
    ],
)
def test_bad_queries_are_422_naming_the_field(sqlite_client: TestClient, params: dict[str, Any], field: str) -> None:
    gid = seed(sqlite_client, depths=(2, 3))
    r = sqlite_client.get(f"/api/v1/groups/{gid}/forecast", params=params)
    assert r.status_code == 422, r.text
    assert field in r.text
    assert sqlite_client.get("/api/v1/groups/999/forecast").status_code == 404


def test_two_sizes_say_not_enough_runs(sqlite_client: TestClient) -> None:
    gid = seed(sqlite_client, depths=(2, 4))
    peak = sqlite_client.get(f"/api/v1/groups/{gid}/forecast").json()["indicators"]["attention_z"]["peak"]
    assert peak["fit"] is None and peak["sentence"] == (
        "peak attention Z: not enough runs: 2 sizes with a finite, positive peak (need 3)."
    )


def alerts(c: TestClient) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = c.get("/api/v1/alerts", params={"rule": "forecast_band"}).json()
    return sorted(found, key=lambda a: a["step"])


def test_a_larger_run_leaving_its_band_raises_one_alert_per_episode(client: TestClient) -> None:
    """d6 trains after d2..d5 finished: inside its band, then above it (one alert), still above (none),
    back inside, above again (a second alert); a batch sent twice raises nothing more."""
    client.app.state.forecast_watches.refresh_s = 0.0  # type: ignore[attr-defined]  # rebuilt after every batch
    gid = seed(client)
    big = PARAMS[6]
    create_run(client, "d6", group="ladder", depth=6, total_params=big, total_steps=STEPS, status="running")
    post_points(client, "d6", layer_points(big, range(0, 4)))  # inside; starts the watch
    assert alerts(client) == []
    watch = client.get("/api/v1/runs/{}/forecast".format(client.get("/api/v1/runs").json()[-1]["id"])).json()
    assert watch["watched"] is True and [c["run"] for c in watch["compared_with"]] == ["d2", "d3", "d4", "d5"]
    assert watch["indicators"]["attention_z"]["now"]["standing"] == "inside"
    post_points(client, "d6", layer_points(big, range(4, 6), scale=4.0))
    first = alerts(client)
    assert [(a["step"], a["run"], a["name"], a["layer"]) for a in first] == [(4, "d6", "attention_z", None)]
    a = first[0]
    assert a["value"] == pytest.approx(4.0 * z(big, 5 / STEPS)) and a["value"] > a["baseline"]
    assert a["severity"] == "warning" and a["source"] == "service"
    assert a["message"].startswith(f"attention_z (mean over layers) is {a['value']:.4g} at step 4 (25% of training)")
    assert "smaller sizes of group 'ladder' give for 3.29M params" in a["message"]
    post_points(client, "d6", layer_points(big, range(6, 7), scale=4.0))  # the episode goes on: no alert
    post_points(client, "d6", layer_points(big, range(7, 9)))  # back inside
    batch = uuid.uuid4().hex
    post_points(client, "d6", layer_points(big, range(9, 10), scale=4.0), batch_id=batch)
    post_points(client, "d6", layer_points(big, range(9, 10), scale=4.0), batch_id=batch)  # a duplicate
    assert [a["step"] for a in alerts(client)] == [4, 9]
    run_id = first[0]["run_id"]
    now = client.get(f"/api/v1/runs/{run_id}/forecast").json()["indicators"]["attention_z"]["now"]
    assert now["standing"] == "above" and now["fraction"] == pytest.approx(0.5)
    # the group's forecast holds the training run out of its fit and shows where it stands
    body = client.get(f"/api/v1/groups/{gid}/forecast", params={"name": "attention_z"}).json()
    assert body["held_out"][0]["run"] == "d6" and body["watched"][0]["indicators"]["attention_z"]["now"] == now
    assert len(body["indicators"]["attention_z"]["peak"]["points"]) == 4


def test_a_run_that_is_not_the_largest_is_not_watched(sqlite_client: TestClient) -> None:
    c = sqlite_client
    c.app.state.forecast_watches.refresh_s = 0.0  # type: ignore[attr-defined]
    seed(c, depths=(2, 4, 5, 6))
    create_run(c, "d3", group="ladder", depth=3, total_params=PARAMS[3], total_steps=STEPS, status="running")
    for lo in range(0, STEPS, 5):
        post_points(c, "d3", layer_points(PARAMS[3], range(lo, lo + 5), scale=10.0))
    assert alerts(c) == []
    run_id = next(r["id"] for r in c.get("/api/v1/runs").json() if r["name"] == "d3")
    body = c.get(f"/api/v1/runs/{run_id}/forecast").json()
    assert body["watched"] is False and body["reason"].startswith("not watched: a run is compared with the forecast")


def test_the_cli_prints_the_apis_numbers(sqlite_client: TestClient, sqlite_store: SqlStore, capsys: Any) -> None:
    gid = seed(sqlite_client)
    api = sqlite_client.get(f"/api/v1/groups/{gid}/forecast", params={"params": 7e9}).json()
    url = sqlite_store.engine.url.render_as_string(hide_password=False)
    assert main(["forecast", "--db", url, "--group", "ladder", "--params", "7e9", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == api
    assert main(["forecast", "--db", url, "--group", "ladder", "--params", "7B"]) == 0
    out = capsys.readouterr().out
    peak = api["indicators"]["attention_z"]["peak"]
    assert out.startswith("group default/ladder: forecast at 7B params, 90% band, mean over layers")
    assert peak["sentence"] in out and "attention_z" in out.splitlines()[2]
    assert main(["forecast", "--db", url, "--group", "missing"]) == 1
    assert "no group 'missing' in project 'default'" in capsys.readouterr().err


def test_the_cli_reads_the_service_over_http(sqlite_store: SqlStore, capsys: Any) -> None:
    from tests.monitor.conftest import make_client
    from tests.web.conftest import serve

    c = make_client(sqlite_store)
    seed(c)
    gid = int(c.get("/api/v1/groups").json()[0]["id"])
    api = c.get(f"/api/v1/groups/{gid}/forecast", params={"params": 1.3e9, "name": "attention_z"}).json()
    server, thread, base = serve(sqlite_store)
    try:
        args = ["forecast", "--server", base, "--group", "ladder", "--params", "1.3B", "--name", "attention_z"]
        assert main([*args, "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == api
        assert main([*args, "--project", "other"]) == 1
        assert f"no group 'ladder' in project 'other' at {base}" in capsys.readouterr().err
    finally:
        server.should_exit = True
        thread.join(10)
    assert main(["forecast", "--server", base, "--group", "ladder"]) == 1  # the service is gone
    assert "listing the groups failed" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # argparse refuses it before any request
        main(["forecast", "--group", "ladder", "--level", "1.2"])
    assert exc.value.code == 2 and "between 0 and 1" in capsys.readouterr().err
