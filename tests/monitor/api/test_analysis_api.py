"""GET /api/v1/groups/{id}/analysis and /stability over runs stored in the service."""

from __future__ import annotations

import math
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hyperwatch.monitor.store import SqlStore
from tests.monitor.conftest import AUTH, READ_TOKEN, create_run, make_client, post_points

DEPTHS = (8, 12, 16)
LRS = (0.005, 0.01, 0.02, 0.04, 0.08)
TOKENS = 10**9


def params(depth: int) -> int:
    return 12 * (128 * depth) ** 2 * depth


def loss(depth: int, lr: float, method: str) -> float:
    """A parabola in ln(lr) with its optimum at 0.02 * (8/depth)^0.5; "muon" is 5% worse."""
    opt = 0.02 * (8 / depth) ** 0.5
    return (3.6 - 0.3 * math.log(depth / 8) + 0.05 * math.log(lr / opt) ** 2) * (1.05 if method == "muon" else 1.0)


def seed_sweep(c: TestClient) -> int:
    for method in ("hyperp", "muon"):
        for depth in DEPTHS:
            for lr in LRS:
                create_run(
                    c,
                    f"{method}-d{depth}-lr{lr:g}",
                    group="sweep",
                    depth=depth,
                    lr=lr,
                    tokens=TOKENS,
                    flops=6.0 * params(depth) * TOKENS,
                    total_params=params(depth),
                    config={"optim": {"arm": method}, "train": {"batch_tokens": 8192}},
                    summary={"val_loss": loss(depth, lr, method)},
                )
    groups = c.get("/api/v1/groups").json()
    return int(next(g["id"] for g in groups if g["name"] == "sweep"))


