"""The runs list's summaries (issue 35): GET /api/v1/runs?summary=loss,val_loss gives each run's latest
value and its smallest and largest values with their steps, on SQLite and PostgreSQL.

The extremes are checked against every stored point (``chunks.all_points``) with the minimum and the
maximum placed in each part of a series the store keeps apart (monitor.store.summary: the level-3,
level-2 and level-1 rollups and the hot tail), with NaN (never an extreme), +-Inf (an extreme like
any value) and ties (the earliest step). This is the contract of ``Store.series_summaries``: a change
of storage format must keep it."""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from hyperwatch.hooks.schema import Point, encode_value
from hyperwatch.monitor.store import SqlStore, chunks
from hyperwatch.monitor.store.engine import managed
from hyperwatch.monitor.store.models import RUN_LEVEL_LAYER, MetricChunkRow, MetricNameRow

STEPS = 5000
# latest step 4999; with rollups of 16, 256 and 4096 steps: level-3 rollups cover 0-4095, level-2
# 4096-4863, level-1 4864-4991, hot points 4992-4999 (other levels: other places, the same truth)
PLACES = {"l3": 100, "l2": 4200, "l1": 4900, "hot": 4995}
HIGH = {"l3": 4996, "l2": 10, "l1": 4300, "hot": 4870}  # each run's max lies elsewhere than its min


def _loss(place: str, step: int) -> float:
    if step == PLACES[place]:
        return 0.25
    if step == HIGH[place]:
        return 9.0
    if step in (7, 4998):
        return math.nan  # never an extreme, and the l3 run's last value
    return 3.0 - step * 1e-4 + (step % 5) * 0.01


def _fill(store: SqlStore, run_id: int, values: dict[str, Any]) -> None:
    """STEPS steps of each name in ``values`` (name -> step -> value) in 500-step batches."""
    for start in range(0, STEPS, 500):
        pts = [Point(n, s, f(s)) for s in range(start, start + 500) for n, f in values.items()]
        store.ingest(run_id, uuid.uuid4().hex, pts)


def _truth(store: SqlStore, run_id: int, name: str) -> dict[str, Any]:
    """The summary from every stored point of the run-level series (a scan, for the check)."""
    with managed(store.engine, "read every point") as conn:
        nid = conn.execute(MetricNameRow.__table__.select().where(MetricNameRow.name == name)).first()
        assert nid is not None
        pts = [
            (s, v) for _r, n, la, s, _t, v in chunks.all_points(conn, run_id) if n == nid[0] and la == RUN_LEVEL_LAYER
        ]
    values = [(s, math.nan if v is None else v) for s, v in sorted(pts)]
    finite = [(v, s) for s, v in values if not math.isnan(v)]
    lo = min(finite, key=lambda x: (x[0], x[1]), default=None)
    hi = min(finite, key=lambda x: (-x[0], x[1]), default=None)
    last_step, last = values[-1]
    return {
        "last": encode_value(last),
        "last_step": last_step,
        "min": None if lo is None else encode_value(lo[0]),
        "min_step": None if lo is None else lo[1],
        "max": None if hi is None else encode_value(hi[0]),
        "max_step": None if hi is None else hi[1],
    }


def _listed(client: TestClient, **params: Any) -> dict[str, dict[str, Any]]:
    r = client.get("/api/v1/runs", params=params)
    assert r.status_code == 200, r.text
    return {run["name"]: run["metrics"] for run in r.json()}


