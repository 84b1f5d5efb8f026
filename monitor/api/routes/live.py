"""The live news of an open page: only points after the last drawn one travel, as a long poll on
per-run cursors (``GET /api/v1/live``) or as a stream of server-sent events that moves the cursors on
itself (``GET /api/v1/live/stream``: what the pages use, one request for many answers)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse

from hyperwatch.hooks.schema import MAX_STEP
from hyperwatch.monitor.api.deps import ReaderDep
from hyperwatch.monitor.api.params import (
    MAX_INT64,
    MAX_ROW_ID,
    ParameterError,
    float_query,
    int_query,
    parse_int,
    parse_line,
)
from hyperwatch.monitor.api.schemas import MetricName, XAxis
from hyperwatch.monitor.core.errors import InvalidInputError
from hyperwatch.monitor.read.live import LINE_MODES, Cursor
from hyperwatch.monitor.read.live_fanout import Watch, check_runs
from hyperwatch.monitor.read.live_fanout import events as _events
from hyperwatch.monitor.read.live_fanout import next_answer as _next
from hyperwatch.monitor.read.live_notify import FALLBACK_S

router = APIRouter(tags=["query"])  # ReaderDep checks read auth

ANSWER = f"""each run's state and, for runs that moved, the part of each `name` after the cursor, read by the
same rules as the first read: per-layer indicators aggregated over layers (`line=mean`, `line=max`)
per bucket of `every` steps (each layer's max per bucket, so spikes survive), `line=heat` the
heatmap's new columns, `line=<n>` layer n; a run-level metric answers under `run`. Alerts with an
id above `alert_after` come with their run. Non-finite values are the strings "NaN", "Infinity",
"-Infinity". Nothing is computed on the ingest path (it only sets the waiting requests' events): a
run that moves costs one small read of the page's runs, and so does every {FALLBACK_S} s without news
(points written by another replica, a status set elsewhere); one new step is answered from the
values the store kept of the batches this service stored (a read of the latest values when another
replica stored it)."""

LIVE_DOC = f"""New points of some runs since a page drew them: a long poll on a cursor.

Give one `cursor=<run_id>:<last step drawn>[:<status>]` per run drawn (`-1` before any point), or
`group_id` for every run of a group (runs of the group without a cursor are listed in `added`:
read them whole first). The request waits up to `wait` seconds until a run has points after its
cursor (or a status other than the one given): it wakes when this service stores a batch of one
of its runs, and reads its runs every {FALLBACK_S} s besides; then it answers {ANSWER}
Send the returned `cursor` of each run next time."""

STREAM_DOC = f"""The answers of `GET /api/v1/live` as server-sent events (`text/event-stream`, one `data:` line of
JSON per answer), on one request: after each answer the stream itself moves each run's cursor to the
returned one (and its status, and `alert_after` to the largest alert id sent), waits at least `gap`
seconds (the news of the gap gather into the next answer), then sends the next answer as soon as a
run moves. The stream ends after `wait` seconds, with a last answer, or after an answer that lists
`added` runs (read them whole first); ask again with the cursors drawn. Each answer is {ANSWER}"""


def parse_cursor(text: str) -> Cursor:
    """``"<run_id>:<last step drawn>[:<status>]"`` read by the strict rule (:mod:`monitor.api.params`):
    ASCII digits, the step from -1 (nothing drawn) to the largest step, the id in the id range."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise InvalidInputError(
            f"cursor: {text[:80]!r} is not '<run_id>:<last step drawn>[:<status>]' (e.g. '12:480:running')"
        )
    try:
        run_id = parse_int(parts[0], "run id", 0, MAX_ROW_ID)
        step = parse_int(parts[1], "step", -1, MAX_STEP)
    except ParameterError as exc:
        raise ParameterError(f"cursor {text[:80]!r}: {exc} ('<run_id>:<last step drawn>[:<status>]')") from None
    return Cursor(run_id, step, parts[2] if len(parts) == 3 and parts[2] else None)


def _parse(cursors: list[str]) -> dict[int, Cursor]:
    parsed = [parse_cursor(c) for c in cursors]
    return {c.run_id: c for c in parsed}


async def watch(
    read: ReaderDep,
    name: Annotated[list[MetricName], Query(description="indicator; repeat for each")],
    cursor: Annotated[list[str] | None, Query(description="<run_id>:<last step drawn>[:<status>]; repeat")] = None,
    group_id: Annotated[int | None, Query(description="every run of this group")] = None,
    line: Annotated[list[str] | None, Query(description="mean, max, heat or a layer number; repeat")] = None,
    every: Annotated[int, int_query("every", 1, MAX_STEP, "bucket width in steps (the first read's)")] = 1,
    x: Annotated[XAxis, Query(description="step, tokens, flops or fraction")] = "step",
    alert_after: Annotated[int, int_query("alert_after", 0, MAX_INT64, "the largest alert id drawn")] = 0,
) -> Watch:
    """The query both live routes take, every part checked here (before a stream starts); the line
    choices go on as canonical text (``"7"``), so the read layer parses nothing."""
    cursors = _parse(cursor or [])
    modes = list(dict.fromkeys(parse_line(m, "line", LINE_MODES) for m in line or ["mean", "max"]))
    if not cursors and group_id is None:
        raise InvalidInputError("cursor: give one cursor=<run_id>:<step> per run drawn, or group_id")
    if len(cursors) > read.settings.max_compare_runs:
        raise InvalidInputError(f"cursor: {len(cursors)} runs; the limit is {read.settings.max_compare_runs}")
    return Watch(read, cursors, group_id, list(name), modes, every, x, alert_after)


WatchDep = Annotated[Watch, Depends(watch)]


@router.get(
    "/live",
    summary="New points since a page's cursor (long poll)",
    description=LIVE_DOC,
    response_class=Response,
    responses={200: {"content": {"application/json": {}}, "description": "each run's state and new points"}},
)
async def live(
    request: Request,
    page: WatchDep,
    wait: Annotated[float, float_query("wait", 0, 30, "seconds to wait for news")] = 10.0,
) -> Response:
    got = await _next(page, time.monotonic() + wait, False, request.is_disconnected)
    if got is None:
        return Response(status_code=204)  # nobody reads it
    return Response(got[0][1], media_type="application/json")


@router.get(
    "/live/stream",
    summary="New points as they are stored (server-sent events)",
    description=STREAM_DOC,
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "one event per answer"}},
)
async def live_stream(
    page: WatchDep,
    wait: Annotated[float, float_query("wait", 0, 30, "seconds the stream lasts")] = 10.0,
    gap: Annotated[float, float_query("gap", 0, 10, "seconds at least between two answers")] = 0.5,
) -> StreamingResponse:
    # Every run watched is read once before the stream starts: an unknown run or group is a 404
    # here, not a stream cut after its 200 (the query itself was checked by ``watch``).
    await check_runs(page)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # a proxy must not hold events back
    return StreamingResponse(_events(page, wait, gap), media_type="text/event-stream", headers=headers)
