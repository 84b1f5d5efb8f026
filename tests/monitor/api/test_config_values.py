"""What a run or group config may hold, at the edges (issue 37): NUL in keys and values, and an
integer too long for Python to read. Each is a 422 naming the key, on SQLite and PostgreSQL, and
stores nothing; the hooks repair a NUL before sending."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from hyperwatch.hooks.jsonsafe import check_json, sanitize_json
from tests.monitor.conftest import AUTH, create_run

JSON = {**AUTH, "Content-Type": "application/json"}
NUL_BODIES = {
    "a NUL in a config value": ('{"name": "r", "config": {"data": {"dir": "/tmp\\u0000x"}}}', "config.data.dir"),
    "a NUL in a config key": ('{"name": "r", "config": {"k\\u0000": 1}}', "config.k\\x00"),
    "a NUL in a list in the config": ('{"name": "r", "config": {"xs": ["a", "\\u0000"]}}', "config.xs[1]"),
    "a NUL in an unavailable key": ('{"name": "r", "unavailable": {"attention_z@3\\u0000": "x"}}', "unavailable"),
    "a NUL in an unavailable reason": ('{"name": "r", "unavailable": {"attention_z@3": "x\\u0000"}}', "unavailable"),
}


@pytest.mark.parametrize("case", sorted(NUL_BODIES))
def test_nul_in_a_config_is_a_422_naming_the_key_and_stores_nothing(client: TestClient, case: str) -> None:
    body, where = NUL_BODIES[case]
    r = client.post("/api/v1/runs", content=body, headers=JSON)
    assert r.status_code == 422, r.text
    assert where in r.json()["message"] and "NUL" in r.json()["message"]
    assert client.get("/api/v1/runs").json() == []
    run = create_run(client, "kept")
    r = client.patch(f"/api/v1/runs/{run['id']}", content=body.replace('"name": "r", ', ""), headers=JSON)
    assert r.status_code == 422 and "NUL" in r.json()["message"]
    assert client.get(f"/api/v1/runs/{run['id']}").json()["config"] == {}


def test_nul_in_a_group_config_is_refused(client: TestClient) -> None:
    r = client.post("/api/v1/groups", content='{"name": "g", "config": {"a": "\\u0000"}}', headers=JSON)
    assert r.status_code == 422 and "config.a" in r.json()["message"] and "NUL" in r.json()["message"]


@pytest.mark.parametrize("path", [["big"], ["nested", "deep"], ["xs", 2]])
def test_an_integer_too_long_to_read_is_a_422_naming_its_key(client: TestClient, path: list[str | int]) -> None:
    """10**5000 was a 400 that said "nested too deep"."""
    config: dict[str, object] = {"nested": {"deep": 1}, "xs": [0, 1, 2], "big": 3}
    if path == ["big"]:
        config["big"] = "HUGE"
    elif path == ["xs", 2]:
        config["xs"] = [0, 1, "HUGE"]
    else:
        config["nested"] = {"deep": "HUGE"}
    body = json.dumps({"name": "r", "config": config}).replace('"HUGE"', "1" + "0" * 5000)
    r = client.post("/api/v1/runs", content=body, headers=JSON)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == ["body", "config", *path]
    message = r.json()["message"]
    assert message.startswith("body.config." + ".".join(str(p) for p in path))
    assert "5001 digits" in message and "at most 4300" in message and "nested too deep" not in message
    assert client.get("/api/v1/runs").json() == []


def test_valid_configs_are_unchanged(client: TestClient) -> None:
    config = {"big": 10**400, "text": "tab\tnewline\n", "nested": {"a": [1, 2.5, None, True]}, "uni": "café ²"}
    run = create_run(client, "ok", config=config)
    assert client.get(f"/api/v1/runs/{run['id']}").json()["config"] == config


def test_the_hooks_repair_a_nul_before_sending() -> None:
    repaired = sanitize_json({"k\x00": ["a\x00b"]})
    assert repaired == {"k\\x00": ["a\\x00b"]}
    assert check_json(repaired) == repaired
