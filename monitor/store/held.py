"""SQLite: each running run's hot rows held in the service's memory, as of an ingest token (issue 36).

A one-step batch that seals its chunks (every 16th step of training's pattern) takes every sealed
series' hot rows out of ``metric_points``: 7,680 rows for 512 series, read back and turned into
columns in ~7 ms of the seal (``bench/storage.py``'s workload, the store alone, cProfile; the seal
took 32 ms before, 16 ms with the rows held and their steps deleted in one statement). The rows were
this process's own writes, so it keeps them: per run, the points of every hot row, as of the ingest
token the batch that left them committed. The token is the proof, as for :class:`ingest.LatestSteps`
(whose reasoning this follows): every writer of a run's points takes the run's row first and swaps
its token in the same transaction, so a row that still holds the token holds the hot rows this
process recorded with it; any other writer (another process, a late or re-sent step, which takes
the general path and records nothing here) leaves another token, and the next seal reads the rows
from the database (a miss, never a wrong answer).

Held only on SQLite's appended-steps path (:func:`points.write_points`); PostgreSQL's new steps wait
as pending arrays that are already columns (:mod:`.pending`). A miss is filled at the run's next seal,
which then reads all of the run's hot rows (about what it reads anyway: every series of a one-step
batch seals at once). Memory is bounded: at most ``MAX_HELD_POINTS`` points in all (40 bytes each),
least recently written runs first out; a run holding more than a quarter of that is not held.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from hyperwatch.monitor.store.seal import Columns

MAX_HELD_POINTS = 2_000_000
"""~80 MB: 15 hot steps of ~130,000 series."""
MAX_PARTS = 32


class HeldPoints:
    """Per run: its hot rows as columns (in parts, not sorted), as of an ingest token. Thread-safe."""

    def __init__(self, max_points: int = MAX_HELD_POINTS) -> None:
        self._runs: OrderedDict[int, tuple[int, tuple[Columns, ...], int]] = OrderedDict()
        self._lock = threading.Lock()
        self._max = max_points
        self._points = 0  # held, all runs together
        self.hits = self.misses = 0  # for the tests and the benchmark

    def get(self, run_id: int, token: int) -> tuple[Columns, ...] | None:
        """The run's hot rows as of ``token``, or None when they are not held as of it."""
        with self._lock:
            found = self._runs.get(run_id)
            if found is None or found[0] != token:
                self.misses += 1
                return None
            self.hits += 1
            self._runs.move_to_end(run_id)
            return found[1]

    def put(self, run_id: int, token: int, parts: Sequence[Columns] | None) -> None:
        """After a commit: the run's hot rows as of ``token`` (None: not known, forget the run)."""
        with self._lock:
            self._drop(run_id)
            n = 0 if parts is None else sum(len(p) for p in parts)
            if parts is None or n > self._max // 4:
                return
            kept = tuple(p for p in parts if len(p))
            if len(kept) > MAX_PARTS:  # a run whose batches seal nothing for long: one part again
                kept = (Columns.concat(kept),)
            self._runs[run_id] = (token, kept, n)
            self._points += n
            while self._points > self._max:
                _rid, (_t, _parts, dropped) = self._runs.popitem(last=False)
                self._points -= dropped

    def forget(self, run_id: int) -> None:
        with self._lock:
            self._drop(run_id)

    def _drop(self, run_id: int) -> None:
        old = self._runs.pop(run_id, None)
        if old is not None:
            self._points -= old[2]

    @property
    def points(self) -> int:
        return self._points
