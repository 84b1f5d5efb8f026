"""Issue 16: the ingest body's fast columnar reader agrees with BatchIn, value for value, error for error.

``fast_batch`` (msgspec straight into numpy columns) may only accept what ``exact_batch`` (json.loads
and the pydantic model, the reference) accepts, with bit-identical values; everything else must go
to the reference, whose refusal is the API's answer.
"""

from __future__ import annotations

import json
import math
import struct
import uuid
from typing import Any

import numpy as np
import pytest
from fastapi.exceptions import RequestValidationError
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from starlette.exceptions import HTTPException

from hyperwatch.hooks.columns import COLUMNS_MEDIA_TYPE, NULL_INT, PointColumns, decode_body, encode_body
from hyperwatch.hooks.schema import MAX_STEP, Batch, Point
from hyperwatch.monitor.api.batch_body import exact_batch, fast_batch, read_batch
from hyperwatch.monitor.api.schemas import IngestOut
from hyperwatch.monitor.core.errors import NotFoundError
from hyperwatch.monitor.store import SqlStore
from hyperwatch.monitor.store.entities import GroupThresholds
from hyperwatch.monitor.store.models import RUN_LEVEL_LAYER, hot_relation
from hyperwatch.monitor.store.points import point_rows
from tests.monitor.conftest import AUTH, create_run


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def same(a: PointColumns, b: PointColumns) -> bool:
    pa, pb = a.points(), b.points()
    return len(pa) == len(pb) and all(
        (p.name, p.step, p.layer, p.tokens, bits(p.value)) == (q.name, q.step, q.layer, q.tokens, bits(q.value))
        for p, q in zip(pa, pb)
    )


_INT_OK = st.one_of(st.integers(0, 4096), st.sampled_from([0, MAX_STEP]))
_INT_BAD = st.sampled_from([-1, 4097, MAX_STEP + 1, 2**63, 10**30, -(2**70), 12.0, 1.5, True, False, "12", None])
_VALUE_OK = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(10**20), 10**20),
    st.sampled_from(["NaN", "Infinity", "-Infinity", -0.0, 5e-324]),
)
_VALUE_ODD = st.sampled_from([math.nan, math.inf, 10**400, -(10**400), "nan", "inf", "1e3", True, None, [1.0]])
_NAME_OK = st.sampled_from(["loss", "attention_z", "weight_norm.attn.q_proj", "user.x", "router_z"])
_NAME_BAD = st.sampled_from(["lossy", "loss\n", "user.x<script>", "", 7, None])


