"""Reads: min/max downsampling (spikes and endpoints survive), comparisons, the layer matrix, filters."""

from __future__ import annotations

import math
import uuid

import pytest
from fastapi.testclient import TestClient

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store import SqlStore
from tests.monitor.conftest import AUTH, create_run, post_points

N = 20_000
SPIKE_UP, SPIKE_DOWN, NAN_AT, INF_AT = 777, 13_333, 5_000, 9_000


def _value(step: int) -> float:
    if step == SPIKE_UP:
        return 1e4
    if step == SPIKE_DOWN:
        return -1e4
    if step == NAN_AT:
        return math.nan
    if step == INF_AT:
        return math.inf
    return 50.0 + 5.0 * math.sin(step / 300.0) + (step % 7) * 0.1


@pytest.fixture
def long_run(store: SqlStore) -> int:
    run, _ = store.upsert_run("default", "long", {})
    pts = [Point("attention_z", s, _value(s), layer=0, tokens=s * 100) for s in range(N)]
    for i in range(0, N, 10_000):
        store.ingest(run.id, uuid.uuid4().hex, pts[i : i + 10_000])
    return run.id


@pytest.mark.parametrize(
    ("buckets", "start", "end"), [(100, None, None), (10, None, None), (3, None, None), (50, 1001, 18_999)]
)
def test_downsampling_keeps_spikes_endpoints_and_nonfinite(
    store: SqlStore, long_run: int, buckets: int, start: int | None, end: int | None
) -> None:
    s = store.series(long_run, "attention_z", 0, buckets, start, end)
    assert s.downsampled
    steps = [p.step for p in s.points]
    lo, hi = start or 0, N - 1 if end is None else end
    assert steps == sorted(set(steps))
    assert steps[0] == lo and steps[-1] == hi  # first and last kept
    by_step = {p.step: p.value for p in s.points}
    if lo <= SPIKE_UP:
        assert by_step[SPIKE_UP] == 1e4
    assert by_step[SPIKE_DOWN] == -1e4  # spikes survive, both ways
    assert math.isnan(by_step[NAN_AT]) and by_step[INF_AT] == math.inf  # events always kept
    for p in s.points:  # nothing invented: every point is a stored point
        expected = _value(p.step)
        assert (math.isnan(expected) and math.isnan(p.value)) or p.value == expected
        assert p.tokens == p.step * 100
    assert len(s.points) <= 2 * buckets + 2 + 2


def test_downsampling_matches_brute_force_per_bucket_shape(store: SqlStore, long_run: int) -> None:
    """Each returned finite point is the min or max of the points around it (a bucket's extreme)."""
    s = store.series(long_run, "attention_z", 0, 100, None, None)
    finite = [p for p in s.points if math.isfinite(p.value)]
    values = [_value(i) for i in range(N)]
    top = max(v for v in values if math.isfinite(v))
    bottom = min(v for v in values if math.isfinite(v))
    assert max(p.value for p in finite) == top and min(p.value for p in finite) == bottom
    # The returned maxima trace the envelope: every 1000-step window's largest value is matched or
    # beaten by a returned point near it (its bucket: 200 steps, edges snapped to 16-step blocks).
    for w0 in range(0, N - 1000, 1000):
        window_max = max(v for v in values[w0 : w0 + 1000] if math.isfinite(v))
        near = [p.value for p in finite if w0 - 216 <= p.step < w0 + 1216]
        assert max(near) >= window_max


def test_overwrite_keeps_rollups_exact(store: SqlStore, long_run: int) -> None:
    store.ingest(long_run, uuid.uuid4().hex, [Point("attention_z", SPIKE_UP, 50.0, layer=0, tokens=SPIKE_UP * 100)])
    s = store.series(long_run, "attention_z", 0, 10, None, None)
    assert max(p.value for p in s.points if math.isfinite(p.value)) < 100


