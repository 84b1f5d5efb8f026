"""The read layer shared by the API and the pages: matched verdicts, run lifecycle, heatmap buckets."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from hyperwatch.app import create_app
from hyperwatch.hooks.schema import RUN_STATUSES, Point
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.read.lines import (
    is_stale,
    layer_matrix,
    match_runs,
    stability_records,
    tokens_seen,
    x_values,
)
from hyperwatch.monitor.store import SqlStore, migrate


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    s = SqlStore(f"sqlite:///{tmp_path / 'views.db'}")
    migrate.upgrade(s.engine)
    yield s
    s.close()


def _run(store: SqlStore, name: str, depth: int, status: str, z: list[float], total_steps: int | None = 10) -> int:
    fields = {"group": "g", "depth": depth, "total_params": depth * 1000, "status": status, "tokens": 10_000}
    if total_steps is not None:
        fields["total_steps"] = total_steps
    run, _ = store.upsert_run("p", name, fields)
    pts = [Point("attention_z", step, v, layer=0) for step, v in enumerate(z)]
    pts += [Point("loss", step, 9.0 - step * 0.1 + depth) for step in range(len(z))]  # larger model: higher loss
    store.ingest(run.id, f"b-{name}", pts)
    return run.id


def test_unfinished_runs_are_compared_at_the_fraction_the_slowest_reached(store: SqlStore) -> None:
    # the small model finished (Z ends at 50); the large one is 30% in, where the small one was at 20
    _run(store, "small", 2, "finished", [20, 20, 20, 30, 40, 50, 50, 50, 50, 50])
    _run(store, "large", 4, "running", [20, 21, 22])
    runs = store.list_runs(group="g")
    m = match_runs(runs)
    assert m.fraction == pytest.approx(0.3) and m.reason is None
    records, skipped, _ = stability_records(store, runs, ["attention_z"], "total_params", "mean", 100)
    by_run = {r["run"]: r["indicators"]["attention_z"] for r in records}
    assert by_run["small"] == [20, 20, 20, 20]  # steps 0..2 and their last value: not the finished 50
    assert skipped == []


def test_no_verdict_before_runs_finish_or_reach_ten_percent(store: SqlStore) -> None:
    _run(store, "small", 2, "finished", [20] * 10, total_steps=100)
    _run(store, "large", 4, "running", [20] * 5, total_steps=100)
    _run(store, "nosteps", 8, "running", [20] * 5, total_steps=None)
    m = match_runs(store.list_runs(group="g"))
    assert m.reason is not None and "n/a until runs finish" in m.reason and "large at 5%" in m.reason
    assert [p["run"] for p in m.pending] == ["nosteps"]


def test_group_stability_api_says_why_and_judges_loss_by_its_final_value(store: SqlStore) -> None:
    _run(store, "small", 2, "finished", [20] * 10)
    _run(store, "large", 4, "running", [20], total_steps=20)  # 5% in
    url = store.engine.url.render_as_string(hide_password=False)
    app = create_app(Settings(database_url=url, dev_mode=True), store=store, registry=CollectorRegistry())
    with TestClient(app) as c:
        gid = c.get("/api/v1/groups").json()[0]["id"]
        early = c.get(f"/api/v1/groups/{gid}/stability").json()
        assert early["report"] is None and early["matched"]["reason"].startswith("n/a until runs finish")
        page = c.get(f"/ui/data/groups/{gid}/compare", params={"name": "attention_z"}).json()
        assert page["stability"]["meta"]["verdict"] is None and "n/a" in page["stability"]["layout"]["title"]["text"]
        large = store.list_runs(group="g")[1]
        store.ingest(large.id, "b-rest", [Point("loss", s, 9.0 - s * 0.1 + 4) for s in range(1, 10)])
        store.ingest(large.id, "b-z", [Point("attention_z", s, 20.0, layer=0) for s in range(1, 10)])
        store.update_run(large.id, {"status": "finished"})
        done = c.get(f"/api/v1/groups/{gid}/stability", params={"name": ["loss", "attention_z"]}).json()
    loss = done["report"]["indicators"]["loss"]
    assert loss["peak"]["values"] == loss["final"]["values"]  # no peak verdict on loss
    assert done["report"]["indicators"]["attention_z"]["verdict"] == "transferable"
    assert done["matched"] == {"fraction": 1.0, "pending": [], "reason": None}


def test_stale_runs_and_tokens_seen(store: SqlStore) -> None:
    rid = _run(store, "r", 2, "running", [20, 21, 22])
    run = store.get_run(rid)
    now = datetime.now(UTC)
    assert not is_stale(run, 60, now) and is_stale(run, 60, now + timedelta(seconds=61))
    assert not is_stale(store.update_run(rid, {"status": "interrupted"}), 60, now + timedelta(hours=1))
    assert tokens_seen(run) == 3000  # 10,000 tokens over 10 steps, 3 steps stored
    url = store.engine.url.render_as_string(hide_password=False)
    app = create_app(
        Settings(database_url=url, dev_mode=True, stale_after_s=0.001), store=store, registry=CollectorRegistry()
    )
    with TestClient(app) as c:
        store.update_run(rid, {"status": "running"})
        [out] = c.get("/api/v1/runs").json()
        assert out["stale"] is True and out["tokens_seen"] == 3000
        for status in sorted(RUN_STATUSES):  # one list: every status the hooks send is accepted
            assert c.patch(f"/api/v1/runs/{rid}", json={"status": status}).status_code == 200, status
        assert c.patch(f"/api/v1/runs/{rid}", json={"status": "exploded"}).status_code == 422


def test_heatmap_buckets_follow_the_logging_interval(store: SqlStore) -> None:
    run, _ = store.upsert_run("p", "every2", {})
    store.ingest(run.id, "b", [Point("attention_z", s, float(s), layer=la) for s in range(0, 40, 2) for la in (0, 1)])
    raw = store.layer_matrix(run.id, "attention_z", 300, None, None)
    assert raw.bucket_width == 1 and any(v is None for v in raw.values[0])  # the striped matrix
    m = layer_matrix(store, store.get_run(run.id), "attention_z", 300)
    assert m.bucket_width == 2 and all(v is not None for row in m.values for v in row)
    assert m.bucket_starts == list(range(0, 40, 2))


def test_one_x_axis_rule_for_api_and_pages(store: SqlStore) -> None:
    run, _ = store.upsert_run("p", "r", {"tokens": 0, "total_steps": 10})
    assert x_values(run, [0, 5], [None, None], "fraction") == [0.0, 0.5]  # tokens 0 = unknown, like None
