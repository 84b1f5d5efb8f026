"""The live news of an open page: only points after the last drawn one travel, as a long poll on
per-run cursors (``GET /api/v1/live``) or as a stream of server-sent events that moves the cursors on
itself (``GET /api/v1/live/stream``: what the pages use, one request for many answers)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import StreamingResponse

from hyperwatch.monitor.core.errors import InvalidInputError
from hyperwatch.monitor.live_notify import FALLBACK_S, news
from hyperwatch.monitor.schemas import MetricName, XAxis
from hyperwatch.monitor.store.entities import Run
from hyperwatch.monitor.views import MAX_GROUP_RUNS
from hyperwatch.monitor.views_live import LINE_MODES, Cursor, run_delta, to_json
from hyperwatch.monitor.views_read import Reader, ReaderDep

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


def _parse(cursors: list[str]) -> dict[int, Cursor]:
    try:
        parsed = [Cursor.parse(c) for c in cursors]
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from exc
    return {c.run_id: c for c in parsed}


@dataclass
class Watch:
    """What a page watches: its runs' cursors (or every run of a group), the names and lines it draws,
    the bucket width, the x axis and the largest alert id drawn. Its methods run in a worker thread."""

    read: Reader
    cursors: dict[int, Cursor]
    group_id: int | None
    names: list[str]
    modes: list[str]
    every: int
    x: XAxis
    alert_after: int

    def runs(self) -> list[Run]:
        if self.group_id is not None:
            return self.read.group(self.group_id)[1][:MAX_GROUP_RUNS]
        return [self.read.run(rid) for rid in self.cursors]  # a run not found: 404

    def attempt(self, last: bool, woken: bool) -> tuple[tuple[dict[str, Any], bytes] | None, list[int]]:
        """The answer (as a dict and as JSON) if a run moved (or ``last``), else None; and the runs to
        wait on. Unless a batch of its runs was just stored here (``woken``), whether any moved is one
        small read."""
        store, settings = self.read.store, self.read.settings
        if self.group_id is None and not last and not woken:
            heads = store.run_heads(list(self.cursors))
            if all(rid in heads and not c.moved(*heads[rid]) for rid, c in self.cursors.items()):
                return None, list(self.cursors)
        runs = self.runs()
        added = [r.id for r in runs if r.id not in self.cursors]
        moved = [r for r in runs if r.id in self.cursors and self.cursors[r.id].moved(r.last_step, r.status)]
        if not (last or added or moved):
            return None, [r.id for r in runs]
        answer = {"runs": [
            run_delta(store, run, self.cursors[run.id], self.names, self.modes, self.every, self.x, self.alert_after,
                      settings.stale_after_s, settings.max_page_size)
            for run in runs
            if run.id in self.cursors
        ], "added": added}  # fmt: skip
        return (answer, to_json(answer)), []

    def advance(self, answer: dict[str, Any]) -> None:
        """Cursors as a page that drew ``answer`` sends them next."""
        for state in answer["runs"]:
            self.cursors[state["id"]] = Cursor(state["id"], state["cursor"], state["status"])
            self.alert_after = max([self.alert_after, *(a["id"] for a in state["alerts"])])


async def watch(
    read: ReaderDep,
    name: Annotated[list[MetricName], Query(description="indicator; repeat for each")],
    cursor: Annotated[list[str] | None, Query(description="<run_id>:<last step drawn>[:<status>]; repeat")] = None,
    group_id: Annotated[int | None, Query(description="every run of this group")] = None,
    line: Annotated[list[str] | None, Query(description="mean, max, heat or a layer number; repeat")] = None,
    every: Annotated[int, Query(ge=1, description="bucket width in steps (the first read's)")] = 1,
    x: Annotated[XAxis, Query(description="step, tokens, flops or fraction")] = "step",
    alert_after: Annotated[int, Query(ge=0, description="the largest alert id drawn")] = 0,
) -> Watch:
    """The query both live routes take, checked."""
    cursors = _parse(cursor or [])
    modes = line or ["mean", "max"]
    bad = [m for m in modes if m not in LINE_MODES and not m.isdigit()]
    if bad:
        raise InvalidInputError(f"line: {bad[0]!r} is not one of {', '.join(LINE_MODES)} or a layer number")
    if not cursors and group_id is None:
        raise InvalidInputError("cursor: give one cursor=<run_id>:<step> per run drawn, or group_id")
    if len(cursors) > read.settings.max_compare_runs:
        raise InvalidInputError(f"cursor: {len(cursors)} runs; the limit is {read.settings.max_compare_runs}")
    return Watch(read, cursors, group_id, list(name), modes, every, x, alert_after)


WatchDep = Annotated[Watch, Depends(watch)]


def _pause(deadline: float) -> float:
    """How long to wait for news: until the deadline, at most FALLBACK_S (then the runs are read again:
    other replicas, status changes)."""
    return max(0.0, min(deadline - time.monotonic(), FALLBACK_S))


async def _next(
    page: Watch, deadline: float, woken: bool, gone: Callable[[], Awaitable[bool]] | None = None
) -> tuple[tuple[dict[str, Any], bytes], bool] | None:
    """The page's next answer and whether it is the last (the deadline passed); waits on the news of
    batches stored here, else reads again every FALLBACK_S; nothing is read while neither happens.
    None when ``gone()`` says nobody reads it any more: asked after a wait without news, not when a
    batch was just stored (the question costs about as much as the read)."""
    started = time.monotonic()
    while True:
        last = time.monotonic() >= deadline
        found, ids = await anyio.to_thread.run_sync(page.attempt, last, woken)
        if found is not None:
            return found, last
        if gone is not None and not woken and time.monotonic() - started >= FALLBACK_S and await gone():
            return None
        woken = await news.wait_any(ids, _pause(deadline))


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
    wait: Annotated[float, Query(ge=0, le=30, description="seconds to wait for news")] = 10.0,
) -> Response:
    got = await _next(page, time.monotonic() + wait, False, request.is_disconnected)
    if got is None:
        return Response(status_code=204)  # nobody reads it
    return Response(got[0][1], media_type="application/json")


async def _events(page: Watch, wait: float, gap: float) -> AsyncIterator[bytes]:
    """The stream's answers; a page that goes away cancels it (Starlette listens for the disconnect)."""
    deadline, woken = time.monotonic() + wait, False
    while True:
        got = await _next(page, deadline, woken)
        assert got is not None  # without gone(), _next always answers
        (answer, body), last = got
        yield b"data: " + body + b"\n\n"
        if last or answer["added"]:
            return
        page.advance(answer)
        counts = {rid: news.count(rid) for rid in page.cursors}
        await anyio.sleep(gap)
        # a batch stored here during the gap: answer now; else wait for one (the cursors are current)
        woken = any(news.count(rid) != n for rid, n in counts.items())
        if not woken:
            woken = await news.wait_any(page.cursors, _pause(deadline))


@router.get(
    "/live/stream",
    summary="New points as they are stored (server-sent events)",
    description=STREAM_DOC,
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "one event per answer"}},
)
async def live_stream(
    page: WatchDep,
    wait: Annotated[float, Query(ge=0, le=30, description="seconds the stream lasts")] = 10.0,
    gap: Annotated[float, Query(ge=0, le=10, description="seconds at least between two answers")] = 0.5,
) -> StreamingResponse:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # a proxy must not hold events back
    return StreamingResponse(_events(page, wait, gap), media_type="text/event-stream", headers=headers)
