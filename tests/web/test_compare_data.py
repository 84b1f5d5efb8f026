"""The comparison page's JSON (/ui/data/compare) and the pages' read path, on SQLite and PostgreSQL:
the numbers the pages draw are the API's, runs of different groups and projects share one chart,
bad input names the field, read auth holds."""
# ruff: noqa: F811 (the SQLite/PostgreSQL fixtures of tests/monitor, imported below, are test parameters)

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hyperwatch.monitor.store import SqlStore
from tests.monitor.conftest import (  # noqa: F401
    AUTH,
    READ_TOKEN,
    client,
    create_run,
    db_url,
    make_client,
    pg_url,
    sqlite_url,
    store,
)


def _post(client: TestClient, project: str, run: str, points: list[dict[str, object]]) -> None:
    body = {"batch_id": uuid.uuid4().hex, "run": run, "points": points}
    r = client.post("/api/v1/points", params={"project": project}, json=body, headers=AUTH)
    assert r.status_code in (200, 201), r.text


def _seed(client: TestClient) -> tuple[int, int]:
    """Run a (project one, group arm-a) and run b (project two, group arm-b, a NaN at step 6 layer 2)."""
    a = create_run(client, "a", project="one", group="arm-a", tokens=10_000, total_steps=10, flops=6e9)
    b = create_run(client, "b", project="two", group="arm-b", tokens=20_000, total_steps=10, flops=2e10)
    for project, name, scale in (("one", "a", 1.0), ("two", "b", 2.0)):
        pts: list[dict[str, object]] = []
        for s in range(10):
            tok = int(1000 * scale) * (s + 1)
            for la in range(3):
                v: float | str = "NaN" if (name, s, la) == ("b", 6, 2) else scale * (s + la)
                pts.append({"name": "attention_z", "layer": la, "step": s, "tokens": tok, "value": v})
            pts.append({"name": "loss", "layer": None, "step": s, "tokens": tok, "value": 4.0 - 0.1 * s * scale})
        _post(client, project, name, pts)
    return int(a["id"]), int(b["id"])  # type: ignore[call-overload]


def _lines(body: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {t["meta"]["run_id"]: t for t in body["figure"]["data"] if t.get("meta", {}).get("smooth")}


@pytest.mark.parametrize("x", ["step", "tokens", "flops", "fraction"])
def test_one_layer_equals_the_api(client: TestClient, x: str) -> None:
    a, b = _seed(client)
    page = client.get("/ui/data/compare", params={"run_id": [a, b], "name": "attention_z", "layer": "2", "x": x})
    assert page.status_code == 200, page.text
    api = client.get("/api/v1/compare", params={"run_id": [a, b], "name": "attention_z", "layer": 2, "x": x}).json()
    lines = _lines(page.json())
    for series in api["series"]:
        line = lines[series["run_id"]]
        want = [(p["x"], p["value"]) for p in series["points"] if isinstance(p["value"], float)]
        got = [(xv, yv) for xv, yv in zip(line["x"], line["y"], strict=True) if yv is not None]
        assert [g[0] for g in got] == pytest.approx([w[0] for w in want])
        assert [g[1] for g in got] == pytest.approx([w[1] for w in want])
    assert lines[b]["name"] == "two/arm-b/b" and lines[a]["name"] == "one/arm-a/a"
    # the NaN of run b at step 6 is a red marker, not a dropped point
    marks = [t for t in page.json()["figure"]["data"] if t.get("meta", {}).get("nonfinite")]
    assert marks and marks[0]["text"] == ["NaN"]


def test_mean_and_max_over_layers_and_what_runs_offer(client: TestClient) -> None:
    a, b = _seed(client)
    body = client.get("/ui/data/compare", params={"run_id": [a, b], "name": "attention_z", "layer": "max"}).json()
    assert body["names"] == ["attention_z", "loss"] and body["layers"] == 3
    assert _lines(body)[a]["y"] == [float(s + 2) for s in range(10)]
    mean = client.get("/ui/data/compare", params={"run_id": [a], "name": "attention_z", "layer": "mean"}).json()
    assert _lines(mean)[a]["y"] == pytest.approx([s + 1.0 for s in range(10)])
    assert body["live"][str(b)]["step"] == 9 and body["live"][str(b)]["every"] == 1
    assert "max over layers" in body["figure"]["layout"]["title"]["text"]


def test_bad_input_names_the_field(client: TestClient) -> None:
    a, _ = _seed(client)
    r = client.get("/ui/data/compare", params={"run_id": [a], "name": "attention_z", "layer": "7"})
    assert r.status_code in (400, 422) and "layer" in r.text and "(2)" in r.text
    r = client.get("/ui/data/compare", params={"run_id": [a], "name": "attention_z", "layer": "median"})
    assert r.status_code == 422 and "layer" in r.text
    r = client.get("/ui/data/compare", params={"name": "attention_z"})
    assert r.status_code == 422 and "run_id" in r.text
    assert client.get("/ui/data/compare", params={"run_id": [999], "name": "loss"}).status_code == 404


def test_pages_need_the_read_token(store: SqlStore) -> None:
    c = make_client(store, read_token=READ_TOKEN)
    run = c.post("/api/v1/runs", json={"name": "r"}, headers=AUTH)
    rid = run.json()["id"]
    for path, params in (("/ui/data/compare", {"run_id": rid}), (f"/ui/data/runs/{rid}/indicator", {"name": "loss"})):
        assert c.get(path, params=params).status_code == 401
        ok = c.get(path, params=params, headers={"Authorization": f"Bearer {READ_TOKEN}"})
        assert ok.status_code == 200, ok.text
    live = c.get("/api/v1/live", params={"cursor": f"{rid}:-1", "name": "loss", "wait": 0})
    assert live.status_code == 401


def test_compare_page_shell(client: TestClient) -> None:
    html = client.get("/compare").text
    assert 'id="fig-compare"' in html and "compare.js" in html and 'href="/compare"' in html
