"""``hyperwatch serve --dev`` on a non-local address with no real write token refuses to start
(issue 37: it started with only a warning, open to anyone who could reach the port), unless told
explicitly with ``--allow-open`` or ``HYPERWATCH_ALLOW_OPEN=1``. Run as a user runs it: a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hyperwatch.monitor.processes.children import ServiceProcess
from hyperwatch.serve import is_loopback
from tests.reliability.support import REPO, free_port, python_env


def _serve(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    db = f"sqlite:///{tmp_path}/open.db"
    cmd = [sys.executable, "-m", "hyperwatch", "serve", "--db", db, "--port", str(free_port()), *args]
    return subprocess.run(cmd, cwd=REPO, env=python_env(**env), capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    ("host", "env"),
    [("0.0.0.0", {}), ("::", {}), ("192.0.2.7", {}), ("0.0.0.0", {"HYPERWATCH_WRITE_TOKEN": "changeme"})],
)
def test_dev_mode_on_a_network_address_without_a_real_token_refuses_to_start(
    tmp_path: Path, host: str, env: dict[str, str]
) -> None:
    done = _serve(tmp_path, "--dev", "--host", host, **env)
    assert done.returncode == 2, done.stderr
    assert "refusing to start" in done.stderr and f"--host {host}" in done.stderr
    assert "--allow-open" in done.stderr and "HYPERWATCH_WRITE_TOKEN" in done.stderr
    assert not (tmp_path / "open.db").exists()  # refused before anything was created


def test_allow_open_starts_it_on_purpose(tmp_path: Path) -> None:
    for how, extra in (("flag", ("--allow-open",)), ("env", ())):
        env = {"HYPERWATCH_ALLOW_OPEN": "1"} if how == "env" else {}
        svc = ServiceProcess(f"sqlite:///{tmp_path}/{how}.db", host="0.0.0.0", log_path=tmp_path / f"{how}.log",
                             env=env, keep_hyperwatch_env=False, ready_path="/healthz")  # fmt: skip
        svc.start(*extra)
        try:
            assert svc.healthy()
            assert "reachable from other machines" in svc.log()  # still warned
        finally:
            svc.kill()


def test_loopback_addresses_and_real_tokens_need_no_flag() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.org"))


def test_the_flag_is_in_the_help() -> None:
    done = subprocess.run([sys.executable, "-m", "hyperwatch", "serve", "--help"], cwd=REPO, env=python_env(),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert "--allow-open" in done.stdout and "HYPERWATCH_ALLOW_OPEN" in done.stdout
