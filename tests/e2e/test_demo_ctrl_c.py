"""Ctrl-C in the terminal during ``hyperwatch demo``: every run still training is marked "interrupted".

A terminal's Ctrl-C sends SIGINT to the whole foreground process group: the demo and its training
runs (the service, Prometheus and Alertmanager run in sessions of their own, so the runs can still
report to the service). The test does the same to a fast demo in its own group, then reads the
demo's database: no run is left "running", the ones cut short say "interrupted", and the demo
stopped everything it had started.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from hyperwatch.monitor.processes.children import free_port
from hyperwatch.monitor.processes.lifetime import die_with_parent
from hyperwatch.monitor.store import SqlStore


def test_ctrl_c_marks_the_runs_interrupted_and_stops_the_demo(tmp_path: Path) -> None:
    env = {**os.environ, "HYPERWATCH_DEMO_FAST": "1"}
    cmd = [sys.executable, "-m", "hyperwatch", "demo", "--no-serve", "--out", str(tmp_path), "--port", str(free_port())]
    proc = subprocess.Popen(
        die_with_parent(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,  # its own process group, as a shell gives a foreground job
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "-fast-d2 step 3/16 " in line:  # both arms are training
                break
        assert proc.poll() is None, "".join(lines[-40:])
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        rest, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = "".join(lines) + rest
    assert proc.returncode == 130, out[-3000:]
    assert "interrupted: runs stopped by Ctrl-C are marked 'interrupted'" in out
    store = SqlStore(f"sqlite:///{tmp_path / 'hyperwatch.db'}")
    try:
        status = {r.name: r.status for r in store.list_runs()}
    finally:
        store.close()
    assert status and "running" not in status.values(), status
    assert sum(s == "interrupted" for s in status.values()) >= 2, status  # one per arm at least
    # The demo stopped its service and Prometheus before exiting: nothing answers on their ports.
    urls = [w for w in out.split() if w.startswith("http://127.0.0.1:")]
    for url in {u.split("/", 3)[2] for u in urls}:
        host, port = url.split(":")
        with socket.socket() as s:
            assert s.connect_ex((host, int(port))) != 0, f"{url} still listening after the demo exited"
