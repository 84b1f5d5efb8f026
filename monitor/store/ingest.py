"""One batch, one transaction: the run's row first, then the points (see :mod:`monitor.store.points`).

The statements, in order:

1. ``UPDATE runs .. RETURNING``: finds the run (by id, or by project and name: one statement
   instead of a read transaction of its own), **locks its row** to commit, records the run's
   progress (``last_step``, ``last_point_at``) and swaps its ``ingest_token`` for a new random one
   (migration 0006), returning the old; it also returns the run's group threshold settings for the
   detectors (overrides, learning setting and what was learned: ``entities.GroupThresholds``).
2. The batch id (:func:`points.claim_batch`; on PostgreSQL part of statement 1, a ``WITH`` that
   reads the locked row; the hooks' sequence ids, :func:`claims.claim_range`, in a statement after
   it on both databases: a claim that joins ranges must read what the writer before committed); a
   duplicate rolls the whole transaction back, so a re-sent batch changes nothing, not even the run's
   progress.
3. The points and everything they imply (:func:`points.write_points`), then the detectors' alerts.

Why the run's row is the lock: every writer of a run takes it first, so the writers of one run run
one after the other from their first statement on (on SQLite every writer already does: BEGIN
IMMEDIATE), and each sees all the points, chunks and rollups of the one before (READ COMMITTED reads
after the lock; see :mod:`monitor.store.rollups`). Two writers of one run never ran side by side
before either: both updated this row at the end. One lock per batch replaces a ``FOR UPDATE`` of
each series' ``series_latest`` row (512 row locks, each one written to the WAL).

What the lock buys: the latest step of each series, which decides where every point goes (new
step: pending batch or COPY; re-sent or late step: upsert; sealed chunks and rollup blocks), changes
only under it. :class:`LatestSteps` keeps it per run in the service's memory as of the token this
process last committed. The token is written in the same transaction as the points, so a row that
still holds it holds the state it was written with: no other writer (another service process,
another host) stored a point of the run since, and no restore or fail-over replaced the database
with another history (a counter could come round to the same number there; a 62-bit random token
does so with odds of 2^-62). Then ``series_latest`` need not be read; otherwise it is read again,
whole, under the lock.
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from sqlalchemy import BigInteger, Integer, LargeBinary, bindparam, case, func, select, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

from hyperwatch.hooks.schema import sequence_range
from hyperwatch.monitor.core.errors import NotFoundError, StoreBusyError
from hyperwatch.monitor.store import repair
from hyperwatch.monitor.store.claims import claim_range
from hyperwatch.monitor.store.entities import ACTIVE_STATUS, GroupThresholds
from hyperwatch.monitor.store.held import HeldPoints
from hyperwatch.monitor.store.models import GroupRow, IngestedBatchRow, ProjectRow, RunRow
from hyperwatch.monitor.store.points import (
    SortedBatch,
    batch_key,
    batch_seen,
    claim_batch,
    now_utc,
    received_ms,
    write_points,
)

MAX_CACHED_RUNS = 256
MAX_CACHED_SERIES = 1_000_000
"""Series held in all (~200 bytes each): 256 runs at the 20,000 series a run may hold would be ~1 GB."""


class Duplicate(Exception):
    """The batch id was stored before: raised inside the transaction so that it rolls back."""

    def __init__(self, run_id: int, accepted: int) -> None:
        super().__init__(f"batch already stored for run {run_id}")
        self.run_id, self.accepted = run_id, accepted


class LatestSteps:
    """Per run: each series' latest stored step and its value (by :func:`points.series_code`), as of an
    ingest token: ``series_latest`` as the batch with that token left it.

    Thread-safe; keeps the ``MAX_CACHED_RUNS`` runs written most recently, fewer when together they
    hold more than ``MAX_CACHED_SERIES`` series (issue 37: memory bounded however many series runs
    hold). Two writers of one run in this process may record their steps in either order: the older
    then stands, its token no longer matches the row, and the next writer reads the steps again (a
    miss, never a wrong answer). The live pages read the values (:meth:`newest`) the same way: only
    when the run's row still holds the token they were recorded with (another process's write, or
    none recorded, is a miss and a read).
    """

    def __init__(self, max_runs: int = MAX_CACHED_RUNS, max_series: int = MAX_CACHED_SERIES) -> None:
        self._runs: OrderedDict[int, tuple[int, dict[int, int], dict[int, float]]] = OrderedDict()
        self._lock = threading.Lock()
        self._max, self._max_series = max_runs, max_series
        self._series = 0  # series held, all runs together
        self.hits = self.misses = 0  # for the tests and the benchmark
        self.read_hits = self.read_misses = 0  # the live reads' (:meth:`newest`)

    def _entry(self, run_id: int, token: int) -> tuple[int, dict[int, int], dict[int, float]] | None:
        found = self._runs.get(run_id)
        return found if found is not None and found[0] == token else None

    def get(self, run_id: int, token: int) -> tuple[dict[int, int], dict[int, float]] | None:
        """The steps and values as of ``token`` (read them only; the writer that got them changes them
        after its commit, through :meth:`advance`, under the lock), or None."""
        with self._lock:
            found = self._entry(run_id, token)
            if found is None:
                self.misses += 1
                return None
            self._runs.move_to_end(run_id)
            self.hits += 1
            return found[1], found[2]

    def put(self, run_id: int, token: int, steps: dict[int, int], values: dict[int, float]) -> None:
        with self._lock:
            self._hold(run_id, token, steps, values, [], [])

    def _hold(
        self,
        run_id: int,
        token: int,
        steps: dict[int, int],
        values: dict[int, float],
        new_steps: list[tuple[int, int]],
        new_values: list[tuple[int, float]],
    ) -> None:
        """(Under the lock.) Hold ``steps``/``values`` with the new entries applied, as of ``token``."""
        old = self._runs.pop(run_id, None)
        held = 0 if old is None else len(old[1])  # counted before the update: the dicts may be the same
        steps.update(new_steps)
        values.update(new_values)
        self._series += len(steps) - held
        self._runs[run_id] = (token, steps, values)
        while len(self._runs) > self._max or (self._series > self._max_series and len(self._runs) > 1):
            _rid, (_t, dropped, _v) = self._runs.popitem(last=False)
            self._series -= len(dropped)

    def advance(
        self,
        run_id: int,
        token: int,
        known: tuple[dict[int, int], dict[int, float]],
        steps: list[tuple[int, int]],
        values: list[tuple[int, float]],
    ) -> None:
        """After a batch's commit: its series' new steps and values into ``known`` (what :meth:`get`
        or the database gave the writer), in place, and ``known`` held as of ``token``.

        In place, not copied: a batch costs what it holds, not what its run holds (a run of 20,000
        series once cost a 20,000-entry copy per batch). Safe: the run's row lock lets one writer at
        a time get the dicts at a matching token, and a writer changes them only here, under the
        lock that :meth:`newest` reads them under."""
        with self._lock:
            self._hold(run_id, token, known[0], known[1], steps, values)

    def forget(self, run_id: int) -> None:
        """Drop what is held of a deleted run (SQLite may give its id to the next run)."""
        with self._lock:
            old = self._runs.pop(run_id, None)
            if old is not None:
                self._series -= len(old[1])

    def newest(self, run_id: int, token: int, step: int) -> list[tuple[int, float]] | None:
        """(series code, value) of every series whose latest step is ``step``, as of ``token``; None if
        the run is not held as of that token."""
        with self._lock:
            found = self._entry(run_id, token)
            if found is None:
                self.read_misses += 1
                return None
            self.read_hits += 1
            steps, values = found[1], found[2]
            return [(code, values[code]) for code, s in steps.items() if s == step]


def _lock_statement(by_name: bool, has_points: bool) -> Any:
    other = RunRow.__table__.alias("target")
    target: Any
    if by_name:
        target = (
            select(other.c.id)
            .join(ProjectRow, ProjectRow.id == other.c.project_id)
            .where(ProjectRow.name == bindparam("b_project"), other.c.name == bindparam("b_name"))
            .scalar_subquery()
        )
    else:
        target = bindparam("b_run_id")
    # SET reads the row version it updates (the newest, after any writer this one waited for), so
    # prior_token is the token as this writer found it; a subquery would read the statement's snapshot
    # (a batch without points changes no point: it keeps the token, and so every cache of the run)
    values: dict[str, Any] = {"prior_token": RunRow.ingest_token}
    if has_points:
        values["ingest_token"] = bindparam("b_token")
        top = bindparam("b_max_step", type_=BigInteger)
        last = RunRow.last_step
        values["last_step"] = case((last.is_(None), top), (last < top, top), else_=last)
        values["last_point_at"] = bindparam("b_now")
    group = [
        select(column).where(GroupRow.id == RunRow.group_id).scalar_subquery().label(f"group_{column.key}")
        for column in (GroupRow.thresholds, GroupRow.learn_thresholds, GroupRow.learned)
    ]
    return (
        update(RunRow)
        .where(RunRow.id == target)
        .values(**values)
        .returning(RunRow.id, RunRow.prior_token, RunRow.group_id, *group, RunRow.status)
    )


def _claiming(lock: Any) -> Any:
    """PostgreSQL: the lock and the batch id's claim (:func:`points.claim_batch`'s row) in one statement,
    one round trip fewer per batch. The claim reads the locked row, so it runs after the lock is held
    (the order every writer takes: a concurrent send of the same id waits for the run's row, then
    finds the id committed), and claims nothing when no run matched (a 404, not a foreign-key error)."""
    locked = lock.cte("locked")
    claim = (
        postgresql.insert(IngestedBatchRow)
        .from_select(
            ["batch_id", "run_id", "n_points", "received_ms"],
            select(
                bindparam("b_key", type_=LargeBinary),
                locked.c.id,
                bindparam("b_n", type_=Integer),
                bindparam("b_ms", type_=BigInteger),
            ),
        )
        .on_conflict_do_nothing(index_elements=["run_id", "batch_id"])
        .returning(IngestedBatchRow.batch_id)
        .cte("claim")
    )
    return select(*locked.c, select(func.count()).select_from(claim).scalar_subquery())


# built once: SQLAlchemy then serves each from its compiled cache
_LOCK = {(n, p): _lock_statement(n, p) for n in (False, True) for p in (False, True)}
_LOCK_CLAIM = {key: _claiming(lock) for key, lock in _LOCK.items()}


def new_token() -> int:
    """A batch's ingest token: random, 62 bits, never 0 (what a run holds before its first batch)."""
    return secrets.randbits(62) | 1


