"""Runs: create-or-update by (project, name), partial update by id (archive too), delete, list and filter."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Query, Response
from pydantic import ValidationError

from hyperwatch.monitor.api import series_cursor, series_pages
from hyperwatch.monitor.api.deps import ReadAuth, ReaderDep, SettingsDep, StoreDep, WriteAuth
from hyperwatch.monitor.api.params import Limit, Offset, int_query, names_query
from hyperwatch.monitor.api.query_schemas import SeriesInfoOut
from hyperwatch.monitor.api.run_summary import RunListOut
from hyperwatch.monitor.api.schemas import RunCreate, RunDeleted, RunOut, RunUpdate, Status
from hyperwatch.monitor.core.errors import NotFoundError
from hyperwatch.monitor.read.lines import run_view
from hyperwatch.monitor.store import identity
from hyperwatch.monitor.store.base import Store
from hyperwatch.monitor.store.entities import Run
from hyperwatch.monitor.thresholds import learned

DEFAULT_SERIES_PAGE = 5_000
"""Far above a real run's series (a 64-layer model with 16 heads logs ~1,700), so one page is the run."""
MAX_SERIES_PAGE = 20_000
SERIES_INDEX_DOC = f"""Each (name, layer) series of the run with its latest step and value, in (name, layer)
order (the run-level series of a name first). At most `limit` series per answer (default
{DEFAULT_SERIES_PAGE:,}, at most {MAX_SERIES_PAGE:,}): when there are more, the answer carries the header
`X-Next-Cursor`; send its value back as `cursor` for the next page. A run holds at most
`HYPERWATCH_MAX_SERIES_PER_RUN` series (409 on ingest beyond it), so every page costs what it holds."""

MAX_SUMMARY_NAMES = 8
LIST_RUNS_DOC = f"""Runs by id, filtered. With `summary=loss,val_loss` (at most {MAX_SUMMARY_NAMES} names) each
run carries `metrics`: per named run-level metric it logged, its latest value and step, and its
smallest and largest values with their steps over every logged step (NaN never counts, the earliest
step wins a tie; non-finite values as the strings NaN, Infinity, -Infinity). They are read from each
series' latest point and its min/max summary blocks, not from its points, so a page costs a few
dozen rows per run and metric whatever the runs' length."""

R = TypeVar("R", bound=RunOut)
router = APIRouter(tags=["runs"])
log = logging.getLogger(__name__)


def runs_out(runs: Iterable[dict[str, Any]], model: type[R]) -> list[R]:
    """Each run the response model accepts; one that fails is left out and logged, never a 500 for the list."""
    out: list[R] = []
    for run in runs:
        try:
            out.append(model.model_validate(run))
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
    """Whether an update can change which runs a group learns its thresholds from (an archived run is
    not learned from)."""
    return "status" in fields or "group" in fields or "archived" in fields


def _relearn(store: Store, fields: dict[str, Any], before: Run | None, after: Run) -> None:
    """A group gaining or losing a finished run reads its runs again (monitor.thresholds.learned) before the
    reply: a run of the group started next is judged on what was learned (a failed read is logged)."""
    if _moves(fields):
        learned.refresh_quietly(store, [r.group_id for r in (before, after) if r and r.status == learned.FINISHED])


@router.get(
    "/runs",
    response_model=list[RunListOut],
    dependencies=[ReadAuth],
    summary="List runs",
    description=LIST_RUNS_DOC,
)
def list_runs(
    store: StoreDep,
    settings: SettingsDep,
    read: ReaderDep,
    project: str | None = None,
    group: str | None = None,
    tag: Annotated[list[str] | None, Query(description="repeat for runs having every tag")] = None,
    status: Status | None = None,
    archived: Annotated[
        bool | None, Query(description="true: the archived runs only; false or omitted: the others")
    ] = None,
    include_archived: Annotated[bool, Query(description="true: archived runs too")] = False,
    limit: Limit = 100,
    offset: Offset = 0,
    summary: Annotated[
        list[str] | None,
        names_query(
            "summary",
            MAX_SUMMARY_NAMES,
            f"run-level metrics to sum up in each run's `metrics` (repeat, or comma-separated; at most "
            f"{MAX_SUMMARY_NAMES}), e.g. summary=loss,val_loss",
        ),
    ] = None,
) -> list[RunListOut]:
    limit = min(limit, settings.max_page_size)
    which = None if include_archived else bool(archived)
    runs = store.list_runs(project, group, tag or (), status, limit, offset, archived=which)
    views = [run_view(r, settings.stale_after_s) for r in runs]
    if summary:
        found = read.run_summaries(runs, summary)
        views = [
            {**v, "metrics": {n: found[r.id][n] for n in summary if n in found[r.id]}} for v, r in zip(views, runs)
        ]
    return runs_out(views, RunListOut)


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


@router.delete(
    "/runs/{run_id}",
    response_model=RunDeleted,
    dependencies=[WriteAuth],
    summary="Delete a run and everything it holds (points, series, alerts, incidents); cannot be undone",
    description='To hide a run but keep it, archive it instead: PATCH the run with `{"archived": true}`.',
)
def delete_run(run_id: int, store: StoreDep) -> RunDeleted:
    before = store.get_run(run_id)
    project, name, series = store.delete_run(run_id)
    if before.status == learned.FINISHED:  # its group learned from it: read the group's runs again
        learned.refresh_quietly(store, [before.group_id])
    return RunDeleted(id=run_id, project=project, name=name, series=series)


@router.get(
    "/runs/{run_id}/series_index",
    response_model=list[SeriesInfoOut],
    dependencies=[ReadAuth],
    summary="The series of a run with their latest point, a page at a time",
    description=SERIES_INDEX_DOC,
)
def series_index(
    run_id: int,
    store: StoreDep,
    limit: Annotated[
        int, int_query("limit", 1, MAX_SERIES_PAGE, f"series per page (at most {MAX_SERIES_PAGE:,})")
    ] = DEFAULT_SERIES_PAGE,
    cursor: Annotated[
        str | None, Query(max_length=300, description="X-Next-Cursor of the page before; omit for the first")
    ] = None,
) -> Response:
    body, last = series_pages.pages.get(store, run_id, limit, series_cursor.decode(cursor))
    headers = {} if last is None else {"X-Next-Cursor": series_cursor.encode(last.name, last.layer)}
    return Response(body, media_type="application/json", headers=headers)
