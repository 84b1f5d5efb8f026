"""A run's status when its process ends without ``mon.close()``: as W&B does without ``finish()``.

Without this a run killed by Ctrl-C, or whose script raised outside a ``with hooks.attach(...)``
block, stayed ``running`` until the service called it stale. :func:`watch` (called by
``hooks.attach``) registers the monitor; at interpreter exit every monitor still open is closed
with the status the exit deserves:

- an uncaught ``KeyboardInterrupt`` (Ctrl-C): ``interrupted`` (the run can be resumed);
- any other uncaught exception, or ``sys.exit`` with a non-zero code: ``failed``;
- the script's normal end, or ``sys.exit(0)``: ``finished``.

How the exit is known: ``sys.excepthook`` and ``sys.exit`` are chained (the previous ones are
still called), as W&B does. The close is bounded by the monitor's ``close_timeout`` (what is not
delivered stays in the spool, with its replay command logged), never raises, and a second Ctrl-C
abandons it. A process killed by SIGKILL, SIGTERM's default action or ``os._exit`` runs no exit
code at all: its run turns stale on the service.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time
import weakref
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from hyperwatch.hooks.monitor import Monitor

log = logging.getLogger(__name__)

_open: weakref.WeakSet[Monitor] = weakref.WeakSet()
_lock = threading.Lock()
_installed = False
_uncaught: type[BaseException] | None = None  # what sys.excepthook saw
_exit_code: Any = None  # what sys.exit was given
_exited = False  # sys.exit was called


def status_at_exit() -> str:
    """``interrupted``, ``failed`` or ``finished``, from how the interpreter is ending."""
    if _uncaught is not None:
        return "interrupted" if issubclass(_uncaught, KeyboardInterrupt) else "failed"
    if _exited and _exit_code not in (None, 0):
        return "failed"
    return "finished"


def watch(mon: Monitor) -> None:
    """Close ``mon`` at interpreter exit, with :func:`status_at_exit`, unless it is closed before."""
    global _installed
    with _lock:
        _open.add(mon)
        if _installed:
            return
        _installed = True
        previous_hook, previous_exit = sys.excepthook, sys.exit

        def excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
            global _uncaught
            _uncaught = kind
            previous_hook(kind, value, tb)

        def exit(code: Any = None) -> NoReturn:
            global _exit_code, _exited
            _exited, _exit_code = True, code
            previous_exit(code)
            raise SystemExit(code)  # a replaced sys.exit that returned: exit anyway

        sys.excepthook = excepthook
        sys.exit = exit
        atexit.register(close_open)


def close_open() -> None:
    """Close every monitor still open (the atexit handler); never raises.

    One exit budget for all of them, the largest ``close_timeout`` (each close is bounded by its
    own): a process with many open monitors on an unreachable service does not wait for each in
    turn; those left when it is spent are named and left to turn stale (their spools keep them)."""
    status = status_at_exit()
    monitors = [m for m in list(_open) if not m.closed]
    deadline = time.monotonic() + max((m.close_timeout for m in monitors), default=0.0)
    for i, mon in enumerate(monitors):
        if i and time.monotonic() >= deadline:
            names = ", ".join(repr(m.run.name) for m in monitors[i:])
            log.warning("hooks: the exit's close budget is spent; runs %s were not marked %s", names, status)
            return
        try:
            log.info("hooks: run %r was not closed; the process is ending: marking it %s", mon.run.name, status)
            mon.close(status)
        except KeyboardInterrupt:  # a second Ctrl-C: stop waiting, the spool keeps what is left
            log.warning("hooks: closing run %r at exit was interrupted; its spool keeps the rest", mon.run.name)
            return
        except Exception:
            log.exception("hooks: closing run %r at exit failed", mon.run.name)
