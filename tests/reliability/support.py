"""The real service in a subprocess (``hyperwatch serve``), killed and restarted; database counts.

:class:`Service` runs ``python -m hyperwatch serve --db URL --port P`` exactly as a user would, with
its output in a log file (the access tests grep it for secrets). ``kill()`` is SIGKILL: no
shutdown handler runs, an open transaction is cut where it stands. ``start()`` again reuses the
same port and database.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import create_engine, text

from hyperwatch.monitor.store import SqlStore, migrate

REPO = Path(__file__).resolve().parents[2]
WRITE_TOKEN = "reliability-write-token-0123456789"
READ_TOKEN = "reliability-read-token-0123456789"
AUTH = {"Authorization": f"Bearer {WRITE_TOKEN}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(cond: Callable[[], bool], timeout: float = 60.0, every: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every)
    return cond()


def upgrade(url: str) -> None:
    store = SqlStore(url)
    try:
        migrate.upgrade(store.engine)
    finally:
        store.close()


def python_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERWATCH_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


class Service:
    """``hyperwatch serve`` on 127.0.0.1:``port`` over ``db_url``, as a child process."""

    def __init__(self, db_url: str, log_path: Path, port: int | None = None, **env: str) -> None:
        self.db_url = db_url
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.env = {"HYPERWATCH_WRITE_TOKEN": WRITE_TOKEN, **env}
        self.args: list[str] = []
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *args: str, ready: bool = True) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        cmd = [sys.executable, "-m", "hyperwatch", "serve", "--db", self.db_url, "--port", str(self.port)]
        cmd += list(args or self.args)
        self.args = list(args or self.args)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=REPO, env=python_env(**self.env), stdout=log, stderr=subprocess.STDOUT
            )
        if ready and not wait_until(self.healthy, timeout=90, every=0.1):
            self.kill()
            raise RuntimeError(f"the service did not start; its log:\n{self.log_path.read_text()[-3000:]}")

    def healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def kill(self) -> None:
        """SIGKILL: no cleanup runs, in-flight requests and transactions are cut."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class Stored:
    """What the database holds for one run."""

    points: int  # rows in metric_points
    distinct: int  # distinct (name, layer, step) keys
    ingested: int  # sum of n_points over the run's stored batches: each point ingested once -> == points
    batches: int  # stored batch ids
    keys: set[tuple[str, int, int]]


def stored(db_url: str, run: str) -> Stored:
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            run_ids = [r[0] for r in conn.execute(text("SELECT id FROM runs WHERE name = :n"), {"n": run})]
            if not run_ids:
                return Stored(0, 0, 0, 0, set())
            rid = run_ids[0]
            keys = [
                (str(n), int(layer), int(step))
                for n, layer, step in conn.execute(
                    text(
                        "SELECT m.name, p.layer, p.step FROM metric_points p "
                        "JOIN metric_names m ON m.id = p.name_id WHERE p.run_id = :r"
                    ),
                    {"r": rid},
                )
            ]
            ingested, batches = conn.execute(
                text("SELECT COALESCE(SUM(n_points), 0), COUNT(*) FROM ingested_batches WHERE run_id = :r"),
                {"r": rid},
            ).one()
    finally:
        engine.dispose()
    return Stored(len(keys), len(set(keys)), int(ingested), int(batches), set(keys))


def count_rows(db_url: str, table: str) -> int:
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar() or 0)
    finally:
        engine.dispose()
