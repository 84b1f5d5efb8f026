"""``hyperwatch serve`` as a child process on a free localhost port, for the benchmarks.

A separate process keeps the client's work off the service's GIL, as in a real deployment.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve_process(db_url: str, token: str, timeout: float = 60.0) -> Iterator[str]:
    """Start the service on ``db_url`` with write token ``token``; yields its base URL."""
    port = free_port()
    env = {**os.environ, "HYPERWATCH_WRITE_TOKEN": token, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "hyperwatch", "serve", "--db", db_url, "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/healthz", timeout=1).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"hyperwatch serve did not start (exit code {proc.poll()})")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