def test_short_series_is_returned_whole(store: SqlStore) -> None:
    run, _ = store.upsert_run("default", "short", {})
    store.ingest(run.id, uuid.uuid4().hex, [Point("loss", s, 3.0 - s / 1000) for s in range(0, 300, 3)])
    s = store.series(run.id, "loss", None, 200, None, None)
    assert not s.downsampled and len(s.points) == 100


def test_compare_on_each_x_axis(client: TestClient) -> None:
    create_run(client, "small", group="sweep", tokens=1000, flops=6e9, total_steps=10)
    create_run(client, "large", group="sweep", tokens=4000, flops=9.6e10, total_steps=40)
    post_points(
        client, "small", [{"name": "loss", "step": s, "tokens": s * 100, "value": 4 - s / 10} for s in range(11)]
    )
    post_points(
        client, "large", [{"name": "loss", "step": s, "tokens": s * 100, "value": 4 - s / 20} for s in range(41)]
    )
    runs = client.get("/api/v1/runs", params={"group": "sweep"}).json()
    ids = [r["id"] for r in runs]
    expect = {
        "step": (10, 40),
        "tokens": (1000, 4000),
        "flops": (6e9, 9.6e10),
        "fraction": (1.0, 1.0),
    }
    for axis, (small_last, large_last) in expect.items():
        r = client.get("/api/v1/compare", params={"name": "loss", "x": axis, "run_id": ids})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["x"] == axis and [s["run"] for s in body["series"]] == ["small", "large"]
        assert body["series"][0]["points"][-1]["x"] == pytest.approx(small_last)
        assert body["series"][1]["points"][-1]["x"] == pytest.approx(large_last)
    group_id = client.get("/api/v1/groups").json()[0]["id"]
    by_group = client.get("/api/v1/compare", params={"name": "loss", "group_id": group_id, "x": "fraction"}).json()
    assert len(by_group["series"]) == 2
    assert by_group["series"][1]["points"][20]["x"] == pytest.approx(0.5)


def test_compare_says_which_run_lacks_a_field(client: TestClient) -> None:
    run = create_run(client, "bare")
    post_points(client, "bare", [{"name": "loss", "step": 1, "value": 3.0}])
    r = client.get("/api/v1/compare", params={"name": "loss", "x": "flops", "run_id": str(run["id"])})
    assert r.status_code == 422
    assert "bare" in r.json()["message"] and "PATCH" in r.json()["message"]
    assert client.get("/api/v1/compare", params={"name": "loss"}).status_code == 422


def test_layer_matrix(client: TestClient) -> None:
    run = create_run(client, "layers")
    pts = []
    for step in range(50):
        for layer in range(4):
            value: object = 10.0 + layer
            if (layer, step) == (2, 30):
                value = 500.0
            if (layer, step) == (1, 10):
                value = "NaN"
            pts.append({"name": "attention_z", "layer": layer, "step": step, "value": value})
    post_points(client, "layers", pts)
    m = client.get(f"/api/v1/runs/{run['id']}/layers", params={"name": "attention_z", "buckets": 10}).json()
    assert m["layers"] == [0, 1, 2, 3]
    assert m["bucket_width"] == 5 and m["bucket_starts"][:3] == [0, 5, 10]
    assert len(m["values"]) == 4 and all(len(row) == 10 for row in m["values"])
    assert m["values"][2][6] == 500.0  # the spike is the max of its cell
    assert m["values"][1][2] == "NaN"  # a NaN marks its cell
    assert m["values"][0][0] == 10.0 and m["values"][3][9] == 13.0


