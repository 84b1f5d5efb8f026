"""The live stream (GET /api/v1/live) on SQLite and PostgreSQL: only points after the cursor travel,
read by the same rules as the first read (so a live page and a reload draw the same numbers)."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hyperwatch.monitor.api.routes import live as live_route
from hyperwatch.monitor.read import live, live_notify
from hyperwatch.monitor.read.lines import aggregate_series
from hyperwatch.monitor.store import SqlStore
from tests.monitor.conftest import create_run, post_points

LAYERS = 3


def _z(step: int, layer: int) -> float | str:
    if step == 7 and layer == 1:
        return "NaN"
    return float(10 + step + 5 * layer)


def _seed(client: TestClient, name: str, steps: range, **fields: Any) -> int:
    run = create_run(client, name, total_steps=20, tokens=20_000, **fields)
    pts: list[dict[str, object]] = []
    for s in steps:
        pts += [{"name": "attention_z", "layer": la, "step": s, "tokens": 1000 * (s + 1), "value": _z(s, la)}
                for la in range(LAYERS)]  # fmt: skip
        pts.append({"name": "loss", "layer": None, "step": s, "tokens": 1000 * (s + 1), "value": 5.0 - 0.1 * s})
    post_points(client, name, pts)
    return int(run["id"])  # type: ignore[call-overload]


def _live(client: TestClient, **params: Any) -> dict[str, Any]:
    params.setdefault("wait", 0)
    r = client.get("/api/v1/live", params=params)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_only_points_after_the_cursor_travel(client: TestClient, store: SqlStore) -> None:
    rid = _seed(client, "r", range(10))
    body = _live(client, cursor=f"{rid}:4", name=["attention_z", "loss"], line=["mean", "max", "heat", "2"])
    (run,) = body["runs"]
    assert run["cursor"] == 9 and run["last_step"] == 9 and run["status"] == "running"
    z = run["series"]["attention_z"]
    assert z["mean"]["step"] == [5, 6, 7, 8, 9]
    assert z["max"]["y"] == [25.0, 26.0, "NaN", 28.0, 29.0]  # a NaN layer makes the bucket NaN, faithfully
    assert z["mean"]["y"][0] == 20.0  # (15 + 20 + 25) / 3
    assert z["2"]["y"] == [25.0, 26.0, 27.0, 28.0, 29.0]
    assert z["heat"]["layers"] == [0, 1, 2] and z["heat"]["z"][1][2] == "NaN"
    assert run["series"]["loss"]["run"]["step"] == [5, 6, 7, 8, 9]
    # the same numbers the whole read gives for those steps
    full = aggregate_series(store, store.get_run(rid), "attention_z", "mean", 1000)
    same = {s: v for s, v in zip(full.steps, full.values, strict=True) if s > 4 and math.isfinite(v)}
    assert {s: v for s, v in zip(z["mean"]["step"], z["mean"]["y"], strict=True) if s != 7} == same


def test_buckets_of_every_steps_keep_spikes(client: TestClient) -> None:
    rid = _seed(client, "b", range(20))
    z = _live(client, cursor=f"{rid}:-1", name="attention_z", line="max", every=4)["runs"][0]["series"]["attention_z"]
    assert z["max"]["step"] == [0, 4, 8, 12, 16]
    assert z["max"]["y"] == [23.0, "NaN", 31.0, 35.0, 39.0]  # each bucket's largest value; a NaN stays


def test_x_axes_and_unmoved_runs(client: TestClient) -> None:
    rid = _seed(client, "x", range(6))
    got = _live(client, cursor=f"{rid}:2", name="loss", x="tokens")["runs"][0]["series"]["loss"]["run"]
    assert got["x"] == [4000, 5000, 6000]
    frac = _live(client, cursor=f"{rid}:2", name="loss", x="fraction")["runs"][0]["series"]["loss"]["run"]
    assert frac["x"] == [0.2, 0.25, 0.3]
    quiet = _live(client, cursor=f"{rid}:5:running", name="loss")["runs"][0]
    assert quiet["series"] == {} and quiet["cursor"] == 5


def test_status_change_and_alerts_travel(client: TestClient) -> None:
    rid = _seed(client, "s", range(3))
    r = client.patch(
        f"/api/v1/runs/{rid}",
        json={"status": "finished"},
        headers={"Authorization": "Bearer test-write-token-0123456789"},
    )
    assert r.status_code == 200, r.text
    run = _live(client, cursor=f"{rid}:2:running", name="loss", wait=5)["runs"][0]
    assert run["status"] == "finished" and run["series"] == {}
    post_points(client, "s", [{"name": "loss", "layer": None, "step": 3, "value": "NaN"}])
    run = _live(client, cursor=f"{rid}:2", name="loss")["runs"][0]
    assert run["series"]["loss"]["run"]["y"] == ["NaN"]
    assert any(a["rule"] == "nan_loss" and a["step"] == 3 for a in run["alerts"])
    newest = max(a["id"] for a in run["alerts"])
    assert _live(client, cursor=f"{rid}:2", name="loss", alert_after=newest)["runs"][0]["alerts"] == []


def test_group_lists_runs_without_a_cursor(client: TestClient) -> None:
    a = _seed(client, "ga", range(3), group="g1")
    b = _seed(client, "gb", range(3), group="g1")
    gid = client.get(f"/api/v1/runs/{a}").json()["group_id"]
    body = _live(client, group_id=gid, cursor=f"{a}:0", name="loss")
    assert body["added"] == [b]
    assert [r["id"] for r in body["runs"]] == [a] and body["runs"][0]["series"]["loss"]["run"]["step"] == [1, 2]


def test_bad_input_names_the_field(client: TestClient) -> None:
    rid = _seed(client, "e", range(2))
    r = client.get("/api/v1/live", params={"cursor": "12-4", "name": "loss", "wait": 0})
    assert r.status_code in (400, 422) and "cursor" in r.text and "<run_id>" in r.text
    r = client.get("/api/v1/live", params={"cursor": f"{rid}:0", "name": "loss", "line": "median", "wait": 0})
    assert r.status_code in (400, 422) and "line" in r.text
    r = client.get("/api/v1/live", params={"name": "loss", "wait": 0})
    assert r.status_code in (400, 422) and "cursor" in r.text
    assert client.get("/api/v1/live", params={"cursor": "999:0", "name": "loss", "wait": 0}).status_code == 404


def test_documented_in_openapi(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    op = spec["paths"]["/api/v1/live"]["get"]
    assert "cursor" in op["description"] and {p["name"] for p in op["parameters"]} >= {
        "cursor",
        "name",
        "every",
        "wait",
    }


def test_raw_points_path_equals_the_downsampled_reads(
    client: TestClient, store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small delta is read as raw points and bucketed here; a large one by the store's downsampled
    reads (one new step: the series index's latest points). All give the same lines, heatmap and layer
    for every x-axis and bucket width."""
    rid = _seed(client, "same", range(20))
    post_points(client, "same", [{"name": "attention_z", "layer": 2, "step": 13, "tokens": 14000, "value": "Infinity"}])
    post_points(client, "same", [{"name": "loss", "layer": None, "step": 20, "tokens": 21000, "value": "-Infinity"}])
    for every, x, after in ((1, "step", 2), (3, "tokens", 2), (4, "fraction", 2), (1, "step", 19), (1, "tokens", 19)):
        params = {"cursor": f"{rid}:{after}", "name": ["attention_z", "loss"], "line": ["mean", "max", "heat", "1"],
                  "every": every, "x": x}  # fmt: skip
        fast = _live(client, **params)["runs"][0]["series"]
        monkeypatch.setattr(live, "FAST_STEPS", 0)
        slow = _live(client, **params)["runs"][0]["series"]
        monkeypatch.undo()
        assert fast == slow, (every, x, after)
        assert fast["loss"]["run"]["y"][-1] == "-Infinity" and (after == 19 or fast["attention_z"]["max"]["y"])


