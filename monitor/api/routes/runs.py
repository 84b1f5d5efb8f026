"""Runs: create-or-update by (project, name), partial update by id, list and filter."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import ValidationError

from hyperwatch.monitor.api.deps import ReadAuth, SettingsDep, StoreDep, WriteAuth
from hyperwatch.monitor.core.errors import NotFoundError
from hyperwatch.monitor.detect import learned
from hyperwatch.monitor.schemas import RunCreate, RunOut, RunUpdate, SeriesInfoOut, Status
from hyperwatch.monitor.store import identity
from hyperwatch.monitor.store.base import Store
from hyperwatch.monitor.store.entities import Run
from hyperwatch.monitor.views import run_view

router = APIRouter(tags=["runs"])
log = logging.getLogger(__name__)


def runs_out(runs: Iterable[dict[str, Any]]) -> list[RunOut]:
    """Each run the response model accepts; one that fails is left out and logged, never a 500 for the list."""
    out = []
    for run in runs:
        try:
            out.append(RunOut.model_validate(run))
        except ValidationError as exc:
            log.warning("run id %s cannot be sent (%s); left out of the list", run.get("id"), exc)
    return out


@router.post(
    "/runs",
    response_model=RunOut,
    status_code=201,
    dependencies=[WriteAuth],
    responses={
        200: {"model": RunOut, "description": "an existing run, updated"},
        409: {"description": "the name belongs to another process's run (send resume=true to continue it)"},
    },
    summary="Create a run, or update the run with this project and name",
)
def upsert_run(body: RunCreate, store: StoreDep, response: Response) -> RunOut:
    fields = body.model_dump(exclude_unset=True, exclude={"name", "project", "attach_id", "resume"})
    new = False
    if body.attach_id is not None:
        new = identity.claim(identity.engine_of(store), body.project, body.name, body.attach_id, body.resume)
    before = None
    if _moves(fields):
        with contextlib.suppress(NotFoundError):
            before = store.find_run(body.project, body.name)
    run, created = store.upsert_run(body.project, body.name, fields)
    if new and body.attach_id is not None:
        identity.remember(identity.engine_of(store), run.id, body.project, body.name, body.attach_id)
    _relearn(store, fields, before, run)
    response.status_code = 201 if created else 200
    return RunOut.model_validate(run)


def _moves(fields: dict[str, Any]) -> bool:
    """Whether an update can change which runs a group learns its thresholds from."""
    return "status" in fields or "group" in fields


def _relearn(store: Store, fields: dict[str, Any], before: Run | None, after: Run) -> None:
    """A group gaining or losing a finished run reads its runs again (monitor.detect.learned) before the
    reply: a run of the group started next is judged on what was learned (a failed read is logged)."""
    if _moves(fields):
        learned.refresh_quietly(store, [r.group_id for r in (before, after) if r and r.status == learned.FINISHED])


@router.get("/runs", response_model=list[RunOut], dependencies=[ReadAuth], summary="List runs")
def list_runs(
    store: StoreDep,
    settings: SettingsDep,
    project: str | None = None,
    group: str | None = None,
    tag: Annotated[list[str] | None, Query(description="repeat for runs having every tag")] = None,
    status: Status | None = None,
    limit: Annotated[int, Query(ge=1)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> list[RunOut]:
    limit = min(limit, settings.max_page_size)
    runs = store.list_runs(project, group, tag or (), status, limit, offset)
    return runs_out(run_view(r, settings.stale_after_s) for r in runs)


@router.get("/runs/{run_id}", response_model=RunOut, dependencies=[ReadAuth], summary="One run")
def get_run(run_id: int, store: StoreDep, settings: SettingsDep) -> RunOut:
    return RunOut.model_validate(run_view(store.get_run(run_id), settings.stale_after_s))


@router.patch("/runs/{run_id}", response_model=RunOut, dependencies=[WriteAuth], summary="Update a run")
def update_run(run_id: int, body: RunUpdate, store: StoreDep) -> RunOut:
    fields = body.model_dump(exclude_unset=True)
    before = store.get_run(run_id) if _moves(fields) else None
    run = store.update_run(run_id, fields)
    _relearn(store, fields, before, run)
    return RunOut.model_validate(run)


@router.get(
    "/runs/{run_id}/series_index",
    response_model=list[SeriesInfoOut],
    dependencies=[ReadAuth],
    summary="Every series of a run with its latest point",
)
def series_index(run_id: int, store: StoreDep) -> list[SeriesInfoOut]:
    return [SeriesInfoOut.model_validate(s) for s in store.list_series(run_id)]
