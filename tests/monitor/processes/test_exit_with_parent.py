"""exit_with_parent: a process pool's workers end when the process that started them is killed
(bench/early_warning/ew_record.py's workers trained on as orphans after its parent was stopped)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

POOL = textwrap.dedent(
    """
    import sys, time
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context
    from hyperwatch.monitor.processes.lifetime import exit_with_parent

    def work(_):
        time.sleep(120)

    if __name__ == "__main__":
        initializer = exit_with_parent if sys.argv[1] == "on" else None
        with ProcessPoolExecutor(2, get_context("spawn"), initializer) as pool:
            list(pool.map(work, range(2)))
    """
)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _workers_after_kill(tmp_path: Path, mode: str) -> list[int]:
    script = tmp_path / "pool.py"
    script.write_text(POOL)
    parent = subprocess.Popen([sys.executable, str(script), mode], cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        workers: list[int] = []
        while time.monotonic() < deadline and len(workers) < 2:
            time.sleep(0.2)
            found = subprocess.run(["pgrep", "-f", "-P", str(parent.pid), "spawn_main"], capture_output=True, text=True)
            workers = [int(p) for p in found.stdout.split()]
        assert len(workers) >= 2, "the pool's workers did not start"
        time.sleep(1.0)  # the initializer has run
        parent.kill()
        parent.wait()
        end = time.monotonic() + 10
        while time.monotonic() < end and any(_alive(w) for w in workers):
            time.sleep(0.1)
        return [w for w in workers if _alive(w)]
    finally:
        if parent.poll() is None:
            parent.kill()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_pool_workers_end_with_their_parent(tmp_path: Path) -> None:
    assert _workers_after_kill(tmp_path, "on") == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_without_it_they_outlive_it(tmp_path: Path) -> None:
    """The check itself: a pool without the initializer leaves its workers behind (then killed here)."""
    left = _workers_after_kill(tmp_path, "off")
    for pid in left:
        os.kill(pid, 9)
    assert left, "workers without exit_with_parent should have outlived their parent"
