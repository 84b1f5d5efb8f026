"""The live stream of an open page: a long poll on a cursor, so only points after the last drawn one travel."""

from __future__ import annotations

import time
from typing import Annotated

import anyio
from fastapi import APIRouter, Query, Request, Response

from hyperwatch.monitor.core.errors import InvalidInputError
from hyperwatch.monitor.live_notify import FALLBACK_S, news
from hyperwatch.monitor.schemas import MetricName, XAxis
from hyperwatch.monitor.store.entities import Run
from hyperwatch.monitor.views import MAX_GROUP_RUNS
from hyperwatch.monitor.views_live import LINE_MODES, Cursor, run_delta, to_json
from hyperwatch.monitor.views_read import ReaderDep

router = APIRouter(tags=["query"])  # ReaderDep checks read auth

LIVE_DOC = f"""New points of some runs since a page drew them: a long poll on a cursor.

Give one `cursor=<run_id>:<last step drawn>[:<status>]` per run drawn (`-1` before any point), or
`group_id` for every run of a group (runs of the group without a cursor are listed in `added`:
read them whole first). The request waits up to `wait` seconds until a run has points after its
cursor (or a status other than the one given): it wakes when this service stores a batch of one
of its runs, and reads its runs every {FALLBACK_S} s besides (points written by another replica,
a status set elsewhere); then it answers each
run's state and, for runs that moved, the part of each `name` after the cursor, read by the same
rules as the first read: per-layer indicators aggregated over layers (`line=mean`, `line=max`)
per bucket of `every` steps (each layer's max per bucket, so spikes survive), `line=heat` the
heatmap's new columns, `line=<n>` layer n; a run-level metric answers under `run`. Alerts with an
id above `alert_after` come with their run. Send the returned `cursor` of each run next time.
Non-finite values are the strings "NaN", "Infinity", "-Infinity". Nothing is computed on the
ingest path (it only sets the waiting requests' events): a waiting page costs one small read of its
runs when they move, and every {FALLBACK_S} s; one new step is answered from the values the store
kept of the batches this service stored (a read of the latest values when another replica stored it)."""


def _parse(cursors: list[str]) -> dict[int, Cursor]:
    try:
        parsed = [Cursor.parse(c) for c in cursors]
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from exc
    return {c.run_id: c for c in parsed}


@router.get(
    "/live",
    summary="New points since a page's cursor (long poll)",
    description=LIVE_DOC,
    response_class=Response,
    responses={200: {"content": {"application/json": {}}, "description": "each run's state and new points"}},
)
async def live(
    request: Request,
    read: ReaderDep,
    name: Annotated[list[MetricName], Query(description="indicator; repeat for each")],
    cursor: Annotated[list[str] | None, Query(description="<run_id>:<last step drawn>[:<status>]; repeat")] = None,
    group_id: Annotated[int | None, Query(description="every run of this group")] = None,
    line: Annotated[list[str] | None, Query(description="mean, max, heat or a layer number; repeat")] = None,
    every: Annotated[int, Query(ge=1, description="bucket width in steps (the first read's)")] = 1,
    x: Annotated[XAxis, Query(description="step, tokens, flops or fraction")] = "step",
    alert_after: Annotated[int, Query(ge=0, description="the largest alert id drawn")] = 0,
    wait: Annotated[float, Query(ge=0, le=30, description="seconds to wait for news")] = 10.0,
) -> Response:
    store, settings = read.store, read.settings
    cursors = _parse(cursor or [])
    modes = line or ["mean", "max"]
    bad = [m for m in modes if m not in LINE_MODES and not m.isdigit()]
    if bad:
        raise InvalidInputError(f"line: {bad[0]!r} is not one of {', '.join(LINE_MODES)} or a layer number")
    if not cursors and group_id is None:
        raise InvalidInputError("cursor: give one cursor=<run_id>:<step> per run drawn, or group_id")
    if len(cursors) > settings.max_compare_runs:
        raise InvalidInputError(f"cursor: {len(cursors)} runs; the limit is {settings.max_compare_runs}")

    def read_runs() -> list[Run]:
        if group_id is not None:
            return read.group(group_id)[1][:MAX_GROUP_RUNS]
        return [read.run(rid) for rid in cursors]

    def build(runs: list[Run], added: list[int]) -> bytes:
        out = [
            run_delta(store, run, cursors[run.id], name, modes, every, x, alert_after, settings.stale_after_s,
                      settings.max_page_size)
            for run in runs
            if run.id in cursors
        ]  # fmt: skip
        return to_json({"runs": out, "added": added})

    def attempt(last: bool) -> tuple[bytes | None, list[int]]:
        """One trip to a worker thread: the runs read, and the answer if there is news (or ``last``)."""
        if group_id is None and not last:  # has any run moved? one small read (a page asks about as often)
            heads = store.run_heads(list(cursors))
            if all(rid in heads and not c.moved(*heads[rid]) for rid, c in cursors.items()):
                return None, list(cursors)
        runs = read_runs()  # a run not found: 404
        added = [r.id for r in runs if r.id not in cursors]
        if last or added or any(cursors[r.id].moved(r.last_step, r.status) for r in runs if r.id in cursors):
            return build(runs, added), []
        return None, [r.id for r in runs]

    deadline = time.monotonic() + wait
    woken = True  # the page has just asked: it is there
    while True:
        body, ids = await anyio.to_thread.run_sync(attempt, time.monotonic() >= deadline)
        if body is not None:
            return Response(body, media_type="application/json")
        # a page that went away is not waited for: asked after a wait without news (the question costs
        # about as much as the read; with news every step it would be asked for every answer)
        if not woken and await request.is_disconnected():
            return Response(status_code=204)  # nobody reads it
        # woken by a batch of one of these runs stored here, else read again after FALLBACK_S (other
        # replicas, status changes); nothing is read while neither happens
        woken = await news.wait_any(ids, max(0.0, min(deadline - time.monotonic(), FALLBACK_S)))
