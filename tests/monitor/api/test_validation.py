"""Issue 14: every run/group write is validated before it is stored, on SQLite and PostgreSQL.

A refused write is a 4xx naming the field and stores nothing; after any sequence of accepted or
refused writes every list endpoint and page still answers 200.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from hyperwatch.monitor.store import SqlStore
from tests.monitor.conftest import AUTH

SURROGATE_PATH = os.fsdecode(b"/data/caf\xe9")  # '/data/caf\udce9': an ordinary non-UTF-8 path


def nested(depth: int) -> dict[str, Any]:
    obj: dict[str, Any] = {"leaf": 1}
    for _ in range(depth):
        obj = {"a": obj}
    return obj


def send(client: TestClient, method: str, path: str, body: dict[str, Any]) -> Any:
    """JSON with ASCII escapes, as json.dumps writes it: a lone surrogate travels as \\udce9."""
    raw = json.dumps(body).encode()
    return client.request(method, path, content=raw, headers={**AUTH, "Content-Type": "application/json"})


def count(store: SqlStore, table: str) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar() or 0)


def lists_answer(client: TestClient) -> None:
    for path in ("/api/v1/runs", "/api/v1/groups", "/api/v1/alerts", "/", "/runs", "/alerts"):
        r = client.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])


RUN_REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    # case: (body beside the name, the field the message must name)
    "config null": ({"config": None}, "config"),
    "config a list": ({"config": [1]}, "config"),
    "lone surrogate in a config string": ({"config": {"data_dir": SURROGATE_PATH}}, "config.data_dir"),
    "lone surrogate in a config key": ({"config": {SURROGATE_PATH: 1}}, "config"),
    "config nested 300 levels": ({"config": nested(300)}, "nested deeper"),
    "summary null": ({"summary": None}, "summary"),
    "summary with a list value": ({"summary": {"x": [1, 2]}}, "summary"),
    "summary with a lone surrogate": ({"summary": {"path": SURROGATE_PATH}}, "summary"),
    "export_layers null": ({"export_layers": None}, "export_layers"),
    "status null": ({"status": None}, "status"),
    "tags null": ({"tags": None}, "tags"),
    "flops Infinity string": ({"flops": "Infinity"}, "flops"),
    "lr Infinity string": ({"lr": "Infinity"}, "lr"),
    "lr NaN string": ({"lr": "NaN"}, "lr"),
    "flops zero": ({"flops": 0}, "flops"),
    "optimizer with NUL": ({"optimizer": "adam\x00w"}, "optimizer"),
    "optimizer with a newline": ({"optimizer": "adamw\n"}, "optimizer"),
    "group with NUL": ({"group": "g\x00"}, "group"),
    "group with a trailing newline": ({"group": "g\n"}, "group"),
    "total_params beyond 64 bits": ({"total_params": 2**63}, "total_params"),
}


@pytest.mark.parametrize("case", list(RUN_REFUSED))
def test_bad_run_fields_are_a_clear_4xx_and_store_nothing(client: TestClient, store: SqlStore, case: str) -> None:
    body, word = RUN_REFUSED[case]
    before = {t: count(store, t) for t in ("runs", "groups", "projects")}
    r = send(client, "POST", "/api/v1/runs", {"name": "p1", **body})
    assert r.status_code == 422, r.text[:300]
    assert "Retry-After" not in r.headers
    assert word in r.text, r.text[:300]
    assert {t: count(store, t) for t in before} == before
    lists_answer(client)


@pytest.mark.parametrize("case", list(RUN_REFUSED))
def test_bad_run_fields_on_update_leave_the_run_as_it_was(client: TestClient, case: str) -> None:
    body, word = RUN_REFUSED[case]
    run = client.post("/api/v1/runs", json={"name": "p1", "config": {"a": 1}}, headers=AUTH).json()
    r = send(client, "PATCH", f"/api/v1/runs/{run['id']}", body)
    assert r.status_code == 422 and word in r.text, r.text[:300]
    after = client.get(f"/api/v1/runs/{run['id']}").json()
    assert after == run
    lists_answer(client)


GROUP_REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "description null": ({"description": None}, "description"),
    "config null": ({"config": None}, "config"),
    "thresholds null": ({"thresholds": None}, "thresholds"),
    "threshold Infinity": ({"thresholds": {"max_vio_limit": "Infinity"}}, "max_vio_limit"),
    "description with NUL": ({"description": "a\x00b"}, "description"),
    "config with a lone surrogate": ({"config": {"d": SURROGATE_PATH}}, "config.d"),
}


@pytest.mark.parametrize("case", list(GROUP_REFUSED))
def test_bad_group_fields_are_a_clear_4xx_and_store_nothing(client: TestClient, store: SqlStore, case: str) -> None:
    body, word = GROUP_REFUSED[case]
    r = send(client, "POST", "/api/v1/groups", {"name": "g1", **body})
    assert r.status_code == 422 and word in r.text, r.text[:300]
    assert "Retry-After" not in r.headers
    assert count(store, "groups") == 0
    gid = client.post("/api/v1/groups", json={"name": "g1"}, headers=AUTH).json()["id"]
    r = send(client, "PATCH", f"/api/v1/groups/{gid}", body)
    assert r.status_code == 422 and word in r.text, r.text[:300]
    lists_answer(client)


@pytest.mark.parametrize("name", ["ok\n", "ok\r", " ok", "ok\x00"])
def test_names_with_a_trailing_newline_or_control_character_are_refused(client: TestClient, name: str) -> None:
    assert client.post("/api/v1/runs", json={"name": name}, headers=AUTH).status_code == 422
    assert client.post("/api/v1/runs", json={"name": "ok", "project": name}, headers=AUTH).status_code == 422
    assert client.post("/api/v1/groups", json={"name": name}, headers=AUTH).status_code == 422
    client.post("/api/v1/runs", json={"name": "ok"}, headers=AUTH)
    r = client.post(
        "/api/v1/points",
        json={"batch_id": "newline-batch-1", "run": "ok", "points": [{"name": "loss\n", "step": 1, "value": 1.0}]},
        headers=AUTH,
    )
    assert r.status_code == 422 and "name" in r.text
    assert [x["name"] for x in client.get("/api/v1/runs").json()] == ["ok"]


def test_non_finite_config_values_are_stored_as_the_wire_strings_on_both_databases(client: TestClient) -> None:
    raw = b'{"name": "nan1", "config": {"a": NaN, "b": Infinity, "c": [-Infinity, 1.5]}}'
    r = client.post("/api/v1/runs", content=raw, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 201, r.text
    want = {"a": "NaN", "b": "Infinity", "c": ["-Infinity", 1.5]}
    assert r.json()["config"] == want
    assert client.get(f"/api/v1/runs/{r.json()['id']}").json()["config"] == want


def test_summary_numbers_beyond_a_float_are_infinity_like_1e400(client: TestClient) -> None:
    raw = b'{"name": "big", "summary": {"a": 1' + b"0" * 400 + b', "b": -1' + b"0" * 400 + b', "c": 1e400, "d": 7}}'
    r = client.post("/api/v1/runs", content=raw, headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 201, r.text
    want = {"a": "Infinity", "b": "-Infinity", "c": "Infinity", "d": 7}
    assert r.json()["summary"] == want
    assert client.get("/api/v1/runs").json()[0]["summary"] == want


def test_a_valid_config_round_trips_exactly(client: TestClient) -> None:
    config = {"model": {"depth": 12, "lr": 3e-4, "names": ["é", "中文", "<b>"]}, "deep": nested(60), "n": None}
    r = client.post("/api/v1/runs", json={"name": "ok1", "config": config}, headers=AUTH)
    assert r.status_code == 201, r.text
    assert client.get(f"/api/v1/runs/{r.json()['id']}").json()["config"] == config


BAD_ROWS = {
    # what an older version, another writer or a hand edit may leave behind: (table, SET clause)
    "config a JSON null": ("runs", "config = 'null'"),
    "config a string": ("runs", "config = '\"x\"'"),
    "config with an escaped lone surrogate": ("runs", 'config = \'{"d": "/data/caf\\udce9"}\''),
    "config nested 300 levels": ("runs", "config = '" + '{"a": ' * 300 + "1" + "}" * 300 + "'"),
    "summary a list": ("runs", "summary = '[1, 2]'"),
    "summary with an object value": ("runs", 'summary = \'{"x": {"y": 1}}\''),
    "flops infinite": ("runs", "flops = 1e308 * 10"),
    "lr negative": ("runs", "lr = -1"),
    "group config a list": ("groups", "config = '[1]'"),
    "group thresholds infinite": ("groups", 'thresholds = \'{"max_vio_limit": 1e999, "spike_window": 50}\''),
    "group thresholds null": ("groups", "thresholds = 'null'"),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_one_bad_row_in_the_database_never_fails_a_list(client: TestClient, store: SqlStore, case: str) -> None:
    table, assignment = BAD_ROWS[case]
    run = client.post("/api/v1/runs", json={"name": "bad", "group": "g", "flops": 1e18, "lr": 1e-3}, headers=AUTH)
    good = client.post("/api/v1/runs", json={"name": "good", "group": "g", "flops": 2e18, "lr": 2e-3}, headers=AUTH)
    assert run.status_code == 201 and good.status_code == 201
    target = run.json()["id"] if table == "runs" else run.json()["group_id"]
    if store.engine.dialect.name == "postgresql":
        assignment = assignment.replace("1e308 * 10", "'Infinity'::float8")
    with store.engine.begin() as conn:
        conn.execute(text(f"UPDATE {table} SET {assignment} WHERE id = :id"), {"id": target})
    lists_answer(client)
    names = [r["name"] for r in client.get("/api/v1/runs").json()]
    assert names == ["bad", "good"]  # repaired, not dropped
    assert client.get(f"/api/v1/runs/{target if table == 'runs' else good.json()['id']}").status_code == 200
    gid = good.json()["group_id"]
    assert client.get(f"/api/v1/groups/{gid}").status_code == 200
    assert len(client.get("/api/v1/groups").json()) == 1
    for path in (f"/api/v1/groups/{gid}/analysis", f"/groups/{gid}", f"/groups/{gid}/sweeps"):
        r = client.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
    # Writing the run again (the hooks re-create it on restart) repairs it.
    r = client.post("/api/v1/runs", json={"name": "bad", "config": {"ok": 1}, "summary": {"x": 1}}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["config"] == {"ok": 1}


def test_points_still_flow_and_alert_after_a_group_row_goes_bad(client: TestClient, store: SqlStore) -> None:
    run = client.post("/api/v1/runs", json={"name": "r", "group": "g"}, headers=AUTH).json()
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE groups SET thresholds = 'null' WHERE id = :id"), {"id": run["group_id"]})
    pts = [{"name": "loss", "step": s, "value": "NaN" if s == 3 else 1.0} for s in range(5)]
    r = client.post("/api/v1/points", json={"batch_id": "after-bad-1", "run": "r", "points": pts}, headers=AUTH)
    assert r.status_code == 201, r.text
    assert math.isfinite(1.0) and client.get("/api/v1/alerts").status_code == 200


def test_with_a_read_token_the_api_description_stays_open_and_the_data_closed(store: SqlStore) -> None:
    """Decision: /openapi.json and /docs describe the API (the same for every install, no data in
    them) and stay open; every route that returns data needs the read token."""
    from tests.monitor.conftest import READ_TOKEN, make_client

    client = make_client(store, read_token=READ_TOKEN)
    assert client.get("/openapi.json").status_code == 200
    assert client.get("/docs").status_code == 200
    assert client.get("/api/v1/runs").status_code == 401
    assert client.get("/api/v1/runs", headers={"Authorization": f"Bearer {READ_TOKEN}"}).status_code == 200


def test_the_openapi_schema_states_the_run_name_rule(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()["components"]["schemas"]["RunCreate"]["properties"]["name"]
    assert schema["pattern"].startswith("^[A-Za-z0-9]")


def test_a_constraint_the_input_breaks_is_a_422_naming_the_column_never_a_503(store: SqlStore) -> None:
    """Below the API (another client of the store, an older model): still the request's fault."""
    from hyperwatch.monitor.core.errors import InvalidInputError, StoreUnavailableError

    with pytest.raises(InvalidInputError, match="description") as info:
        store.upsert_group("default", "g", {"description": None})
    assert not isinstance(info.value, StoreUnavailableError)
    with pytest.raises(InvalidInputError, match="export_layers"):
        store.upsert_run("default", "r", {"export_layers": None})
    if store.engine.dialect.name == "postgresql":  # SQLite stores a NUL; PostgreSQL text cannot
        with pytest.raises(InvalidInputError, match="NUL"):
            store.upsert_run("default", "r", {"optimizer": "adam\x00w"})
    assert store.list_runs() == [] and store.list_groups() == []


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
    max_leaves=12,
)
_WRITE = st.fixed_dictionaries(
    {},
    optional={
        "config": _JSON,
        "summary": _JSON,
        "status": st.sampled_from(["running", "finished", "nope", None]),
        "tags": st.none() | st.lists(st.text(max_size=4), max_size=2),
        "flops": _JSON,
        "lr": st.floats() | st.sampled_from(["Infinity", "NaN", None]),
        "optimizer": st.none() | st.text(max_size=6),
        "export_layers": st.none() | st.booleans() | st.integers(),
        "group": st.none() | st.text(max_size=6),
    },
)
_GROUP_WRITE = st.fixed_dictionaries(
    {}, optional={"description": st.none() | st.text(max_size=6), "config": _JSON, "thresholds": _JSON}
)


@given(
    writes=st.lists(
        st.tuples(st.sampled_from(["run", "group"]), st.sampled_from(["a", "b\n"]), _WRITE | _GROUP_WRITE), max_size=4
    )
)
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_after_any_writes_every_list_and_page_answers_200(client: TestClient, writes: list[Any]) -> None:
    for kind, name, body in writes:
        path = "/api/v1/runs" if kind == "run" else "/api/v1/groups"
        if kind == "group":
            body = {k: v for k, v in body.items() if k in ("description", "config", "thresholds")}
        r = send(client, "POST", path, {"name": name, **body})
        assert r.status_code < 500 and "Retry-After" not in r.headers, (body, r.status_code, r.text[:300])
    lists_answer(client)
