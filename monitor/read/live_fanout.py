"""Live news fanned out once: one read per run per change, shared by every page watching it.

A live request (``GET /api/v1/live`` and its stream) waits on :mod:`monitor.read.live_notify` as before;
what changed is what it does when it wakes. It used to read its runs, and build its answer, in the
request thread pool, once per watcher: 300 streams on one run made every write queue 300 reads in
front of the writers' own database work (issue 37). Now:

- **the run's state** (``Reader.run``, or ``Reader.group`` for a group page) is a :class:`_Snapshot`
  shared by every watcher of the run on this event loop: a watcher reuses the newest one when it
  started after the last batch this process announced for the run (``news.count``) and at most
  :data:`FALLBACK_S` s ago (other replicas, status changes), else starts the one new read the others
  then share;
- **a run's part of the answer** (:func:`monitor.read.live.run_delta`, as JSON) is computed once per
  snapshot and per question (cursor, names, lines, bucket width, x axis, alert_after): watchers that
  keep up ask the same question and share it; one that asks another gets its own;
- both run in :func:`live_pool`, a few threads of their own (``HYPERWATCH_LIVE_READ_THREADS``), never
  in the thread pool the writers and the other reads use; the event loop only hands bytes out.

So N watchers of one run cost one read per change and the writers nothing that grows with N. The
answer's bytes are the same as one watcher alone would get: ``{"runs": [...], "added": [...]}`` with
each run's state as :func:`monitor.read.live.run_delta` builds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import anyio

from hyperwatch.monitor.read import live_notify
from hyperwatch.monitor.read.lines import MAX_GROUP_RUNS, XAxis
from hyperwatch.monitor.read.live import Cursor, run_delta, to_json
from hyperwatch.monitor.read.live_notify import news
from hyperwatch.monitor.read.reader import Reader
from hyperwatch.monitor.store.base import Store
from hyperwatch.monitor.store.entities import Run

Answer = tuple[dict[str, Any], bytes]
"""A live answer as a dict (the stream moves its cursors from it) and as the JSON sent."""

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def live_pool(threads: int) -> ThreadPoolExecutor:
    """The live reads' own threads (created on first use with ``threads`` workers; one per process)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="hyperwatch-live")
        return _pool


@dataclass
class Watch:
    """What a page watches: its runs' cursors (or every run of a group), the names and lines it draws,
    the bucket width, the x axis and the largest alert id drawn."""

    read: Reader
    cursors: dict[int, Cursor]
    group_id: int | None
    names: list[str]
    modes: list[str]
    every: int
    x: XAxis
    alert_after: int

    def runs(self) -> list[Run]:
        """The runs watched, read now (a run not found: 404); the stream's check before it starts."""
        if self.group_id is not None:
            return self.read.group(self.group_id)[1][:MAX_GROUP_RUNS]
        return [self.read.run(rid) for rid in self.cursors]

    def question(self, cursor: Cursor) -> Hashable:
        """What decides a run's part of the answer besides the run itself: watchers asking the same
        share one computation."""
        s = self.read.settings
        return (cursor, tuple(self.names), tuple(self.modes), self.every, self.x, self.alert_after,
                s.stale_after_s, s.max_page_size)  # fmt: skip

    def advance(self, answer: dict[str, Any]) -> None:
        """Cursors as a page that drew ``answer`` sends them next."""
        for state in answer["runs"]:
            self.cursors[state["id"]] = Cursor(state["id"], state["cursor"], state["status"])
            self.alert_after = max([self.alert_after, *(a["id"] for a in state["alerts"])])


@dataclass
class _Snapshot:
    """One read of a run (or a group's runs), started when this process had announced ``news``
    batches of them, at ``started``; and the runs' parts of answers computed from it."""

    news: int
    started: float
    runs: asyncio.Future[list[Run]]
    parts: dict[tuple[int, Hashable], asyncio.Future[tuple[dict[str, Any], bytes]]] = field(default_factory=dict)


