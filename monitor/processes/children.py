"""Child processes the demo, the benchmarks and the tests start: the service, Prometheus, Alertmanager.

One helper per kind, written once: :class:`ServiceProcess` (``hyperwatch serve`` on a free
localhost port, schema upgraded first, waited for on ``/readyz``) and :class:`AlertingStack`
(Debian's ``/usr/bin/prometheus`` and ``/usr/bin/prometheus-alertmanager`` with configuration
generated into a temporary folder: Prometheus scrapes the service and evaluates
``prometheus/rules.yml``; Alertmanager delivers what fires to the service's webhook
``POST /api/v1/alerts/prometheus``). Everything binds to 127.0.0.1, is stopped on exit, and dies
with the process that started it even when that one is killed (:func:`.lifetime.die_with_parent`).
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from hyperwatch.monitor.processes.lifetime import die_with_parent

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "prometheus" / "rules.yml"


class ChildProcessError(RuntimeError):
    """A child process could not be started or did not become ready; the message says which and why."""


def free_port(host: str = "127.0.0.1", preferred: int = 0) -> int:
    """``preferred`` when it is free (0: none preferred), else any free port on ``host``.

    The test bind sets SO_REUSEADDR, as uvicorn's own bind does: a port whose last connections are
    in TIME_WAIT (a service stopped a moment ago) is free for the service, and a second quick
    ``make demo`` keeps :8000 instead of moving to a random port that scripts do not know."""
    for port in dict.fromkeys((preferred, 0)):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise OSError(f"no free port on {host}")


def wait_http(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float = 60.0) -> None:
    """Wait until ``url`` answers 200, failing at once (with the exit code) if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ChildProcessError(f"{what} exited with code {proc.returncode} before it was ready")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as resp:
            if resp.status == 200:
                return
        time.sleep(0.1)
    raise ChildProcessError(f"{what} was not ready at {url} after {timeout:.0f} s")


