"""Issue 14: half-open and slow clients cannot stop the real service from answering /healthz.

The service runs as ``hyperwatch serve`` with a small connection cap and a short request
deadline, so the test stays quick: a local client holds several times the cap in half-open
connections (headers never finished) and /healthz must still answer within a bounded time; the
stalled connections are closed by the service, not kept until the client gives up. Each test runs
with both HTTP parsers ``serve --http`` offers (httptools only where it is installed).
"""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path

import pytest

from hyperwatch.monitor.api.connections import httptools_available
from tests.reliability.support import Service, upgrade

CAP = 32
HALF_OPEN = 4 * CAP
DEADLINE_S = 2.0
HTTP = pytest.mark.parametrize(
    "http",
    ["h11", pytest.param("httptools", marks=pytest.mark.skipif(not httptools_available(), reason="no httptools"))],
)


def healthz_seconds(url: str) -> float:
    t0 = time.monotonic()
    with urllib.request.urlopen(url + "/healthz", timeout=10) as resp:
        assert resp.status == 200
    return time.monotonic() - t0


def closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(0.0)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@HTTP
def test_half_open_connections_never_stop_healthz(sqlite_url: str, tmp_path: Path, http: str) -> None:
    upgrade(sqlite_url)
    svc = Service(sqlite_url, tmp_path / "service.log")
    svc.start("--max-connections", str(CAP), "--request-timeout", str(DEADLINE_S), "--http", http)
    socks: list[socket.socket] = []
    try:
        for i in range(HALF_OPEN):
            s = socket.create_connection(("127.0.0.1", svc.port), timeout=5)
            if i % 2:  # half of them start a request and never finish its headers
                s.sendall(b"GET /api/v1/runs HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
            if i % CAP == 0:
                assert healthz_seconds(svc.url) < 5.0
        assert healthz_seconds(svc.url) < 5.0  # with the table full of stalled clients
        # The cap: the oldest stalled connections were closed as new ones came.
        assert sum(closed_by_peer(s) for s in socks[: HALF_OPEN - CAP]) >= HALF_OPEN - 2 * CAP
        # The deadline: every stalled connection is closed soon after it, none waits for the client.
        time.sleep(DEADLINE_S + 1.5)
        assert all(closed_by_peer(s) for s in socks)
        assert healthz_seconds(svc.url) < 5.0
    finally:
        for s in socks:
            s.close()
        svc.kill()


@HTTP
def test_a_slow_body_is_cut_at_the_deadline_but_a_prompt_request_is_served(
    sqlite_url: str, tmp_path: Path, http: str
) -> None:
    upgrade(sqlite_url)
    svc = Service(sqlite_url, tmp_path / "service.log")
    svc.start("--request-timeout", str(DEADLINE_S), "--http", http)
    try:
        s = socket.create_connection(("127.0.0.1", svc.port), timeout=10)
        s.sendall(
            b"POST /api/v1/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        t0 = time.monotonic()
        s.settimeout(DEADLINE_S + 5)
        assert s.recv(1) == b""  # closed by the service, no answer to half a body
        assert time.monotonic() - t0 < DEADLINE_S + 3
        s.close()
        # keep-alive: a connection that sends requests promptly is served again and again
        c = socket.create_connection(("127.0.0.1", svc.port), timeout=10)
        for _ in range(3):
            c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = b""
            while not reply.endswith(b"}"):  # headers and body may come in separate reads
                chunk = c.recv(4096)
                assert chunk, reply
                reply += chunk
            assert reply.startswith(b"HTTP/1.1 200") and b'"status":"ok"' in reply
        c.close()
    finally:
        svc.kill()