class Fanout:
    """The snapshots of the runs watched on one event loop from one store (see the module doc)."""

    def __init__(self, store: Store, threads: int) -> None:
        self.store = store
        self.threads = threads
        self.snapshots: dict[Hashable, _Snapshot] = {}
        self.watchers: dict[Hashable, int] = {}
        self.reads = 0  # snapshots read (tests and benchmarks count them)

    @contextlib.contextmanager
    def watching(self, keys: Sequence[Hashable]) -> Iterator[None]:
        """Keep the snapshots of ``keys`` while the block runs; the last watcher out drops them."""
        for k in keys:
            self.watchers[k] = self.watchers.get(k, 0) + 1
        try:
            yield
        finally:
            for k in keys:
                left = self.watchers.get(k, 0) - 1
                if left > 0:
                    self.watchers[k] = left
                else:
                    self.watchers.pop(k, None)
                    self.snapshots.pop(k, None)

    def _run_in_pool(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        return asyncio.get_running_loop().run_in_executor(live_pool(self.threads), fn)

    def snapshot(self, key: Hashable, news_ids: Sequence[int], read: Callable[[], list[Run]]) -> _Snapshot:
        """The newest snapshot of ``key`` if it started after the last news of ``news_ids`` and within
        :data:`FALLBACK_S` s, else a new read of ``read()`` (in the live threads)."""
        count, now = sum(news.count(rid) for rid in news_ids), time.monotonic()
        snap = self.snapshots.get(key)
        if snap is not None and snap.news >= count and snap.started >= now - live_notify.FALLBACK_S:
            return snap
        self.reads += 1
        snap = _Snapshot(count, now, self._run_in_pool(read))
        if key in self.watchers:  # kept only while watched (a request that raised may have left)
            self.snapshots[key] = snap
        return snap

    async def part(self, snap: _Snapshot, run: Run, page: Watch) -> tuple[dict[str, Any], bytes]:
        """``run``'s state in ``page``'s answer and its JSON, computed once per snapshot and question."""
        cursor = page.cursors[run.id]
        if run.last_step is None or run.last_step <= cursor.step:  # no new point: nothing is read
            state = _delta(page, run, cursor)
            return state, to_json(state)
        key = (run.id, page.question(cursor))
        found = snap.parts.get(key)
        if found is None:
            found = snap.parts[key] = self._run_in_pool(lambda: _encoded(_delta(page, run, cursor)))
        got: tuple[dict[str, Any], bytes] = await shared(found)
        return got


def _delta(page: Watch, run: Run, cursor: Cursor) -> dict[str, Any]:
    s = page.read.settings
    return run_delta(page.read.store, run, cursor, page.names, page.modes, page.every, page.x,
                     page.alert_after, s.stale_after_s, s.max_page_size)  # fmt: skip


def _encoded(state: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    return state, to_json(state)


_fanouts: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, Fanout]] = weakref.WeakKeyDictionary()


def fanout_for(store: Store, threads: int) -> Fanout:
    """This event loop's :class:`Fanout` of ``store`` (a test client may run one loop per request)."""
    per_loop = _fanouts.setdefault(asyncio.get_running_loop(), {})
    found = per_loop.get(id(store))
    if found is None or found.store is not store:
        found = per_loop[id(store)] = Fanout(store, threads)
    return found


def _keys(page: Watch) -> list[Hashable]:
    return [("group", page.group_id)] if page.group_id is not None else [("run", rid) for rid in page.cursors]


