"""Children die with their parent: a SIGKILLed demo, test session or benchmark leaves no orphan.

A small Python parent starts the real helpers (``ServiceProcess``; ``AlertingStack`` when
Prometheus is installed), prints their pids, and is then killed with SIGKILL: no ``finally``, no
``atexit``, only the kernel's parent-death signal (``hyperwatch.monitor.processes.lifetime.die_with_parent``) can
stop them. The children must be gone, and their ports closed, within seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from hyperwatch.monitor.processes.children import alerting_available, python_env
from hyperwatch.monitor.processes.lifetime import die_with_parent

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")

PARENT = """
import json, sys, time
from pathlib import Path
from hyperwatch.monitor.processes.children import AlertingStack, ServiceProcess
out = Path(sys.argv[1])
svc = ServiceProcess(f"sqlite:///{out / 'hw.db'}", log_path=out / "service.log").start()
pids = {"service": svc.proc.pid, "urls": [svc.url + "/healthz"]}
if sys.argv[2] == "alerting":
    stack = AlertingStack(svc.url, log_dir=out / "alerting").start()
    pids["alerting"] = [p.pid for p in stack.procs]
    pids["urls"] += [stack.prometheus_url + "/-/ready", stack.alertmanager_url + "/-/ready"]
print(json.dumps(pids), flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    """Running or sleeping; a zombie (dead, not yet reaped by whoever adopted it) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def wait_gone(pids: list[int], timeout: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def start_parent(tmp_path: Path, what: str) -> tuple[subprocess.Popen[str], dict[str, object]]:
    cmd = die_with_parent([sys.executable, "-c", PARENT, str(tmp_path), what])  # and if pytest itself dies
    parent = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=python_env())
    assert parent.stdout is not None
    line = parent.stdout.readline()
    if not line:
        parent.wait(30)
        pytest.fail(f"the parent did not start its children (exit {parent.returncode}); see {tmp_path}")
    return parent, json.loads(line)


@pytest.mark.parametrize("what", ["service", "alerting"])
def test_sigkilled_parent_takes_its_children_along(tmp_path: Path, what: str) -> None:
    if what == "alerting" and alerting_available() is not None and os.environ.get("CI") != "true":
        pytest.skip(str(alerting_available()))
    parent, info = start_parent(tmp_path, what)
    pids = [int(info["service"]), *info.get("alerting", [])]  # type: ignore[call-overload]
    urls = list(info["urls"])  # type: ignore[call-overload]
    try:
        assert all(alive(p) for p in pids) and all(answers(u) for u in urls)
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        left = wait_gone(pids)
        assert left == [], f"orphans still running after their parent was SIGKILLed: {left}"
        assert not any(answers(u) for u in urls)
    finally:
        for pid in pids:  # never leave one behind, even when the assertion failed
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_die_with_parent_runs_the_command_with_the_requested_signal(tmp_path: Path) -> None:
    """The launcher execs the command itself (same pid, its own exit code) and the signal is the
    one asked for: a run started by a sweep gets SIGINT, its Ctrl-C path."""
    done = subprocess.run(die_with_parent([sys.executable, "-c", "import sys; sys.exit(7)"]), timeout=60)
    assert done.returncode == 7
    mark = tmp_path / "got-sigint"
    child = (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGINT, lambda *a: (open({str(mark)!r}, 'w').write('yes'), sys.exit(0)))\n"
        "print('ready', flush=True)\ntime.sleep(600)\n"
    )
    parent_code = (
        "import subprocess, sys, time\n"
        "from hyperwatch.monitor.processes.lifetime import die_with_parent\n"
        f"cmd = die_with_parent([sys.executable, '-c', {child!r}], 2)\n"
        "p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)\n"
        "assert p.stdout.readline().strip() == 'ready'\n"
        "print(p.pid, flush=True)\ntime.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True, env=python_env())
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    try:
        parent.kill()
        parent.wait(30)
        assert wait_gone([pid]) == []
        assert mark.read_text() == "yes"
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_child_started_with_sigint_ignored_gets_its_ctrl_c_back() -> None:
    """A shell without job control (``nohup cmd &``, a CI runner's background job) starts us with SIGINT
    ignored, and an ignored signal survives exec: the launched run must still have Python's Ctrl-C
    handler (its "interrupted" path), and the death signal it asked for must not be ignored."""
    probe = (
        "import signal, sys; death = signal.Signals(int(sys.argv[1]));"
        "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler,"
        " signal.getsignal(death) in (signal.SIG_DFL, signal.default_int_handler))"
    )

    def ignoring() -> None:  # what the shell did to us
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    for sig in (signal.SIGINT, signal.SIGTERM):
        cmd = [sys.executable, "-c", probe, str(int(sig))]
        plain = subprocess.run(cmd, preexec_fn=ignoring, capture_output=True, text=True)
        assert plain.stdout.split() == ["False", "False"]  # the inheritance this guards against
        out = subprocess.run(die_with_parent(cmd, sig), preexec_fn=ignoring, capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout.split() == ["True", "True"], (sig, out.stderr)