def test_run_filters_and_updates(client: TestClient) -> None:
    a = create_run(client, "a", tags=["dense", "d8"], depth=8, optimizer="muonh", parameterization="hyperp")
    create_run(client, "b", tags=["moe"], project="other")
    assert a["depth"] == 8 and a["tags"] == ["d8", "dense"]
    assert [r["name"] for r in client.get("/api/v1/runs", params={"tag": ["dense", "d8"]}).json()] == ["a"]
    assert [r["name"] for r in client.get("/api/v1/runs", params={"project": "other"}).json()] == ["b"]
    r = client.patch(f"/api/v1/runs/{a['id']}", json={"status": "finished", "summary": {"val_loss": 3.1}}, headers=AUTH)
    assert r.status_code == 200 and r.json()["status"] == "finished" and r.json()["summary"] == {"val_loss": 3.1}
    assert [r["name"] for r in client.get("/api/v1/runs", params={"status": "finished"}).json()] == ["a"]
    assert client.patch(f"/api/v1/runs/{a['id']}", json={"status": "exploded"}, headers=AUTH).status_code == 422
    assert client.get("/api/v1/runs/99999").status_code == 404
    # Upsert by (project, name): same name again updates, does not duplicate.
    again = client.post("/api/v1/runs", json={"name": "a", "width": 1024}, headers=AUTH)
    assert again.status_code == 200 and again.json()["id"] == a["id"] and again.json()["width"] == 1024
    idx = client.get(f"/api/v1/runs/{a['id']}/series_index").json()
    assert idx == []


@pytest.mark.parametrize(("n", "buckets"), [(5000, 1), (5000, 5), (5000, 50), (4096, 1), (4096, 16), (4096, 256)])
def test_spikes_in_the_open_tail_survive_downsampling(store: SqlStore, n: int, buckets: int) -> None:
    """Rollups exist for sealed blocks only: extremes in the still-open blocks are read from the points.

    With 4,096 steps the last block of each level ends exactly at the latest step, which seals it
    (the edge case of the rule); with 5,000 the open tail is read from the points.
    """
    run, _ = store.upsert_run("default", "tail", {})
    spike, dip = n - 6, 4000

    def value(s: int) -> float:
        return 1e6 if s == spike else (-1e6 if s == dip else float(s % 13))

    for first in range(0, n, 128):  # appended as training does
        store.ingest(run.id, uuid.uuid4().hex, [Point("loss", s, value(s)) for s in range(first, min(n, first + 128))])
    got = {p.step: p.value for p in store.series(run.id, "loss", None, buckets, None, None).points}
    assert got[spike] == 1e6 and got[dip] == -1e6
    assert all(v == value(s) for s, v in got.items())


def test_heads_by_layer_at_the_newest_step_keep_nan_and_say_what_is_missing(client: TestClient) -> None:
    """GET /runs/{id}/heads: each head's attention_lse_max at the run's newest logged step, per layer.
    A head that reported at an older step only is null at the newest one; NaN stays NaN."""
    run = create_run(client, "heads")
    old = [{"name": f"attention_lse_max.h{h}", "layer": la, "step": 0, "value": 1.0} for la in (0, 1) for h in range(3)]
    new = [{"name": f"attention_lse_max.h{h}", "layer": la, "step": 10, "value": 10.0 * la + h}
           for la in (0, 1) for h in range(3) if (la, h) != (1, 2)]  # fmt: skip
    new[1]["value"] = "NaN"  # layer 0, head 1 (the wire's spelling of a NaN)
    post_points(client, "heads", old)
    post_points(client, "heads", [*new, {"name": "attention_lse_max", "layer": 0, "step": 10, "value": 2.0}])
    body = client.get(f"/api/v1/runs/{run['id']}/heads").json()
    assert body["name"] == "attention_lse_max" and body["step"] == 10
    assert body["layers"] == [0, 1] and body["heads"] == [0, 1, 2]
    assert body["values"] == [[0.0, "NaN", 2.0], [10.0, 11.0, None]]
    empty = create_run(client, "no-heads")
    assert client.get(f"/api/v1/runs/{empty['id']}/heads").json() == {
        "run_id": empty["id"], "name": "attention_lse_max", "step": None, "layers": [], "heads": [], "values": [],
    }  # fmt: skip
    assert client.get("/api/v1/runs/999999/heads").status_code == 404
