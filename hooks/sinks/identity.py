"""The HTTP spool and run identity: a spool folder is delivered only into the run it was written for.

``<spool>/<run>/run.json`` carries the ``attach_id`` of the process that wrote it. A later process
of the same run name finds that folder at ``start``:

- it resumes (``hooks.attach(resume=True)``) a run the service accepted: it adopts the folder and
  resends what is left (the crash-then-resume case);
- otherwise (a new run of that name, or the folder's run was refused by the service): the folder is
  moved to ``<run>.earlier-<id>`` and the log gives the ``hyperwatch upload`` command for it.

Once a run is delivered entirely its folder is removed, so nothing of it is left to be found.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
from pathlib import Path
from typing import Any

from hyperwatch.hooks.sinks.base import RunInfo, SinkError
from hyperwatch.hooks.sinks.folder import (
    DROPPED_FILE,
    REJECTED_DIR,
    RUN_FILE,
    STATUS_FILE,
    UPDATE_FILE,
    pending_files,
    read_json,
    write_json_atomic,
)
from hyperwatch.hooks.sinks.settings import base_url_hint

log = logging.getLogger("hyperwatch.hooks.sinks.http")
REFUSED_FILE = "refused.json"
"""The service refused this folder's run (409: the name is another process's run); never adopted."""


def detail(body: Any) -> str:
    """The service's error message (``{"detail": ...}``), else the body as text."""
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        return str(body["detail"])
    return str(body)


def mark_refused(folder: Path | None, why: str) -> None:
    if folder is not None:
        write_json_atomic(folder / REFUSED_FILE, {"detail": why})


def create_refused(status: int, body: Any, run: RunInfo, folder: Path | None, url: str) -> tuple[str, bool]:
    """The service's answer to creating the run, when it is 409 or 422: (refusal, try again).

    409: the name is another process's run; the folder is marked and nothing more is sent.
    422 naming ``attach_id``: a service older than run identity; the run is created by name."""
    if status == 409:
        why = detail(body)
        mark_refused(folder, why)
        log.error("hooks: the service refused run %r: %s", run.name, why)
        return why, False
    if status == 422 and run.attach_id and "attach_id" in str(body):
        log.warning("hooks: the service at %s predates run identity; creating run %r by name", url, run.name)
        run.attach_id = ""
        return "", True
    return "", False


def set_aside_earlier(folder: Path, run: RunInfo, url: str) -> None:
    """Move an earlier process's folder of this run name aside unless this process resumes its run."""
    if not (folder / RUN_FILE).is_file():
        return
    try:
        earlier = read_json(folder / RUN_FILE)
    except (OSError, ValueError):
        earlier = {}
    earlier_id = earlier.get("attach_id") if isinstance(earlier, dict) else None
    if earlier_id == run.attach_id:
        return
    if run.resume and not (folder / REFUSED_FILE).is_file():
        return
    stem = f"{folder.name}.earlier-{(earlier_id or 'unknown')[:12]}"
    aside, n = folder.with_name(stem), 1
    while aside.exists():
        n += 1
        aside = folder.with_name(f"{stem}-{n}")
    try:
        os.replace(folder, aside)
    except OSError as exc:
        raise SinkError(
            f"spool: {folder} holds an earlier process's run {run.name!r} and cannot be moved aside ({exc}); "
            "deliver it with 'hyperwatch upload', or attach with resume=True to continue that run"
        ) from exc
    command = f"hyperwatch upload {shlex.quote(str(aside))} --server {shlex.quote(base_url_hint(url))}"
    log.warning(
        "hooks: %s holds the spool of an earlier process of run %r; it is moved to %s and not sent into "
        "this process's run. Deliver it to the run it was written for with:\n    %s",
        folder,
        run.name,
        aside,
        command,
    )


def remove_delivered(folder: Path, name: str) -> None:
    """Remove a run's folder when nothing is left in it (no pending batch, status, field update,
    rejected batch or drop record): no later process finds anything of this run."""
    left = [f for f in (STATUS_FILE, UPDATE_FILE, DROPPED_FILE, REJECTED_DIR, REFUSED_FILE) if (folder / f).exists()]
    if left or pending_files(folder):
        return
    try:
        shutil.rmtree(folder)
    except OSError as exc:
        log.warning("hooks: run %r is delivered but its spool folder %s stays: %s", name, folder, exc)
