"""What a run ran on, and light system metrics of its logged steps (standard library and torch only).

:func:`describe` is stored once with the run, in its config under ``_hyperwatch``: the git commit
of the working directory's repository and whether tracked files differ from it, the host, the
Python, torch, CUDA and cuDNN versions, the device's name and the number of devices, the world
size. Each field is best effort: a value that cannot be read is left out (git says why under
``git_unavailable``), and nothing here raises or waits more than :data:`GIT_TIMEOUT` per command.

:func:`points` are the system metrics of a logged step, read on the emitter thread of rank 0
(the training thread pays nothing, and no step waits on the device: both read host-side
counters):

- ``cuda_max_memory_allocated``: ``torch.cuda.max_memory_allocated`` of the model's device, the
  running peak since the process started (or since the user last called
  ``torch.cuda.reset_peak_memory_stats``; the hooks never reset it, so a user reading it sees
  their own peak).
- ``host_rss``: the process's resident memory now (``/proc/self/statm``; where there is no
  ``/proc``, the peak ``ru_maxrss`` of ``resource.getrusage``).
"""

from __future__ import annotations

import logging
import os
import platform
import socket
import subprocess
import sys
from typing import Any

import torch
import torch.distributed as dist

from hyperwatch.hooks.schema import Point

log = logging.getLogger(__name__)

GIT_TIMEOUT = 2.0
"""Seconds each ``git`` command may take before it is given up (attach never waits longer)."""

CUDA_MAX_MEMORY = "cuda_max_memory_allocated"
HOST_RSS = "host_rss"
NAMES = (CUDA_MAX_MEMORY, HOST_RSS)
"""The system metrics: the process's memory, not the model's values (two runs of one model differ)."""


def _git(args: list[str], cwd: str) -> str:
    """Run ``git args`` in ``cwd``; its stdout, or RuntimeError with the reason."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except FileNotFoundError:
        raise RuntimeError("git is not installed (no `git` on PATH)") from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"`git {' '.join(args)}` took more than {GIT_TIMEOUT:g} s") from None
    except OSError as e:
        raise RuntimeError(f"`git` could not run: {e}") from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[0]
        raise RuntimeError(why[:200])
    return done.stdout


def git_state(cwd: str | None = None) -> dict[str, Any]:
    """``{"git_commit": <sha>, "git_dirty": bool}`` of the repository holding ``cwd`` (default: the
    working directory), else ``{"git_unavailable": <reason>}``. Dirty means a tracked file differs
    from the commit (staged or not); untracked files (logs, checkpoints) do not count, as in
    ``git describe --dirty``."""
    try:
        where = cwd if cwd is not None else os.getcwd()
        commit = _git(["rev-parse", "--verify", "HEAD"], where).strip()
        dirty = bool(_git(["status", "--porcelain", "--untracked-files=no"], where).strip())
        return {"git_commit": commit, "git_dirty": dirty}
    except Exception as e:  # never fail attach
        return {"git_unavailable": str(e) or type(e).__name__}


def _best_effort(env: dict[str, Any], key: str, read: Any) -> None:
    try:
        value = read()
    except Exception:  # a field that cannot be read is left out
        log.debug("hooks: environment field %s could not be read", key, exc_info=True)
        return
    if value is not None:
        env[key] = value


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def describe(device: torch.device) -> dict[str, Any]:
    """Where the run runs (``device``: the model's). Never raises."""
    env: dict[str, Any] = {}
    _best_effort(env, "host", socket.gethostname)
    _best_effort(env, "python", platform.python_version)
    _best_effort(env, "torch", lambda: torch.__version__)
    _best_effort(env, "cuda", lambda: torch.version.cuda)
    _best_effort(env, "cudnn", lambda: torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None)
    _best_effort(env, "device", lambda: str(device))
    if device.type == "cuda":
        _best_effort(env, "device_name", lambda: torch.cuda.get_device_name(device))
        _best_effort(env, "device_count", torch.cuda.device_count)
    _best_effort(env, "world_size", _world_size)
    env.update(git_state())
    return env


def host_rss() -> float | None:
    """Resident memory of this process in bytes (the peak where there is no ``/proc``), or None."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return float(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB elsewhere
    except Exception:  # no resource module (Windows)
        return None


def points(device: torch.device, step: int, tokens: int | None) -> list[Point]:
    """The system metrics of one logged step (emitter thread, rank 0). Never raises."""
    out: list[Point] = []
    try:
        if device.type == "cuda" and torch.cuda.is_initialized():
            out.append(Point(CUDA_MAX_MEMORY, step, float(torch.cuda.max_memory_allocated(device)), tokens=tokens))
    except Exception:  # a metric that cannot be read is not sent
        log.debug("hooks: %s could not be read", CUDA_MAX_MEMORY, exc_info=True)
    rss = host_rss()
    if rss is not None:
        out.append(Point(HOST_RSS, step, rss, tokens=tokens))
    return out
