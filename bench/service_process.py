"""``hyperwatch serve`` as a child process on a free localhost port, for the benchmarks.

A separate process keeps the client's work off the service's GIL, as in a real deployment. The
helper itself is :class:`hyperwatch.monitor.processes.children.ServiceProcess`, shared with the demo and
the reliability tests.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hyperwatch.monitor.processes.children import ServiceProcess, free_port  # noqa: E402

__all__ = ["free_port", "serve_process", "service_process"]


@contextlib.contextmanager
def serve_process(db_url: str, token: str, timeout: float = 60.0, args: tuple[str, ...] = ()) -> Iterator[str]:
    """Start the service on ``db_url`` with write token ``token`` (``args``: more ``serve`` options); yields
    its base URL."""
    with service_process(db_url, token, timeout, args) as svc:
        yield svc.url


@contextlib.contextmanager
def service_process(
    db_url: str, token: str, timeout: float = 60.0, args: tuple[str, ...] = ()
) -> Iterator[ServiceProcess]:
    """:func:`serve_process`, yielding the running :class:`ServiceProcess` (its ``url``, its ``proc.pid``)."""
    svc = ServiceProcess(
        db_url,
        dev=False,
        upgrade=False,
        extra_args=("--log-level", "warning", *args),
        env={"HYPERWATCH_WRITE_TOKEN": token},
        ready_path="/healthz",
        timeout=timeout,
    )
    with svc:
        yield svc