async def _runs(fan: Fanout, page: Watch) -> list[tuple[Run, _Snapshot]]:
    """The page's runs, each with the shared snapshot it was read in (a run not found raises, as
    ``Reader.run`` does)."""
    if page.group_id is not None:
        gid, key = page.group_id, ("group", page.group_id)
        known = fan.snapshots.get(key)
        ids = [r.id for r in known.runs.result()] if known is not None and _ok(known.runs) else []
        snap = fan.snapshot(key, ids, lambda: page.read.group(gid)[1][:MAX_GROUP_RUNS])
        return [(run, snap) for run in await shared(snap.runs)]
    snaps = [fan.snapshot(("run", rid), [rid], _one_run(page.read, rid)) for rid in page.cursors]
    return [(run, snap) for snap in snaps for run in await shared(snap.runs)]


async def shared(fut: asyncio.Future[Any]) -> Any:
    """The result of a future many watchers share: at once when it is done (the watchers that wake
    after the one read finished), else awaited through :func:`asyncio.shield`, so a watcher that goes
    away never cancels the others' read."""
    if fut.done():
        return fut.result()
    return await asyncio.shield(fut)


def _one_run(read: Reader, run_id: int) -> Callable[[], list[Run]]:
    return lambda: [read.run(run_id)]


def _ok(fut: asyncio.Future[Any]) -> bool:
    return fut.done() and not fut.cancelled() and fut.exception() is None


async def _attempt(fan: Fanout, page: Watch, last: bool) -> tuple[Answer | None, list[int]]:
    """The answer if a run moved (or ``last``), else None; and the runs to wait on."""
    found = await _runs(fan, page)
    runs = [run for run, _snap in found]
    added = [r.id for r in runs if r.id not in page.cursors]
    moved = [r for r in runs if r.id in page.cursors and page.cursors[r.id].moved(r.last_step, r.status)]
    if not (last or added or moved):
        return None, [r.id for r in runs]
    parts = [await fan.part(snap, run, page) for run, snap in found if run.id in page.cursors]
    answer = {"runs": [state for state, _ in parts], "added": added}
    body = b'{"runs":[' + b",".join(raw for _, raw in parts) + b'],"added":' + _compact(added) + b"}"
    return (answer, body), []


def _compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _pause(deadline: float) -> float:
    """How long to wait for news: until the deadline, at most FALLBACK_S (then the runs are read again:
    other replicas, status changes; the read is shared, see :meth:`Fanout.snapshot`)."""
    return max(0.0, min(deadline - time.monotonic(), live_notify.FALLBACK_S))


async def next_answer(
    page: Watch, deadline: float, woken: bool, gone: Callable[[], Awaitable[bool]] | None = None
) -> tuple[Answer, bool] | None:
    """The page's next answer and whether it is the last (the deadline passed); waits on the news of
    batches stored here, else looks again every FALLBACK_S. None when ``gone()`` says nobody reads it
    any more: asked after a wait without news, not when a batch was just stored."""
    fan = fanout_for(page.read.store, page.read.settings.live_read_threads)
    started = time.monotonic()
    with fan.watching(_keys(page)):
        while True:
            last = time.monotonic() >= deadline
            found, ids = await _attempt(fan, page, last)
            if found is not None:
                return found, last
            if gone is not None and not woken and time.monotonic() - started >= live_notify.FALLBACK_S and await gone():
                return None
            woken = await news.wait_any(ids, _pause(deadline))


async def events(page: Watch, wait: float, gap: float) -> AsyncIterator[bytes]:
    """The stream's answers as server-sent events; a page that goes away cancels it (Starlette
    listens for the disconnect)."""
    deadline, woken = time.monotonic() + wait, False
    while True:
        got = await next_answer(page, deadline, woken)
        assert got is not None  # without gone(), next_answer always answers
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


async def check_runs(page: Watch) -> None:
    """Read the page's runs before its stream starts (a run or group not found raises: a 404, not a
    stream cut after its 200), through the shared snapshots: 1,000 pages opening on one run read it
    about once, in the live threads."""
    fan = fanout_for(page.read.store, page.read.settings.live_read_threads)
    with fan.watching(_keys(page)):
        await _runs(fan, page)
