"""The whole app served by real uvicorn on a free localhost port, in a thread of the test process (so a
test can reach its store, e.g. count its statements): the web tests' live service and the live
fan-out tests use it."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry

from hyperwatch.app import create_app
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.store import SqlStore


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(store: SqlStore, write_token: str, **settings: Any) -> tuple[uvicorn.Server, threading.Thread, str]:
    """(server, its thread, base URL) once it accepts connections; stop with ``server.should_exit = True``."""
    url = store.engine.url.render_as_string(hide_password=False)
    app = create_app(
        Settings(database_url=url, write_token=write_token, **settings), store=store, registry=CollectorRegistry()
    )
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start within 30 s")
        time.sleep(0.02)
    return server, thread, f"http://127.0.0.1:{port}"