def mostly(draw: st.DrawFn, good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> Any:
    """A valid value 9 times in 10: most bodies stay valid, so both readers are compared on values too."""
    return draw(good if draw(st.integers(0, 9)) else bad)


@st.composite
def points(draw: st.DrawFn) -> dict[str, Any]:
    p: dict[str, Any] = {}
    if draw(st.integers(0, 40)):
        p["name"] = mostly(draw, _NAME_OK, _NAME_BAD)
    if draw(st.integers(0, 40)):
        p["step"] = mostly(draw, _INT_OK, _INT_BAD)
    if draw(st.integers(0, 40)):
        p["value"] = mostly(draw, _VALUE_OK, _VALUE_ODD)
    for key in ("layer", "tokens"):
        if draw(st.booleans()):
            p[key] = mostly(draw, st.one_of(st.none(), _INT_OK), _INT_BAD)
    if not draw(st.integers(0, 40)):
        p["extra"] = 1
    return p


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    obj: dict[str, Any] = {
        "batch_id": mostly(draw, st.just("batch-000001"), st.sampled_from(["short", "x" * 65, "ok_ok_ok\n", 5])),
        "run": mostly(draw, st.just("r1"), st.sampled_from(["r 1", "", "a" * 201, None])),
        "points": draw(st.lists(points(), max_size=4)),
    }
    if not draw(st.integers(0, 20)):
        del obj[draw(st.sampled_from(sorted(obj)))]
    text = json.dumps(obj)  # NaN/Infinity floats become the bare literals json.loads reads back
    if draw(st.booleans()):
        text = text.replace(", ", ",").replace(": ", ":")
    return text.encode()


def reference(body: bytes) -> tuple[str, Any]:
    try:
        return "ok", exact_batch(body)
    except RequestValidationError as exc:
        return "422", [tuple(e["loc"]) for e in exc.errors()]
    except HTTPException as exc:
        return str(exc.status_code), exc.detail


@given(body=bodies())
@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_the_fast_reader_accepts_only_what_batchin_accepts_with_identical_values(body: bytes) -> None:
    kind, ref = reference(body)
    fast = fast_batch(body)
    if fast is not None:
        assert kind == "ok", (body, ref)
        assert (fast.batch_id, fast.run) == (ref.batch_id, ref.run)
        assert same(fast.points, ref.points), body
    try:
        got = read_batch(body, "application/json")
    except RequestValidationError as exc:
        assert (kind, ref) == ("422", [tuple(e["loc"]) for e in exc.errors()])
    except HTTPException as exc:
        assert (kind, ref) == (str(exc.status_code), exc.detail)
    else:
        assert kind == "ok" and same(got.points, ref.points)


def test_the_canonical_wire_form_takes_the_fast_path() -> None:
    pts = [Point("attention_z", 7, 12.5, layer=2, tokens=700), Point("loss", 7, math.nan), Point("loss", 8, -math.inf)]
    body = json.dumps({"batch_id": "batch-000001", "run": "r1", "points": [p.to_json() for p in pts]}).encode()
    fast = fast_batch(body)
    assert fast is not None and same(fast.points, PointColumns.from_points(pts))
    # legal but not canonical: a step written 8.0, a bare NaN; the reference reads them, the same way
    for odd in (body.replace(b'"step": 8', b'"step": 8.0'), body.replace(b'"NaN"', b"NaN")):
        assert fast_batch(odd) is None
        assert same(read_batch(odd, "application/json").points, PointColumns.from_points(pts))


def test_columns_round_trip_points() -> None:
    pts = [Point("loss", 1, 2.0), Point("attention_z", 2**62, -0.0, layer=4096, tokens=0), Point("loss", 0, math.inf)]
    cols = PointColumns.from_points(pts)
    assert cols.names == ("loss", "attention_z") and cols.name_index.tolist() == [0, 1, 0]
    assert cols.layer.tolist() == [NULL_INT, 4096, NULL_INT] and cols.tokens.tolist() == [NULL_INT, 0, NULL_INT]
    assert [(p.name, p.step, p.layer, p.tokens, bits(p.value)) for p in cols.points()] == [
        (p.name, p.step, p.layer, p.tokens, bits(p.value)) for p in pts
    ]
    assert cols.points(np.array([2])) == [pts[2]]
    with pytest.raises(ValueError, match="one entry per point"):
        PointColumns(("loss",), np.zeros(2, np.int32), np.zeros(1, np.int64), cols.value, cols.layer, cols.tokens)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["loss", "attention_z", "mlp_rms"]),
            st.sampled_from([None, 0, 1]),
            st.integers(0, 4),
            st.sampled_from([1.0, 2.0, math.nan, -math.inf, -0.0]),
            st.sampled_from([None, 5]),
        ),
        max_size=30,
    )
)
@settings(max_examples=200, deadline=None, database=None)
def test_point_rows_keep_the_last_occurrence_of_each_key_in_key_order(raw: list[Any]) -> None:
    ids = {"loss": 3, "attention_z": 1, "mlp_rms": 2}
    pts = [Point(n, s, v, layer, t) for n, layer, s, v, t in raw]
    want: dict[tuple[int, int, int], tuple[Any, ...]] = {}
    for p in pts:  # the reference: a dict, later writes replacing earlier ones
        key = (ids[p.name], RUN_LEVEL_LAYER if p.layer is None else p.layer, p.step)
        want[key] = (*key, p.tokens, None if math.isnan(p.value) else p.value)
    got = point_rows(PointColumns.from_points(pts), ids)
    assert [(*r[:4], None if r[4] is None else bits(r[4])) for r in got] == [
        (*want[k][:4], None if want[k][4] is None else bits(want[k][4])) for k in sorted(want)
    ]


