"""A live page's one new step from memory (``store.newest_points``; monitor/store/ingest.py's LatestSteps).

The values this process stored are served only while the run's row holds the ingest token they were
recorded with; anything else (another process's batch, a cold cache, a name the cache lacks) is a
read of ``series_latest``. Each test compares with a plain dict of what was sent (last write wins per
key) on SQLite and PostgreSQL; two stores on one database stand for two service processes.
"""

from __future__ import annotations

import math
import random
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.read import live
from hyperwatch.monitor.store import SqlStore, migrate
from tests.monitor.conftest import create_run, post_points

Ref = dict[tuple[str, int | None], dict[int, float]]
Newest = list[tuple[str, int | None, float]]


def _send(store: SqlStore, run_id: int, ref: Ref, points: list[Point]) -> None:
    store.ingest(run_id, uuid.uuid4().hex, points)
    for p in points:
        ref.setdefault((p.name, p.layer), {})[p.step] = p.value


def _at(ref: Ref, step: int) -> dict[tuple[str, int | None], float]:
    return {key: steps[step] for key, steps in ref.items() if step in steps}


def _same(got: Newest | None, ref: Ref, step: int) -> None:
    """``got`` is each series' point at ``step``, NaN and infinities as sent, in list_series order."""
    assert got is not None
    want = _at(ref, step)
    assert [(n, la) for n, la, _v in got] == sorted(want, key=lambda k: (k[0], -1 if k[1] is None else k[1]))
    for name, layer, v in got:
        w = want[(name, layer)]
        assert v == w or (math.isnan(v) and math.isnan(w)), (name, layer, v, w)


def _reads(store: SqlStore) -> tuple[int, int]:
    return store.latest_steps.read_hits, store.latest_steps.read_misses


def test_one_process_serves_its_own_batches_from_memory(db_url: str) -> None:
    """Late steps leave the newest points alone; a re-sent newest step replaces them; NaN, +Inf and -Inf
    come back as sent; a series logged less often is absent from a step it skipped."""
    store = SqlStore(db_url)
    migrate.upgrade(store.engine)
    try:
        run, _ = store.upsert_run("default", "one", {})
        ref: Ref = {}
        _send(store, run.id, ref, [Point("loss", 0, 1.0)])  # names new to the database: read, not cached
        for step in range(1, 6):
            pts = [Point("attention_z", step, 10.0 * step + la, layer=la) for la in range(3)]
            pts.append(Point("loss", step, 5.0 - step))
            if step % 2 == 0:
                pts.append(Point("val_loss", step, 4.0))
            _send(store, run.id, ref, pts)
        _same(store.newest_points(run.id, 5), ref, 5)
        hits = _reads(store)[0]
        odd = [Point("attention_z", 6, math.nan, layer=1), Point("attention_z", 6, -math.inf, layer=2)]
        _send(store, run.id, ref, [*odd, Point("attention_z", 6, 1.0, layer=0), Point("loss", 6, math.inf)])
        _same(store.newest_points(run.id, 6), ref, 6)
        _send(store, run.id, ref, [Point("attention_z", 3, 99.0, layer=la) for la in range(3)])  # late
        _send(store, run.id, ref, [Point("loss", 6, 2.5), Point("attention_z", 6, 7.0, layer=2)])  # re-sent
        _same(store.newest_points(run.id, 6), ref, 6)
        got = [(n, la, repr(v)) for n, la, v in store.newest_points(run.id, 6) or []]
        assert got == [("attention_z", 0, "1.0"), ("attention_z", 1, "nan"), ("attention_z", 2, "7.0"),
                       ("loss", None, "2.5")]  # fmt: skip
        assert _reads(store)[0] >= hits + 3  # from memory, not a read
        assert store.newest_points(run.id, 5) is None  # the run has moved past step 5
    finally:
        store.close()