class Locked(NamedTuple):
    """What :func:`lock_run` found: the run, the token its row held, its group's threshold settings (None:
    no group), whether it is running (a stopped one's open ranges are packed into ``metric_chunks``),
    and the batch's claim (None: new, stored by this transaction; else the first send's point count)."""

    run_id: int
    prior: int
    group: GroupThresholds | None
    running: bool
    seen: int | None


def lock_run(
    conn: Connection, run: int | tuple[str, str], max_step: int | None, token: int, batch_id: str, n_points: int
) -> Locked:
    """Lock the run's row, record its progress and swap its ingest token for ``token`` (not without
    points), and claim ``batch_id`` (:func:`points.claim_batch`; on PostgreSQL in the same statement).

    ``run``: an id, or (project, name). ``max_step``: the batch's highest step (None: no points).
    """
    params: dict[str, Any] = {"b_project": run[0], "b_name": run[1]} if isinstance(run, tuple) else {"b_run_id": run}
    if max_step is not None:
        params.update(b_token=token, b_max_step=max_step, b_now=now_utc())
    key = (isinstance(run, tuple), max_step is not None)
    sequence = sequence_range(batch_id)  # claimed as ranges, after the lock (claims.py)
    together = conn.dialect.name == "postgresql" and sequence is None
    if together:
        params.update(b_key=batch_key(batch_id), b_n=n_points, b_ms=received_ms())
    row = conn.execute((_LOCK_CLAIM if together else _LOCK)[key], params).first()
    if row is None:
        if isinstance(run, tuple):
            project, name = run
            raise NotFoundError(
                f"run {name!r} not found in project {project!r}; create it first with "
                f'POST /api/v1/runs {{"name": "{name}", "project": "{project}"}}'
            )
        raise NotFoundError(f"run id {run} not found; list runs with GET /api/v1/runs")
    run_id, prior, group_id, thresholds, learn, learned, status = row[:7]
    if sequence is not None:
        seen = claim_range(conn, run_id, *sequence, n_points)
    elif not together:
        seen = claim_batch(conn, run_id, batch_id, n_points)
    elif not row[7]:
        seen = batch_seen(conn, run_id, batch_id)
        if seen is None:  # the conflicting row is gone again: never store a batch unclaimed
            raise StoreBusyError(f"batch {batch_id} of run {run_id} was claimed and released meanwhile; retry")
    else:
        seen = None
    running = status in (None, ACTIVE_STATUS)
    found = None
    if group_id is not None:
        what = f"group id {group_id}"
        found = GroupThresholds(
            repair.thresholds(thresholds, f"{what} thresholds"),
            repair.learn_setting(learn, f"{what} learn_thresholds"),
            repair.learned(learned, f"{what} learned"),
        )
    return Locked(int(run_id), int(prior), found, running, seen)