def test_summaries_equal_a_scan_of_every_point_wherever_the_extremes_lie(client: TestClient, store: SqlStore) -> None:
    ids = {}
    for place in PLACES:
        run, _ = store.upsert_run("default", f"min-in-{place}", {})
        ids[place] = run.id
        _fill(store, run.id, {"loss": lambda s, p=place: _loss(p, s)})
    odd, _ = store.upsert_run("default", "odd", {})
    odd_pts = [Point("loss", s, v) for s, v in enumerate([2.0, -math.inf, 1.0, math.inf, 1.0, math.inf, 5.0])]
    odd_pts += [Point("val_loss", s, math.nan) for s in range(3)]  # logged, never a number
    odd_pts += [Point("loss", 2, 7.0, layer=0)]  # a per-layer series of the name is not the run-level one
    store.ingest(odd.id, uuid.uuid4().hex, odd_pts)
    store.upsert_run("default", "silent", {})

    got = _listed(client, summary="loss,val_loss")
    for place, rid in ids.items():
        truth = _truth(store, rid, "loss")
        assert got[f"min-in-{place}"] == {"loss": truth}, place
        assert (truth["min"], truth["min_step"]) == (0.25, PLACES[place])
        assert (truth["max"], truth["max_step"]) == (9.0, HIGH[place])
    assert got["min-in-l3"]["loss"]["last"] == 3.0 - 4999 * 1e-4 + 4 * 0.01
    assert got["odd"] == {
        "loss": {"last": 5.0, "last_step": 6, "min": "-Infinity", "min_step": 1, "max": "Infinity", "max_step": 3},
        "val_loss": {"last": "NaN", "last_step": 2, "min": None, "min_step": None, "max": None, "max_step": None},
    }
    assert got["odd"]["loss"] == _truth(store, odd.id, "loss")
    assert got["silent"] == {}  # logged nothing: no entry, not zeros
    # a NaN last value is sent as "NaN"; ties go to the earliest step
    tie, _ = store.upsert_run("default", "tie", {})
    store.ingest(tie.id, "b1", [Point("loss", s, v) for s, v in enumerate([3.0, 1.0, 2.0, 1.0, math.nan])])
    assert _listed(client, summary="loss")["tie"]["loss"] == {
        "last": "NaN", "last_step": 4, "min": 1.0, "min_step": 1, "max": 3.0, "max_step": 0
    }  # fmt: skip
    # without summary=, no summaries are read or sent
    assert all(m == {} for m in _listed(client).values())


def test_the_summary_comes_from_summary_rows_not_from_every_point(
    sqlite_client: TestClient, sqlite_store: SqlStore
) -> None:
    """With every packed block of points of the run overwritten with garbage, the answer is unchanged:
    what is sealed is read from rows that keep their extremes (rollups), never decoded point by
    point; only the hot tail is read as points."""
    run, _ = sqlite_store.upsert_run("default", "long", {})
    _fill(sqlite_store, run.id, {"loss": lambda s: _loss("l2", s)})
    before = _listed(sqlite_client, summary="loss")["long"]
    with managed(sqlite_store.engine, "spoil the packed points", write=True) as conn:
        spoilt = conn.execute(
            update(MetricChunkRow).where(MetricChunkRow.run_id == run.id).values(data=b"\xffnot points")
        ).rowcount
    assert spoilt > 0
    assert _listed(sqlite_client, summary="loss")["long"] == before
    assert before["loss"]["min_step"] == PLACES["l2"]


def test_the_summary_respects_the_lists_filters_and_archived_runs(client: TestClient, store: SqlStore) -> None:
    a, _ = store.upsert_run("p", "a", {"group": "g"})
    b, _ = store.upsert_run("p", "b", {"group": "g"})
    store.ingest(a.id, "1", [Point("loss", s, 3.0 - s) for s in range(3)])
    store.ingest(b.id, "2", [Point("loss", s, 5.0 + s) for s in range(3)])
    store.update_run(b.id, {"archived": True})
    assert _listed(client, project="p", summary="loss") == {"a": {"loss": {
        "last": 1.0, "last_step": 2, "min": 1.0, "min_step": 2, "max": 3.0, "max_step": 0}}}  # fmt: skip
    both = _listed(client, project="p", summary=["loss", "val_loss"], include_archived="true")
    assert set(both) == {"a", "b"} and both["b"]["loss"]["min"] == 5.0
    # repeated and comma-separated names are one list, each once
    assert _listed(client, summary=["loss,loss", "loss"]) == _listed(client, summary="loss")


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("bogus", "unknown metric name 'bogus'"),
        ("loss,,val_loss", "holds an empty name"),
        ("loss, val_loss", "unknown metric name ' val_loss'"),
        (",".join(f"user.m{i}" for i in range(9)), "9 names; ask for at most 8"),
        ("x" * 300, "the limit is"),
    ],
)
def test_summary_names_are_validated_naming_the_parameter(client: TestClient, value: str, says: str) -> None:
    r = client.get("/api/v1/runs", params={"summary": value})
    assert r.status_code == 422, r.text
    assert "summary" in r.json()["message"] and says in r.json()["message"], r.text


def test_the_summary_is_in_the_openapi_schema(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    op = schema["paths"]["/api/v1/runs"]["get"]
    param = next(p for p in op["parameters"] if p["name"] == "summary")
    assert param["in"] == "query" and "loss,val_loss" in param["description"]
    item = op["responses"]["200"]["content"]["application/json"]["schema"]["items"]["$ref"].rsplit("/", 1)[-1]
    metrics = schema["components"]["schemas"][item]["properties"]["metrics"]
    summary = schema["components"]["schemas"][metrics["additionalProperties"]["$ref"].rsplit("/", 1)[-1]]
    assert {"last", "last_step", "min", "min_step", "max", "max_step"} <= set(summary["properties"])
    assert "summary=" in op["description"]
