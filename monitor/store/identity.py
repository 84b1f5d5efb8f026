"""Run identity: which process may write a run of a given name (``runs.attach_id``, migration 0009).

The hooks send ``attach_id`` (random, one per ``hooks.attach``) and ``resume`` with the run. Rules,
checked in the transaction that creates or updates the run:

- no run of that name: it is created and remembers the id;
- the run remembers this id: it is this process's own run (a retried or repeated POST);
- another id (or a run created without one) and ``resume`` is false: 409, naming the run, its
  status and last step, and the two ways out (``resume=True`` or a new name);
- ``resume``: the run now belongs to this process; its ``unavailable`` list is cleared, so the
  new process's own report replaces the old one (no stale "not measured" banner).

A client that sends no ``attach_id`` (the trainer's older folders, scripts using the API) keeps
today's create-or-update by name.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update
from sqlalchemy.engine import Engine

from hyperwatch.monitor.core.errors import ConflictError
from hyperwatch.monitor.store.engine import managed, retry_busy
from hyperwatch.monitor.store.models import ProjectRow, RunRow


def conflict_message(project: str, name: str, run_id: int, status: str, last_step: int | None) -> str:
    progress = "no points yet" if last_step is None else f"last step {last_step}"
    return (
        f"run {name!r} in project {project!r} already exists (id {run_id}, status {status}, {progress}) and was "
        f"started by another process. To continue it (e.g. after a crash, from a checkpoint) attach with "
        f"hooks.attach(..., resume=True); to start a new run, give a new run name"
    )


@retry_busy
def claim(engine: Engine, project: str, name: str, attach_id: str, resume: bool) -> bool:
    """Check (and on resume, take over) the run ``project/name`` for ``attach_id`` before it is written.

    Returns True when the run does not exist yet (the caller creates it, then :func:`remember`).
    Raises :class:`ConflictError` when another process's run holds the name and ``resume`` is false."""
    with managed(engine, f"claim run {project}/{name}", write=True) as conn:
        row = conn.execute(
            select(RunRow.id, RunRow.status, RunRow.attach_id, RunRow.last_step)
            .join(ProjectRow, ProjectRow.id == RunRow.project_id)
            .where(ProjectRow.name == project, RunRow.name == name)
        ).first()
        if row is None:
            return True
        if row.attach_id == attach_id:
            return False
        if not resume:
            raise ConflictError(conflict_message(project, name, row.id, row.status, row.last_step))
        conn.execute(update(RunRow).where(RunRow.id == row.id).values(attach_id=attach_id, unavailable={}))
        return False


@retry_busy
def remember(engine: Engine, run_id: int, project: str, name: str, attach_id: str) -> None:
    """A run just created remembers its process; a second process that created it in the same
    instant (both saw no run) is refused here rather than merged."""
    with managed(engine, f"remember the process of run {run_id}", write=True) as conn:
        conn.execute(update(RunRow).where(RunRow.id == run_id, RunRow.attach_id.is_(None)).values(attach_id=attach_id))
        row = conn.execute(select(RunRow.attach_id, RunRow.status, RunRow.last_step).where(RunRow.id == run_id)).first()
        if row is not None and row.attach_id != attach_id:
            raise ConflictError(conflict_message(project, name, run_id, row.status, row.last_step))


def engine_of(store: Any) -> Engine:
    """The SQL store's engine (the only store implementation)."""
    engine = getattr(store, "engine", None)
    if not isinstance(engine, Engine):
        raise TypeError(f"run identity needs the SQL store; got {type(store).__name__}")
    return engine