def test_news_wakes_a_waiter_from_another_thread() -> None:
    """A batch announced by another thread (the points route's loop) sets the waiting request's event;
    a run nobody waits on is only counted."""
    news = live_notify.LiveNews()

    async def waiter() -> bool:
        task = asyncio.ensure_future(news.wait_any([7, 8], timeout=60))
        while 8 not in news._waiters:  # registered: now announce from another thread
            await asyncio.sleep(0)
        threading.Thread(target=news.bump, args=(8,)).start()
        return await task

    assert asyncio.run(waiter()) is True
    assert news.count(8) == 1 and news._waiters == {}  # the waiter left no trace
    news.bump(9, alerts=2)
    assert news.count(9) == 1 and news.alerts(9) == 2 and news.count(7) == 0 and news.alerts(8) == 0
    assert asyncio.run(news.wait_any([7], timeout=0)) is False  # nothing announced for 7: the timeout


def test_a_waiting_page_is_answered_by_the_next_batch(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """The long poll waits on the process's news (no fallback read within the test) and answers the
    step posted meanwhile."""
    rid = _seed(client, "w", range(3))
    monkeypatch.setattr(live_route, "FALLBACK_S", 30.0)
    got: list[dict[str, Any]] = []
    ask = threading.Thread(target=lambda: got.append(_live(client, cursor=f"{rid}:2:running", name="loss", wait=30)))
    ask.start()
    while rid not in live_notify.news._waiters:  # the request is waiting on its run
        ask.join(0.01)
        assert ask.is_alive(), got
    before = live_notify.news.count(rid)
    post_points(client, "w", [{"name": "loss", "layer": None, "step": 3, "value": 4.5}])
    ask.join()
    assert live_notify.news.count(rid) == before + 1
    (run,) = got[0]["runs"]
    assert run["cursor"] == 3 and run["series"]["loss"]["run"]["y"] == [4.5]
    assert rid not in live_notify.news._waiters


def test_the_stream_moves_the_cursor_itself(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """GET /api/v1/live/stream: one request, one server-sent event per answer; each answer carries only
    the steps after the previous one (the stream moved the cursor), and the stream ends after `wait`
    with a last answer."""
    rid = _seed(client, "s", range(3))
    monkeypatch.setattr(live_route, "FALLBACK_S", 30.0)
    raw: list[str] = []
    params = {"cursor": f"{rid}:2:running", "name": "loss", "wait": 3, "gap": 0}
    ask = threading.Thread(target=lambda: raw.append(client.get("/api/v1/live/stream", params=params).text))
    ask.start()
    seen: set[object] = set()
    for step in (3, 4):
        while not (waiting := set(live_notify.news._waiters.get(rid, ())) - seen):  # the stream waits anew
            ask.join(0.01)
            assert ask.is_alive(), raw
        seen |= waiting
        post_points(client, "s", [{"name": "loss", "layer": None, "step": step, "value": 5.0 - step}])
    ask.join()
    events = [json.loads(e.removeprefix("data: ")) for e in raw[0].split("\n\n") if e.startswith("data: ")]
    steps = [ev["runs"][0]["series"].get("loss", {}).get("run", {}).get("step", []) for ev in events]
    assert steps[:2] == [[3], [4]] and all(s == [] for s in steps[2:]), steps
    assert [ev["runs"][0]["cursor"] for ev in events[:2]] == [3, 4]
    r = client.get("/api/v1/live/stream", params={"cursor": f"{rid}:1", "name": "loss", "gap": 99})
    assert r.status_code in (400, 422) and "gap" in r.text
