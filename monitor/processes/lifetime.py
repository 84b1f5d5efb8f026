"""Child processes that die with their parent (Linux), for the servers and runs we start.

A demo, a test session or a benchmark killed without its cleanup (SIGKILL, a crash, pytest
stopped by SIGTERM) used to leave ``hyperwatch serve``, Prometheus, Alertmanager and training
runs behind as orphans, holding ports and CPU. :func:`die_with_parent` wraps a command so that the
kernel sends the child a signal the moment its parent dies (``prctl(PR_SET_PDEATHSIG)``), on top of
the ordinary stop on exit.

The flag is set by a tiny Python launcher that then ``exec``s the real command (same pid, the flag
survives ``execve``), not by ``preexec_fn``: code run between ``fork`` and ``exec`` is unsafe in a
parent with threads, and the demo starts runs from a thread pool. The launcher checks its parent is
still the one that started it, so a parent that dies before the flag is set cannot leave an orphan
either. The kernel ties the signal to the parent *thread* that forked: start long-lived children
from a thread that outlives them (the main thread, or one that waits for the child, as sweeps do).

The launcher also gives the child the default action for SIGINT and for the death signal. A
process started from a shell without job control (``nohup cmd &``, a script's background job, some
CI runners) inherits SIGINT *ignored*, an ignored signal stays ignored across ``exec``, and Python
then installs no KeyboardInterrupt handler: a run's Ctrl-C path and the parent-death SIGINT that a
sweep asks for would do nothing, and the run would train on to its end (seen: the suite run from
such a shell, SIGINT sent at step 3, the run finished all 2000 steps).

Standard library only (the trainer's sweeps use it as well as the service helpers; it lives in
monitor/, below the app and the commands, so no import runs back up). Elsewhere than
Linux the command is returned unchanged.
"""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1

_LAUNCHER = f"""\
import ctypes, os, signal, sys
parent, sig = int(sys.argv[1]), int(sys.argv[2])
for s in {{signal.SIGINT, sig}}:
    signal.signal(s, signal.SIG_DFL)  # an ignored signal stays ignored across exec: see the module doc
if ctypes.CDLL(None, use_errno=True).prctl({PR_SET_PDEATHSIG}, sig, 0, 0, 0) != 0:
    sys.exit('die_with_parent: prctl(PR_SET_PDEATHSIG) failed: ' + os.strerror(ctypes.get_errno()))
if os.getppid() != parent:
    sys.exit(0)  # the parent died before the flag was set: do not start an orphan
os.execvp(sys.argv[3], sys.argv[3:])
"""


def die_with_parent(cmd: list[str], sig: int = signal.SIGTERM) -> list[str]:
    """``cmd`` launched so that it receives ``sig`` when this process dies (Linux; else ``cmd`` itself).

    SIGTERM lets the service and Prometheus shut down cleanly; a training run may ask for SIGINT,
    its Ctrl-C path (the run is marked "interrupted" and keeps its checkpoint)."""
    if not sys.platform.startswith("linux") or not cmd:
        return list(cmd)
    return [sys.executable, "-S", "-c", _LAUNCHER, str(os.getpid()), str(int(sig)), *cmd]


def exit_with_parent(sig: int = signal.SIGTERM) -> None:
    """This process receives ``sig`` when its parent dies (Linux; elsewhere nothing): for worker
    processes a pool starts itself (``ProcessPoolExecutor``'s initializer), which no command wraps.
    A parent that dies while the flag is set ends the worker at once."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "exit_with_parent: prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the parent died between the read and the flag
        os.kill(os.getpid(), sig)


__all__ = ["PR_SET_PDEATHSIG", "die_with_parent", "exit_with_parent"]