def test_analysis_fits_sweeps_transfer_and_scaling(client: TestClient) -> None:
    gid = seed_sweep(client)
    create_run(client, "no-loss-yet", group="sweep", depth=8, lr=0.02)
    r = client.get(f"/api/v1/groups/{gid}/analysis", params={"baseline": "muon"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["methods"] == ["hyperp", "muon"] and body["baseline"] == "muon"
    assert body["skipped"] == [
        {"run": "no-loss-yet", "run_id": body["skipped"][0]["run_id"], "reason": "no val_loss (summary or points)"}
    ]
    rec = next(x for x in body["runs"] if x["run"] == "hyperp-d8-lr0.02")
    assert rec["method"] == "hyperp" and rec["batch_size"] == 8192 and rec["tokens"] == TOKENS
    a = body["analysis"]
    assert a["n_runs"] == 30 and len(a["sweeps"]) == 6
    for s in a["sweeps"]:
        assert s["fit"]["method"] == "quadratic"
        assert s["fit"]["optimal_lr"] == pytest.approx(0.02 * (8 / s["depth"]) ** 0.5, rel=1e-6)
    depth_laws = [law for law in a["transfer_laws"] if law["axis"] == "depth"]
    assert len(depth_laws) == 2 and all(law["fit"]["b"] == pytest.approx(-0.5, abs=1e-4) for law in depth_laws)
    scaling = a["scaling"]
    assert set(scaling["methods"]) == {"hyperp", "muon"}
    lev = scaling["leverage"]["hyperp"]
    assert len(lev) == 3 and all(p["rho"] > 1 for p in lev)  # hyperp reaches muon's loss with less compute


def test_val_loss_comes_from_the_latest_point_without_a_summary(sqlite_client: TestClient) -> None:
    c = sqlite_client
    for i, lr in enumerate((0.01, 0.02, 0.04)):
        create_run(c, f"r{i}", group="g", lr=lr, depth=8)
        post_points(
            c,
            f"r{i}",
            [{"name": "val_loss", "step": s, "value": 9.0 if s == 0 else 3.0 + (i - 1) ** 2 * 0.1} for s in (0, 10)],
        )
    gid = c.get("/api/v1/groups").json()[0]["id"]
    body = c.get(f"/api/v1/groups/{gid}/analysis").json()
    assert sorted(r["val_loss"] for r in body["runs"]) == pytest.approx([3.0, 3.1, 3.1])
    assert body["analysis"]["sweeps"][0]["fit"]["optimal_lr"] == pytest.approx(0.02, rel=1e-6)
    assert body["analysis"]["scaling"] is None  # no flops recorded


def test_analysis_errors(sqlite_client: TestClient) -> None:
    c = sqlite_client
    gid = seed_sweep(c)
    r = c.get(f"/api/v1/groups/{gid}/analysis", params={"baseline": "adamw"})
    assert r.status_code == 422 and "baseline: 'adamw'" in r.json()["message"] and "hyperp" in r.json()["message"]
    assert c.get("/api/v1/groups/999/analysis").status_code == 404
    empty = c.post("/api/v1/groups", json={"name": "empty"}, headers=AUTH).json()["id"]
    assert c.get(f"/api/v1/groups/{empty}/analysis").json()["analysis"] is None


def _ladder(c: TestClient, nan_at_largest: bool = False) -> int:
    for depth in DEPTHS:
        create_run(c, f"d{depth}", group="ladder", depth=depth, total_params=params(depth), status="finished")
        pts = []
        for step in range(40):
            for layer in range(2):
                v = 50.0 * (8 / depth) + layer + (5.0 if step == 20 else 0.0)
                value: float | str = "NaN" if nan_at_largest and depth == 16 and step == 30 and layer == 1 else v
                pts.append({"name": "attention_z", "layer": layer, "step": step, "value": value})
                pts.append({"name": "mlp_rms", "layer": layer, "step": step, "value": 0.5 * (depth / 8)})  # grows
        post_points(c, f"d{depth}", pts)
    create_run(c, "unsized", group="ladder")
    return int(next(g["id"] for g in c.get("/api/v1/groups").json() if g["name"] == "ladder"))


def test_stability_verdict_over_stored_runs(client: TestClient) -> None:
    gid = _ladder(client)
    r = client.get(f"/api/v1/groups/{gid}/stability")
    assert r.status_code == 200, r.text
    body = r.json()
    assert [x["run"] for x in body["runs"]] == ["d8", "d12", "d16"]
    assert body["skipped"][0]["run"] == "unsized" and "total_params" in body["skipped"][0]["reason"]
    ind = body["report"]["indicators"]
    assert set(ind) == {"attention_z", "mlp_rms"}  # the others are not stored
    az = ind["attention_z"]
    assert az["verdict"] == "transferable"
    # peak: the spike at step 20 survives; mean over the 2 layers (+0.5)
    base = [50.0 * 8 / d for d in DEPTHS]
    assert az["peak"]["values"] == pytest.approx([b + 5.5 for b in base])
    assert az["final"]["values"] == pytest.approx([b + 0.5 for b in base])  # exact: the layers' latest points
    assert ind["mlp_rms"]["verdict"] == "breaks" and ind["mlp_rms"]["breaks_at"] == params(12)
    assert body["report"]["transferable"] is False
    by_max = client.get(f"/api/v1/groups/{gid}/stability", params={"agg": "max", "name": "attention_z"}).json()
    assert by_max["report"]["indicators"]["attention_z"]["final"]["values"][0] == pytest.approx(51.0)
    by_depth = client.get(f"/api/v1/groups/{gid}/stability", params={"scale": "depth"}).json()
    assert by_depth["report"]["indicators"]["attention_z"]["peak"]["scales"] == [8, 12, 16]


def test_a_nan_breaks_stability_at_its_scale(sqlite_client: TestClient) -> None:
    gid = _ladder(sqlite_client, nan_at_largest=True)
    az = sqlite_client.get(f"/api/v1/groups/{gid}/stability").json()["report"]["indicators"]["attention_z"]
    assert az["verdict"] == "breaks" and az["breaks_at"] == params(16)
    assert az["peak"]["values"][-1] == "NaN" and az["final"]["values"][-1] != "NaN"


@pytest.mark.parametrize(
    ("params_", "needle"),
    [
        ({"scale": "height"}, "scale"),
        ({"agg": "median"}, "agg"),
        ({"name": "bogus"}, "unknown metric name"),
        ({"buckets": 5}, "buckets"),
        ({"buckets": 10**6}, "HYPERWATCH_MAX_BUCKETS"),
        ({"rtol": -1}, "rtol"),
    ],
)
def test_stability_validates(sqlite_client: TestClient, params_: dict[str, Any], needle: str) -> None:
    gid = _ladder(sqlite_client)
    r = sqlite_client.get(f"/api/v1/groups/{gid}/stability", params=params_)
    assert r.status_code == 422 and needle in r.text


def test_analysis_routes_need_the_read_token(sqlite_store: SqlStore) -> None:
    c = make_client(sqlite_store, read_token=READ_TOKEN)
    gid = c.post("/api/v1/groups", json={"name": "g"}, headers=AUTH).json()["id"]
    for path in (f"/api/v1/groups/{gid}/analysis", f"/api/v1/groups/{gid}/stability"):
        assert c.get(path).status_code == 401
        assert c.get(path, headers={"Authorization": f"Bearer {READ_TOKEN}"}).status_code == 200
