"""The real service (uvicorn on a free localhost port, in a thread of this process, so a test can count
its store's statements) and live streams read over real HTTP by one asyncio client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from hyperwatch.monitor.read.live_notify import news
from hyperwatch.monitor.store import SqlStore
from tests.monitor.conftest import AUTH, WRITE_TOKEN
from tests.server_thread import start


@contextlib.contextmanager
def serve(store: SqlStore, **settings: Any) -> Iterator[str]:
    """The whole app over HTTP on ``store``; yields its base URL."""
    server, thread, base = start(store, WRITE_TOKEN, **settings)
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(10)


@dataclass
class Stream:
    """One watcher: the events it received, parsed."""

    params: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    detail: str = ""

    def steps(self, name: str, mode: str) -> list[int]:
        """Every step of ``name``'s ``mode`` line received, in order."""
        return [s for ev in self.events for s in ev["runs"][0]["series"].get(name, {}).get(mode, {}).get("step", [])]


async def read_stream(client: httpx.AsyncClient, stream: Stream, headers: dict[str, str] | None = None) -> None:
    """Read ``GET /api/v1/live/stream`` with ``stream.params`` to its end (or a refusal)."""
    async with client.stream("GET", "/api/v1/live/stream", params=stream.params, headers=headers) as r:
        stream.status, stream.headers = r.status_code, dict(r.headers)
        if r.status_code != 200:
            stream.detail = (await r.aread()).decode()
            return
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                stream.raw.append(line.encode())
                stream.events.append(json.loads(line.removeprefix("data: ")))


async def until(check: Any, timeout: float = 30.0, what: str = "") -> None:
    """Wait (on the test's loop) until ``check()`` is true."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.01)


def waiting(run_id: int) -> int:
    """How many requests of the service wait on news of ``run_id`` now."""
    return len(news._waiters.get(run_id, ()))


async def post(client: httpx.AsyncClient, run: str, points: list[dict[str, Any]]) -> None:
    body = {"batch_id": f"{run}-{time.monotonic_ns()}", "run": run, "points": points}
    r = await client.post("/api/v1/points", json=body, headers=AUTH)
    assert r.status_code == 201, r.text