def store_points(
    conn: Connection,
    cache: LatestSteps,
    run_id: int,
    token: int,
    batch: SortedBatch,
    known: tuple[dict[int, int], dict[int, float]],
    held: HeldPoints | None = None,
    prior: int = 0,
) -> tuple[int, Callable[[], None]]:
    """Write a claimed, non-empty batch of a locked run; (hot rows moved, what to do once it commits).

    ``known``: the series' latest steps and values as of the lock, from ``cache`` when it holds the
    run as of the token the locked row held, else from ``series_latest`` merged with the run's pending
    rows (``latest.latest_steps``);
    the returned callable records the steps after the batch in ``cache`` as of ``token`` (the
    batch's own: call it only after the commit), and in ``held`` (SQLite) the run's hot rows, taken
    from it as of ``prior`` (the token the locked row held).
    """
    known_steps = known[0]
    codes = batch.codes.tolist()
    before = np.array([known_steps.get(c, -1) for c in codes], dtype=np.int64)
    parts = None if held is None else held.get(run_id, prior)
    moved, after, left = write_points(conn, run_id, token, batch, before, parts)
    steps = list(zip(codes, after.tolist()))
    # series_latest's rule (points._write_latest): a series' value is replaced when the batch reaches
    # its latest step (a re-sent latest step too), never by a late step
    newer = (batch.step[batch.ends - 1] >= before).tolist()
    last_values = batch.value[batch.ends - 1].tolist()
    values = [(c, v) for c, v, n in zip(codes, last_values, newer) if n]

    def committed() -> None:
        cache.advance(run_id, token, known, steps, values)
        if held is not None:
            held.put(run_id, token, left)

    return moved, committed
