"""Issue 14, through the real service over real HTTP on SQLite and PostgreSQL.

A config the hooks cannot send as it is (a non-UTF-8 path, NaN, a Path object) is repaired by the
hooks and delivered, never retried forever; a bad write answered 4xx leaves every list at 200.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from hyperwatch import hooks
from hyperwatch.hooks.sinks import HttpSink
from tests.hooks.support import bundled_model
from tests.reliability.support import AUTH, WRITE_TOKEN, Service, stored


def call(service: Service, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], str]:
    data = None if body is None else json.dumps(body).encode()  # ASCII escapes: a surrogate as \udce9
    req = urllib.request.Request(service.url + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    for k, v in AUTH.items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def test_attach_with_a_non_utf8_path_in_its_config_delivers(service: Service, tmp_path: Path) -> None:
    data_dir = os.fsdecode(b"/data/caf\xe9")  # '/data/caf\udce9'
    config = {"data_dir": data_dir, "out": Path("/tmp/x"), "eps": float("nan"), "shape": (1, 2)}
    sink = HttpSink(service.url, token=WRITE_TOKEN, spool=tmp_path / "spool", backoff=(0.05, 0.2), close_timeout=60)
    mon = hooks.attach(bundled_model(), run="surrogate-1", sink=sink, every=1, config=config, depth=2)
    for step in range(5):
        mon.step(step, loss=3.0, lr=1e-3, tokens=step * 64)
    mon.close()
    assert sink.dropped_points == 0 and sink.delivered > 0, sink.last_error
    assert stored(service.db_url, "surrogate-1").points == 20  # loss, lr, tokens, host_rss on 5 steps
    status, _, text = call(service, "GET", "/api/v1/runs")
    assert status == 200
    (run,) = json.loads(text)
    assert run["config"]["data_dir"] == "/data/caf\\xe9"  # the undecodable byte, written as \xe9
    assert run["config"]["out"] == "/tmp/x" and run["config"]["eps"] == "NaN" and run["config"]["shape"] == [1, 2]


def test_client_errors_are_4xx_without_retry_after_and_every_list_still_answers(service: Service) -> None:
    assert call(service, "POST", "/api/v1/runs", {"name": "r1", "group": "g1"})[0] == 201
    bad: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/api/v1/runs", {"name": "p1", "config": None}),
        ("POST", "/api/v1/runs", {"name": "p2", "config": {"d": os.fsdecode(b"/data/caf\xe9")}}),
        ("POST", "/api/v1/runs", {"name": "p3", "config": json.loads('{"a":' * 300 + "1" + "}" * 300)}),
        ("POST", "/api/v1/runs", {"name": "p4", "export_layers": None}),
        ("POST", "/api/v1/runs", {"name": "p5", "summary": None}),
        ("POST", "/api/v1/runs", {"name": "p6", "flops": "Infinity"}),
        ("POST", "/api/v1/runs", {"name": "p7", "optimizer": "a\x00b"}),
        ("POST", "/api/v1/runs", {"name": "ok\n"}),
        ("POST", "/api/v1/groups", {"name": "g2", "thresholds": None}),
        ("POST", "/api/v1/groups", {"name": "g3", "config": None}),
        ("POST", "/api/v1/groups", {"name": "g4", "description": None}),
        ("POST", "/api/v1/groups", {"name": "g\x00"}),
    ]
    for method, path, body in bad:
        status, headers, text = call(service, method, path, body)
        assert 400 <= status < 500, (body, status, text[:300])
        assert "Retry-After" not in headers, (body, headers)
    raw = '{"name": "p8", "summary": {"x": 1' + "0" * 400 + "}}"
    req = urllib.request.Request(service.url + "/api/v1/runs", data=raw.encode(), method="POST", headers=AUTH)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 201 and json.loads(resp.read())["summary"] == {"x": "Infinity"}
    for path in ("/api/v1/runs", "/api/v1/groups", "/", "/runs", "/api/v1/groups/1/analysis", "/groups/1/sweeps"):
        status, _, text = call(service, "GET", path)
        assert status == 200, (path, status, text[:300])
    names = sorted(r["name"] for r in json.loads(call(service, "GET", "/api/v1/runs")[2]))
    assert names == ["p8", "r1"]