@pytest.mark.parametrize("seed", [0, 1])
def test_two_processes_never_see_stale_points(db_url: str, seed: int) -> None:
    """Two stores write one run in turns (new steps, re-sent newest steps, late steps, a series only
    one of them writes): after every batch, each answers the other's points exactly."""
    a, b = SqlStore(db_url), SqlStore(db_url)
    migrate.upgrade(a.engine)
    try:
        run, _ = a.upsert_run("default", "shared", {})
        rng = random.Random(seed)
        ref: Ref = {}
        top = 0
        for _turn in range(50):
            writer = (a, b)[rng.random() < 0.5]
            resend = rng.random() < 0.3 and top  # the newest step again, other values
            steps = [top - 1] if resend else list(range(top, top + rng.randint(1, 3)))
            if rng.random() < 0.2:
                steps.append(rng.randrange(top + 1))  # a late step
            top = max(top, max(steps) + 1)
            value = lambda: rng.choice([math.nan, math.inf, -math.inf, rng.gauss(0, 1)])  # noqa: E731
            pts = [Point("attention_z", s, value(), layer=la) for s in steps for la in range(2)]
            if writer is b and rng.random() < 0.5:
                pts.append(Point("router_z", max(steps), value(), layer=0))
            _send(writer, run.id, ref, pts)
            for reader in (a, b):
                _same(reader.newest_points(run.id, top - 1), ref, top - 1)
        assert _reads(a)[0] and _reads(b)[0]  # each served its own batches from memory
        assert _reads(a)[1] and _reads(b)[1]  # and read the other's
    finally:
        a.close()
        b.close()


def test_a_rolled_back_batch_is_never_served(db_url: str) -> None:
    store = SqlStore(db_url)
    migrate.upgrade(store.engine)
    try:
        run, _ = store.upsert_run("default", "rollback", {})
        ref: Ref = {}
        for step in range(3):
            _send(store, run.id, ref, [Point("loss", step, float(step))])

        def broken(_reader: object) -> list[object]:
            raise RuntimeError("detector failed")

        with pytest.raises(RuntimeError):
            store.ingest(run.id, "lost", [Point("loss", 2, 99.0), Point("loss", 3, 99.0)], detector=broken)
        _same(store.newest_points(run.id, 2), ref, 2)
        assert store.newest_points(run.id, 3) is None
    finally:
        store.close()


def _live(client: TestClient, **params: Any) -> dict[str, Any]:
    r = client.get("/api/v1/live", params={"wait": 0, **params})
    assert r.status_code == 200, r.text
    run: dict[str, Any] = r.json()["runs"][0]
    return run


def test_the_one_step_answer_equals_the_read_answer(
    client: TestClient, store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through GET /api/v1/live: the newest step, overwritten and with NaN/Inf, answered from memory, is
    what the raw-points path reads from the database, and another process's batch is answered too."""
    run = create_run(client, "page", total_steps=20, tokens=20_000)
    rid = int(run["id"])  # type: ignore[call-overload]
    for step in range(6):
        pts = [{"name": "attention_z", "layer": la, "step": step, "value": float(step + la)} for la in range(3)]
        post_points(client, "page", [*pts, {"name": "loss", "layer": None, "step": step, "value": 1.0}])
    resent = [{"name": "attention_z", "layer": 1, "step": 5, "value": "NaN"},
              {"name": "loss", "layer": None, "step": 5, "value": "-Infinity"}]  # fmt: skip
    post_points(client, "page", resent)
    post_points(client, "page", [{"name": "attention_z", "layer": 2, "step": 2, "value": 50.0}])  # late
    params = {"cursor": f"{rid}:4", "name": ["attention_z", "loss"], "line": ["mean", "max", "heat", "2"]}
    hits = store.latest_steps.read_hits
    fast = _live(client, **params)["series"]
    assert store.latest_steps.read_hits == hits + 1
    assert fast["attention_z"]["max"]["y"] == ["NaN"] and fast["loss"]["run"]["y"] == ["-Infinity"]
    assert fast["attention_z"]["heat"]["z"] == [[5.0], ["NaN"], [7.0]] and fast["attention_z"]["2"]["y"] == [7.0]
    monkeypatch.setattr(live, "FAST_STEPS", 0)  # the downsampled reads of the database
    assert _live(client, **params)["series"] == fast
    monkeypatch.undo()
    other = SqlStore(store.engine.url.render_as_string(hide_password=False))  # another replica
    try:
        other.ingest(rid, "elsewhere", [Point("attention_z", 6, 3.0, layer=la) for la in range(3)])
    finally:
        other.close()
    misses = store.latest_steps.read_misses
    got = _live(client, cursor=f"{rid}:5", name=["attention_z", "loss"], line=["max"])
    assert got["cursor"] == 6 and got["series"] == {"attention_z": {"max": {"step": [6], "x": [6], "y": [3.0]}}}
    assert store.latest_steps.read_misses == misses + 1
