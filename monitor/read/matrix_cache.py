"""Layer x step matrices (``store.layer_matrix``) memoised on the run's state, for the pages' reads.

A run page draws each per-layer indicator three ways from one matrix: the mean and the max over
layers (:func:`monitor.read.lines.aggregate_series`) and the heatmap
(:func:`monitor.read.lines.layer_matrix`). On a 64-layer run one matrix read costs the store about
0.1 s (64 layers' chunks decoded and bucketed), so the page's 7 per-layer indicators read 21
matrices per open, every open (issue 35: 1.9 s warm). Here a matrix is read once per run state.

The key is the run's state as the request read it (id, ``last_point_at``, ``updated_at``,
``last_step``), as :class:`monitor.read.reader._IndexCache` keys the series index: every point
written moves ``last_point_at``, so a hit is the answer the store would give for that state, and
a request that read the run before a batch committed can at worst be given the matrix it would
have read itself. Bounded by entries and by the cells held in all (a 64-layer matrix of 600
buckets is 38,400 cells, about 1.2 MB as Python floats).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from hyperwatch.monitor.store.base import Store
from hyperwatch.monitor.store.entities import LayerMatrix, Run


def _cells(m: LayerMatrix) -> int:
    return max(1, len(m.layers) * len(m.bucket_starts))


class MatrixCache:
    """An LRU of :class:`LayerMatrix` keyed on (store, run state, name, buckets, start, end).

    The matrices handed out are shared: callers read them and never change them (the read layer
    builds new lists from them)."""

    def __init__(self, size: int = 256, max_cells: int = 1_500_000) -> None:
        self.size = size
        self.max_cells = max_cells
        self.held = 0
        self.items: OrderedDict[tuple[Any, ...], LayerMatrix] = OrderedDict()
        self.lock = threading.Lock()
        self.reads = 0  # store reads made (a miss each): tests and benches watch it

    def get(self, store: Store, run: Run, name: str, buckets: int, start: int | None, end: int | None) -> LayerMatrix:
        key = (id(store), run.id, run.last_point_at, run.updated_at, run.last_step, name, buckets, start, end)
        with self.lock:
            found = self.items.get(key)
            if found is not None:
                self.items.move_to_end(key)
                return found
        m = store.layer_matrix(run.id, name, buckets, start, end)
        with self.lock:
            self.reads += 1
            old = self.items.pop(key, None)
            self.held += _cells(m) - (0 if old is None else _cells(old))
            self.items[key] = m
            while len(self.items) > self.size or (self.held > self.max_cells and len(self.items) > 1):
                _key, dropped = self.items.popitem(last=False)
                self.held -= _cells(dropped)
        return m

    def clear(self) -> None:
        with self.lock:
            self.items.clear()
            self.held = 0


matrices = MatrixCache()


def cached_matrix(
    store: Store, run: Run, name: str, buckets: int, start: int | None = None, end: int | None = None
) -> LayerMatrix:
    """``store.layer_matrix(run.id, name, buckets, start, end)`` for the run's state in ``run``."""
    return matrices.get(store, run, name, buckets, start, end)
