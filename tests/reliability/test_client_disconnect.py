"""A client that hangs up in the middle of its request body is the client's doing, not a 5xx.

Issue 25: the service logged a traceback for it and ``/metrics`` counted it as a server error, so
an alert on the 5xx ratio fired whenever a training job was killed mid-upload. Real HTTP to the
real service: the request is cut off on the socket, half its declared body sent.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

import httpx
import pytest

from tests.reliability.support import WRITE_TOKEN, Service, wait_until

SERIES = 'hyperwatch_http_request_duration_seconds_count{method="POST",route="/api/v1/points",status="%s"}'


def _count(metrics: str, status: str) -> float:
    match = re.search(re.escape(SERIES % status) + r" (\S+)", metrics)
    return float(match.group(1)) if match else 0.0


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_client_that_hangs_up_mid_body_is_a_4xx_without_a_traceback(service: Service, tmp_path: Path) -> None:
    host, port = service.url.removeprefix("http://").split(":")
    head = (
        f"POST /api/v1/points HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {WRITE_TOKEN}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
    )
    for _ in range(3):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(head.encode() + b'{"batch_id": "cut", "run": "r", "points": [' + b" " * 5000)
    assert wait_until(lambda: _count(httpx.get(f"{service.url}/metrics").text, "4xx") >= 3, timeout=30)
    metrics = httpx.get(f"{service.url}/metrics").text
    assert _count(metrics, "4xx") == 3
    assert _count(metrics, "5xx") == 0
    log = service.log()
    assert "Traceback" not in log and "ClientDisconnect" not in log, log[-3000:]
    assert httpx.get(f"{service.url}/healthz").status_code == 200
