"""The live routes over real HTTP, on both databases (issue 37): ``line=²`` was a 500 on the long
poll and a 200 then a cut connection on the stream; a 20-digit ``line`` cut the stream on SQLite.
Now both answer a 422 naming ``line`` before anything is streamed."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

from tests.reliability.support import AUTH, Service

ODD = ["²", "１２", "9" * 20, "-1", "", " 1"]


def _get(url: str) -> tuple[int, str, str]:
    req = urllib.request.Request(url, headers=AUTH)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def test_live_routes_refuse_odd_numbers_before_answering(service: Service) -> None:
    body = json.dumps({"name": "r", "group": "g"}).encode()
    req = urllib.request.Request(f"{service.url}/api/v1/runs", data=body, method="POST", headers=AUTH)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as resp:
        rid = json.loads(resp.read())["id"]
    points = [{"name": "attention_z", "layer": i % 2, "step": i, "value": 1.0} for i in range(600)]
    batch = json.dumps({"batch_id": "number-params-1", "run": "r", "points": points}).encode()
    req = urllib.request.Request(f"{service.url}/api/v1/points", data=batch, method="POST", headers=AUTH)
    req.add_header("Content-Type", "application/json")
    urllib.request.urlopen(req, timeout=30).close()
    for route in ("live", "live/stream"):
        for odd in ODD:
            q = urllib.parse.urlencode({"cursor": f"{rid}:-1", "name": "attention_z", "line": odd, "wait": "1"})
            status, ctype, text = _get(f"{service.url}/api/v1/{route}?{q}")
            assert status == 422 and ctype.startswith("application/json"), (route, odd, status, text[:200])
            assert json.loads(text)["message"].startswith("line: "), text
        q = urllib.parse.urlencode({"cursor": f"{rid}:-1", "name": "attention_z", "line": "1", "wait": "0"})
        status, _, text = _get(f"{service.url}/api/v1/{route}?{q}")
        assert status == 200 and '"1":' in text  # layer 1 of the 300 steps (the slow, downsampled path)
    assert service.healthy()