def stop(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """Terminate politely (SIGTERM), then kill; a no-op for a process that already exited."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


def python_env(*, keep_hyperwatch: bool = True, **extra: str) -> dict[str, str]:
    """This interpreter's environment with this checkout importable (children import the same code).

    ``keep_hyperwatch=False`` drops every inherited ``HYPERWATCH_*`` setting (tests that must not
    pick up the developer's token or database)."""
    env = {k: v for k, v in os.environ.items() if keep_hyperwatch or not k.startswith("HYPERWATCH_")}
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{path}" if path else str(REPO)
    return {**env, **extra}


class _Children(abc.ABC):
    """A context manager over ``start()`` and ``stop()``: a failed start still stops what it began."""

    @abc.abstractmethod
    def start(self) -> Self: ...

    @abc.abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class ServiceProcess(_Children):
    """``hyperwatch serve`` as a child process; a context manager that yields itself, ready.

    ``upgrade`` runs ``hyperwatch db upgrade`` first (a fresh database is created). ``log_path``
    receives the service's output (else it is discarded). ``env`` adds environment variables
    (``HYPERWATCH_WRITE_TOKEN``...); ``keep_hyperwatch_env=False`` drops inherited ones. ``dev``
    passes ``--dev`` (no token needed on localhost). ``ready_path`` is what "ready" means
    (``/readyz``: the database answers; ``/healthz``: the process serves). The service runs in
    its own session, so a Ctrl-C in the terminal reaches the training runs but not the service
    they still report to; :meth:`stop` ends it. :meth:`start` again restarts it on the same port.
    """

    def __init__(
        self,
        db_url: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_path: Path | None = None,
        dev: bool = True,
        upgrade: bool = True,
        extra_args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        keep_hyperwatch_env: bool = True,
        ready_path: str = "/readyz",
        timeout: float = 60.0,
    ) -> None:
        self.db_url, self.host, self.dev, self.upgrade = db_url, host, dev, upgrade
        self.port = free_port(host, port)
        self.log_path, self.extra_args, self.env, self.timeout = log_path, extra_args, env or {}, timeout
        self.keep_hyperwatch_env, self.ready_path = keep_hyperwatch_env, ready_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._out: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, *args: str, ready: bool = True) -> ServiceProcess:
        """Start (or restart) the service; ``args`` replace the extra ``serve`` arguments when given."""
        if self.proc is not None and self.proc.poll() is None:
            raise ChildProcessError(f"hyperwatch serve is already running on {self.url}")
        self.extra_args = tuple(args) or self.extra_args
        hw = [sys.executable, "-m", "hyperwatch"]
        env = python_env(keep_hyperwatch=self.keep_hyperwatch_env, **self.env)
        if self.upgrade:
            done = subprocess.run(
                [*hw, "db", "upgrade", "--db", self.db_url], capture_output=True, text=True, env=env, check=False
            )
            if done.returncode != 0:
                raise ChildProcessError(f"'hyperwatch db upgrade' failed: {done.stderr.strip()[-500:]}")
            self.upgrade = False  # once is enough: a restart keeps the schema
        if self.log_path is not None and self._out is None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._out = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the service
        cmd = [*hw, "serve", "--db", self.db_url, "--host", self.host, "--port", str(self.port)]
        cmd += ["--dev"] if self.dev else []
        self.proc = subprocess.Popen(
            die_with_parent([*cmd, *self.extra_args]),
            stdout=self._out or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            start_new_session=True,  # Ctrl-C in the terminal stops the runs, which still report to it
        )
        if ready:
            try:
                wait_http(f"{self.url}{self.ready_path}", self.proc, "hyperwatch serve", self.timeout)
            except ChildProcessError as exc:
                self.kill()
                raise ChildProcessError(f"{exc}; its log:\n{self.log()[-3000:]}") from exc
        return self

    def healthy(self) -> bool:
        """The process runs and ``/healthz`` answers 200."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no cleanup runs, in-flight requests and transactions are cut (crash tests)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def log(self) -> str:
        if self._out is not None:
            self._out.flush()
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def stop(self) -> None:
        stop(self.proc)
        if self._out is not None:
            self._out.close()
            self._out = None


PROMETHEUS_BIN = "/usr/bin/prometheus"
ALERTMANAGER_BIN = "/usr/bin/prometheus-alertmanager"


def _binary(name: str, default: str) -> str:
    return shutil.which(name) or default


def alerting_available() -> str | None:
    """None when Prometheus, Alertmanager and the rules are all here; else what is missing."""
    binaries = (_binary("prometheus", PROMETHEUS_BIN), _binary("prometheus-alertmanager", ALERTMANAGER_BIN))
    missing = [p for p in binaries if not os.access(p, os.X_OK)]
    if missing:
        return f"not installed: {', '.join(missing)} (scripts/system-deps.sh installs them)"
    if not RULES.is_file():
        return f"{RULES} is missing"
    return None


def fast_rules(rules: str, for_: str = "0s") -> str:
    """``prometheus/rules.yml`` with every ``for:`` shortened (a demo or a test lasts minutes); nothing else.

    Every rule compares statistics counted in logged steps (the service exports them: the Z baselines,
    the loss and grad-norm statistics, the growth rises), so the rules fire at a demo's pace as in
    production, whatever the scrape interval; only a ``for:`` is wall-clock (MaxVio for 2 minutes, a
    stale run for 5) and would never fire within a demo. Until 2026-11-30 the growth and loss rules
    took windows of one-minute samples, and a demo that logs a step every few seconds had them
    rewritten to its scrape interval.
    """
    return re.sub(r"(?m)^(\s+)for: \S+$", rf"\g<1>for: {for_}", rules)


class AlertingStack(_Children):
    """Prometheus and Alertmanager as child processes wired to a running service at ``service_url``.

    Prometheus scrapes ``service_url/metrics`` every ``interval`` and evaluates the (shortened,
    see :func:`fast_rules`) rules as often; Alertmanager groups by (alertname, project, run) and
    posts to ``service_url/api/v1/alerts/prometheus`` within about a second of an alert firing.
    """

    def __init__(
        self, service_url: str, *, interval: str = "1s", token: str | None = None, log_dir: Path | None = None
    ):
        self.service_url = service_url.rstrip("/")
        self.interval, self.token = interval, token
        self.dir = Path(tempfile.mkdtemp(prefix="hyperwatch-alerting-"))
        self.log_dir = log_dir or self.dir
        self.prom_port, self.am_port = free_port(), free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prom_port}"

    @property
    def alertmanager_url(self) -> str:
        return f"http://127.0.0.1:{self.am_port}"

    def _write_configs(self) -> tuple[Path, Path]:
        target = self.service_url.split("://", 1)[1]
        auth = f"\n    authorization:\n      credentials: {self.token}" if self.token else ""
        (self.dir / "rules.yml").write_text(fast_rules(RULES.read_text()))
        prom = self.dir / "prometheus.yml"
        prom.write_text(
            f"global:\n  scrape_interval: {self.interval}\n  evaluation_interval: {self.interval}\n"
            f"rule_files:\n  - {self.dir / 'rules.yml'}\n"
            f"alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['127.0.0.1:{self.am_port}']\n"
            f"scrape_configs:\n  - job_name: hyperwatch\n    metrics_path: /metrics\n"
            f"    static_configs:\n      - targets: ['{target}']{auth}\n"
        )
        hook_auth = (
            f"\n        http_config:\n          authorization:\n            credentials: {self.token}"
            if self.token
            else ""
        )
        am = self.dir / "alertmanager.yml"
        am.write_text(
            "route:\n  receiver: hyperwatch\n  group_by: [alertname, project, run]\n"
            "  group_wait: 1s\n  group_interval: 5s\n  repeat_interval: 1h\n"
            "receivers:\n  - name: hyperwatch\n    webhook_configs:\n"
            f"      - url: {self.service_url}/api/v1/alerts/prometheus\n        send_resolved: false{hook_auth}\n"
        )
        return prom, am

    def _spawn(self, cmd: list[str], name: str) -> subprocess.Popen[bytes]:
        out = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop()
        self._logs.append(out)
        proc = subprocess.Popen(
            die_with_parent(cmd), stdout=out, stderr=subprocess.STDOUT, cwd=self.dir, start_new_session=True
        )
        self.procs.append(proc)
        return proc

    def start(self) -> AlertingStack:
        missing = alerting_available()
        if missing:
            raise ChildProcessError(f"Prometheus and Alertmanager cannot start: {missing}")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        prom_cfg, am_cfg = self._write_configs()
        am = self._spawn(
            [
                _binary("prometheus-alertmanager", ALERTMANAGER_BIN),
                f"--config.file={am_cfg}",
                f"--storage.path={self.dir / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{self.am_port}",
                "--cluster.listen-address=",  # no gossip port: a single local instance
            ],
            "alertmanager",
        )
        prom = self._spawn(
            [
                _binary("prometheus", PROMETHEUS_BIN),
                f"--config.file={prom_cfg}",
                f"--storage.tsdb.path={self.dir / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{self.prom_port}",
            ],
            "prometheus",
        )
        wait_http(f"{self.alertmanager_url}/-/ready", am, "prometheus-alertmanager")
        wait_http(f"{self.prometheus_url}/-/ready", prom, "prometheus")
        return self

    def firing(self) -> list[str]:
        """Names of the alerts Prometheus has firing now (empty if it cannot be asked)."""
        import json

        try:
            with urllib.request.urlopen(f"{self.prometheus_url}/api/v1/alerts", timeout=2) as resp:
                data = json.loads(resp.read())
        except (OSError, ValueError):
            return []
        return [a["labels"].get("alertname", "") for a in data["data"]["alerts"] if a.get("state") == "firing"]

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop(proc)
        for f in self._logs:
            f.close()
        self.procs.clear()
        self._logs.clear()
        shutil.rmtree(self.dir / "prom-data", ignore_errors=True)
        shutil.rmtree(self.dir / "am-data", ignore_errors=True)


__all__ = [
    "AlertingStack",
    "ChildProcessError",
    "ServiceProcess",
    "alerting_available",
    "fast_rules",
    "free_port",
    "stop",
    "wait_http",
]
