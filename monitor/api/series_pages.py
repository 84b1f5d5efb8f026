"""Pages of ``GET /runs/{id}/series_index``, serialized once per state of the run and shared.

A flooded run's page of 5,000 series costs ~0.1 s to read and encode; thirty readers asking for it
at once each paid that, and a one-point write beside them waited 10x its usual time (issue 37). A
page is the same bytes until the run's next batch moves ``last_point_at`` (every stored point does:
the same key as ``read.reader``'s index cache), so it is kept as encoded JSON, keyed by that state,
and computed once while concurrent readers of the same page wait for it (one lock per key). The
cache is bounded by its bytes (:data:`MAX_BYTES`), oldest out first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from pydantic import TypeAdapter

from hyperwatch.monitor.api.query_schemas import SeriesInfoOut
from hyperwatch.monitor.store.base import Store
from hyperwatch.monitor.store.entities import SeriesInfo

MAX_BYTES = 64 * 1024 * 1024
_ENCODE = TypeAdapter(list[SeriesInfoOut])

Page = tuple[bytes, SeriesInfo | None]
"""The encoded series, and the last one when a next page exists (its cursor)."""


class SeriesPages:
    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self._pages: OrderedDict[tuple[Any, ...], Page] = OrderedDict()
        self._bytes, self._max = 0, max_bytes
        self._lock = threading.Lock()
        self._computing: dict[tuple[Any, ...], threading.Lock] = {}

    def get(self, store: Store, run_id: int, limit: int, after: tuple[str, int | None] | None) -> Page:
        run = store.get_run(run_id)  # one primary-key read: the run's state, or a 404
        key = (id(store), run_id, run.last_point_at, run.updated_at, limit, after)
        with self._lock:
            found = self._hit(key)
            if found is not None:
                return found
            gate = self._computing.setdefault(key, threading.Lock())
        with gate:  # the readers of one page: one computes it, the others take its answer
            with self._lock:
                found = self._hit(key)
            if found is not None:
                return found
            try:
                page = _compute(lambda: store.list_series(run_id, limit + 1, after), limit)
            finally:
                with self._lock:
                    self._computing.pop(key, None)
            with self._lock:
                self._pages[key] = page
                self._bytes += len(page[0])
                while self._bytes > self._max and len(self._pages) > 1:
                    _k, (dropped, _last) = self._pages.popitem(last=False)
                    self._bytes -= len(dropped)
            return page

    def _hit(self, key: tuple[Any, ...]) -> Page | None:
        found = self._pages.get(key)
        if found is not None:
            self._pages.move_to_end(key)
        return found


def _compute(read: Callable[[], list[SeriesInfo]], limit: int) -> Page:
    found = read()  # one more than the page: is there a next one?
    page = found[:limit]
    return _ENCODE.dump_json([SeriesInfoOut.model_validate(s) for s in page]), (
        page[-1] if len(found) > limit else None
    )


pages = SeriesPages()