def test_a_body_that_is_not_json_is_a_415_naming_the_content_type(client: TestClient) -> None:
    create_run(client)
    body = json.dumps({"batch_id": "batch-000009", "run": "r1", "points": []})
    r = client.post("/api/v1/points", content=body, headers={**AUTH, "Content-Type": "text/plain"})
    assert r.status_code == 415 and "application/json" in r.json()["detail"], r.text
    r = client.post("/api/v1/points", content=b"", headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 422 and "body" in r.json()["message"], r.text
    ok = client.post("/api/v1/points", content=body, headers={**AUTH, "Content-Type": "application/json"})
    assert ok.status_code == 201, ok.text


def test_the_openapi_schema_still_documents_the_batch(client: TestClient) -> None:
    op = client.get("/openapi.json").json()["paths"]["/api/v1/points"]["post"]
    schema = op["requestBody"]["content"]["application/json"]["schema"]
    assert op["requestBody"]["required"] is True
    assert set(schema["required"]) == {"batch_id", "run", "points"}
    point = schema["properties"]["points"]["items"]
    assert {"name", "layer", "step", "tokens", "value"} <= set(point["properties"])
    assert "$ref" not in json.dumps(schema)  # self-contained: nothing left pointing into $defs


def columns_post(client: TestClient, body: bytes) -> Any:
    return client.post("/api/v1/points", content=body, headers={**AUTH, "Content-Type": COLUMNS_MEDIA_TYPE})


def test_the_columns_body_stores_what_the_json_body_stores(client: TestClient, store: SqlStore) -> None:
    pts = [Point("loss", s, v) for s, v in enumerate([1.5, math.nan, math.inf, -math.inf, -0.0, 5e-324])]
    pts += [Point("attention_z", 3, 250.0, layer=2, tokens=30), Point("loss", 1, 7.0)]  # last write wins
    for run in ("json", "cols"):
        create_run(client, run)
    r = client.post("/api/v1/points", json=Batch("json", pts).to_json(), headers=AUTH)
    assert r.status_code == 201, r.text
    r = columns_post(client, encode_body("batch-cols-01", "cols", PointColumns.from_points(pts)))
    # alerts: +Inf and -Inf; loss at step 1 is stored as 7.0 (last write wins), so its NaN raises nothing (issue 25)
    assert r.status_code == 201 and r.json()["accepted"] == len(pts) and r.json()["alerts"] == 2, r.text
    assert set(r.json()) == set(IngestOut.model_fields)
    assert columns_post(client, encode_body("batch-cols-01", "cols", PointColumns.from_points(pts))).status_code == 200
    with store.engine.connect() as conn:
        hot = hot_relation(store.engine.dialect.name)
        sql = f"SELECT name_id, layer, step, tokens, value FROM {hot} WHERE run_id = :r ORDER BY 1, 2, 3"
        rows = [conn.execute(text(sql), {"r": run["id"]}).all() for run in client.get("/api/v1/runs").json()]
    assert len(rows) == 2 and rows[0] == rows[1] and len(rows[0]) == 7


HOSTILE_COLUMNS: dict[str, tuple[Any, str]] = {
    # case: (body or a function of a valid body, what the message names)
    "not the magic": (b"GARBAGE-" * 4, "body"),
    "truncated": (lambda b: b[:-3], "body"),
    "a step below 0 at point 2": (
        lambda b: b.replace(struct.pack("<q", 7), struct.pack("<q", -7)),
        "body.points.2.step",
    ),
    "header not JSON": (lambda b: b[:12] + b"\xff" + b[13:], "header"),
    "unknown metric name": (lambda b: b.replace(b'"loss"', b'"lozz"'), "names.0"),
}


@pytest.mark.parametrize("case", list(HOSTILE_COLUMNS))
def test_a_bad_columns_body_is_a_422_naming_the_field_and_stores_nothing(client: TestClient, case: str) -> None:
    create_run(client)
    pts = [Point("loss", s, 1.0) for s in (5, 6, 7)]
    valid = encode_body("batch-cols-02", "r1", PointColumns.from_points(pts))
    bad, word = HOSTILE_COLUMNS[case]
    r = columns_post(client, bad(valid) if callable(bad) else bad)
    assert r.status_code == 422 and word in r.json()["message"], r.text
    assert client.get("/api/v1/runs").json()[0]["last_step"] is None


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["loss", "user.a", "router_z"]),
            st.integers(0, MAX_STEP),
            st.floats(),
            st.sampled_from([None, 0, 4096]),
            st.sampled_from([None, 0, MAX_STEP]),
        ),
        max_size=20,
    )
)
@settings(max_examples=100, deadline=None, database=None)
def test_the_columns_body_round_trips_every_point(raw: list[Any]) -> None:
    pts = [Point(n, s, v, layer, t) for n, s, v, layer, t in raw]
    batch_id, run, cols = decode_body(encode_body("batch-cols-03", "r-1", PointColumns.from_points(pts)))
    assert (batch_id, run) == ("batch-cols-03", "r-1") and same(cols, PointColumns.from_points(pts))


def test_ingest_reads_the_thresholds_find_run_and_get_group_read(store: SqlStore) -> None:
    """The batch's one-statement look-up of its run (inside its transaction) gives the detectors the
    thresholds the two reads it replaces give, a broken group row included."""
    store.upsert_group("p", "g", {"thresholds": {"max_vio_limit": 3.5}})
    grouped, _ = store.upsert_run("p", "r", {"group": "g"})
    alone, _ = store.upsert_run("p", "solo", {})
    assert grouped.group_id is not None
    seen: list[tuple[int, object]] = []

    def target(name: str) -> tuple[int, object]:
        """(run id, the group's thresholds) the detector was given (with the group's learning settings)."""
        seen.clear()
        store.ingest_named("p", name, uuid.uuid4().hex, [Point("loss", 0, 1.0)], lambda r, t: seen.append((r, t)))
        run_id, settings = seen[0]
        if settings is None:
            return run_id, None
        assert isinstance(settings, GroupThresholds) and settings.learn_thresholds is None and settings.learned is None
        return run_id, settings.thresholds

    for run in (grouped, alone):
        want = store.get_group(run.group_id).thresholds if run.group_id is not None else None
        assert target(run.name) == (run.id, want)
    assert target("r")[1] == {"max_vio_limit": 3.5}
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE groups SET thresholds = 'null' WHERE id = :g"), {"g": grouped.group_id})
    assert target("r") == (grouped.id, store.get_group(grouped.group_id).thresholds)
    with pytest.raises(NotFoundError, match="POST /api/v1/runs"):
        target("other")
