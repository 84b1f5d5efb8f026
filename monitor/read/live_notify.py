"""In-process news of ingested points, so a waiting live request wakes when its runs move.

The points route calls :func:`bump` after a batch is committed; a live long poll (``GET
/api/v1/live``) waits in :func:`wait_any` on the runs it draws. Nothing heavier than setting an
event is done on the ingest path: no read, no computation, and nothing at all for a run no page
waits on.

This only knows the batches ingested by *this* process. Another replica writing the same
database, or a status change made elsewhere, is seen by the waiting request's fallback poll,
which re-reads its runs every :data:`FALLBACK_S` seconds (see ``monitor/api/routes/live.py``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable

FALLBACK_S = 1.5
"""How often a waiting live request reads its runs without news from this process: the delay
before it sees points written by another replica or a status set by another route."""


class LiveNews:
    """Per-run counters of ingested batches and the events of the requests waiting on them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count: dict[int, int] = {}
        self._alerts: dict[int, int] = {}
        self._waiters: dict[int, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}

    def count(self, run_id: int) -> int:
        """How many batches of ``run_id`` this process has announced (0 if none)."""
        return self._count.get(run_id, 0)

    def alerts(self, run_id: int) -> int:
        """How many alert events of ``run_id``'s batches this process has announced (0 if none)."""
        return self._alerts.get(run_id, 0)

    def bump(self, run_id: int, alerts: int = 0) -> None:
        """A batch of ``run_id`` that raised ``alerts`` alert events is committed: wake the requests
        waiting on it (from any thread)."""
        with self._lock:
            self._count[run_id] = self._count.get(run_id, 0) + 1
            if alerts:
                self._alerts[run_id] = self._alerts.get(run_id, 0) + alerts
            waiting = list(self._waiters.get(run_id, ()))
        if not waiting:
            return
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        for loop, event in waiting:
            if loop is here:
                event.set()
            elif not loop.is_closed():
                loop.call_soon_threadsafe(event.set)

    async def wait_any(self, run_ids: Iterable[int], timeout: float) -> bool:
        """Wait until a batch of one of ``run_ids`` is announced, or ``timeout`` seconds;
        True if news came."""
        ids = set(run_ids)
        entry = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            for rid in ids:
                self._waiters.setdefault(rid, set()).add(entry)
        try:
            await asyncio.wait_for(entry[1].wait(), timeout)
            return True
        except TimeoutError:
            return False
        finally:
            with self._lock:
                for rid in ids:
                    found = self._waiters.get(rid)
                    if found is not None:
                        found.discard(entry)
                        if not found:
                            del self._waiters[rid]


news = LiveNews()
"""The process's news (one service process, one event loop: see the module's docstring)."""
