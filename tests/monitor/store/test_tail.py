"""A stopped run's last, unsealed steps folded into its segments and put back when it writes again
(:mod:`monitor.store.tail`). Every check reads through a second store whose process caches know
nothing, and compares every stored point, bit for bit, with what was sent."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store import SqlStore, chunks, segcodec
from hyperwatch.monitor.store.models import CHUNK_STEPS

NAMES, LAYERS = ("m0", "m1"), 2


def value(name: str, layer: int | None, step: int) -> float:
    special = {("m1", 1, 37): math.nan, ("m1", 0, 38): math.inf, ("m0", 1, 36): -math.inf}
    if (name, layer, step) in special:
        return special[(name, layer, step)]
    if (name, layer, step) == ("m0", 0, 38):
        return 1e6  # the series' max, in its last steps
    return step * 1.5 + NAMES.index(name) * 0.25 + (layer or 0) / 8 if name in NAMES else 5.0 - step / 100


def points(steps: range, tokens: bool = True) -> list[Point]:
    out = []
    for s in steps:
        out += [
            Point(n, s, value(n, la, s), layer=la, tokens=s * 512 if tokens else None)
            for n in NAMES
            for la in range(LAYERS)
        ]
        out.append(Point("loss", s, value("loss", None, s)))
    return out


class Run:
    def __init__(self, store: SqlStore, db_url: str, name: str = "r") -> None:
        self.store, self.url = store, db_url
        self.id = store.upsert_run("default", name, {"status": "running"})[0].id
        self.sent: dict[tuple[str, int | None, int], float] = {}
        self.tokens: dict[tuple[str, int | None, int], int | None] = {}

    def write(self, steps: range, per_batch: int = 1, tokens: bool = True) -> None:
        pts = points(steps, tokens)
        for s0 in range(steps.start, steps.stop, per_batch):
            batch = [p for p in pts if s0 <= p.step < s0 + per_batch]
            self.store.ingest(self.id, uuid.uuid4().hex, batch)
            self.sent.update({(p.name, p.layer, p.step): p.value for p in batch})
            self.tokens.update({(p.name, p.layer, p.step): p.tokens for p in batch})

    def status(self, status: str) -> None:
        self.store.update_run(self.id, {"status": status})
        self.store.hot_vacuum.wait()  # a stop's vacuum of the hot tables done: a migration's lock waits for no chore

    def hot_rows(self) -> int:
        with self.store.engine.connect() as conn:
            n = conn.execute(text("SELECT count(*) FROM metric_points WHERE run_id = :r"), {"r": self.id}).scalar()
            if conn.dialect.name == "postgresql":
                n += conn.execute(text("SELECT count(*) FROM point_batches WHERE run_id = :r"), {"r": self.id}).scalar()
        return int(n)

    def check_every_point(self) -> None:
        """Every point sent reads back once, bit for bit (NaN and infinities too), through a fresh store."""
        other = SqlStore(self.url)
        try:
            with other.engine.connect() as conn:
                ids = dict(conn.execute(text("SELECT id, name FROM metric_names")).all())
                got, tokens = {}, {}
                for _r, n, la, s, t, v in chunks.all_points(conn, self.id):
                    key = (ids[n], None if la == -1 else la, s)
                    assert key not in got, f"{key} stored twice"
                    got[key], tokens[key] = (math.nan if v is None else v), t
            assert set(got) == set(self.sent)
            assert {k: t for k, t in tokens.items() if k in self.tokens} == self.tokens
            for key, v in self.sent.items():
                assert np.float64(got[key]).tobytes() == np.float64(v).tobytes() or (
                    math.isnan(v) and math.isnan(got[key])
                )
            latest = {(s.name, s.layer): s.step for s in other.list_series(self.id)}
            top = max(s for _n, _l, s in self.sent)
            assert latest[("m0", 0)] == top and latest[("loss", None)] == top
        finally:
            other.close()

    def spans(self) -> dict[tuple[int, int], tuple[int, int]]:
        """Per series (name id, layer): its newest chunk row's (first chunk, chunks covered)."""
        sql = "SELECT name_id, layer, chunk, data FROM chunk_rows WHERE run_id = :r ORDER BY chunk"
        out = {}
        with self.store.engine.connect() as conn:
            for n, la, c, data in conn.execute(text(sql), {"r": self.id}):
                blob = bytes(data)
                out[(int(n), int(la))] = (
                    int(c),
                    segcodec.span(blob) if segcodec.is_segment(blob) else 1,
                )
        return out


@pytest.fixture
def run(store: SqlStore, db_url: str) -> Iterator[Run]:
    yield Run(store, db_url)


def test_a_stopped_run_keeps_no_hot_rows_and_every_point(run: Run) -> None:
    run.write(range(39))  # steps 32-38 unsealed (boundary 32): hot rows, on PostgreSQL partly pending
    assert run.hot_rows() > 0
    run.status("finished")
    assert run.hot_rows() == 0
    run.check_every_point()
    # the folded segment reaches the chunk of the last steps: chunks 0-2 (steps 0-47)
    assert set(run.spans().values()) == {(0, 3)}
    other = SqlStore(run.url)
    try:
        loss = other.series_summaries([run.id], ["loss"])[(run.id, "loss")]  # its minimum: the last step's
        assert (loss.last_step, loss.min_step, loss.min) == (38, 38, value("loss", None, 38))
        window = other.series(run.id, "m0", 0, 100, None, None)
        assert [p.step for p in window.points][-3:] == [36, 37, 38] and window.points[-1].value == 1e6
        # the detectors' reads, the layer matrix and the live page's newest step, from the folded rows
        trail = other.trailing_points(run.id, [("m0", 0, 39), ("m1", 1, 38)], 10)
        assert trail[0] == [(s, value("m0", 0, s)) for s in range(29, 39)]
        assert [s for s, _v in trail[1]] == list(range(28, 38)) and math.isnan(trail[1][-1][1])
        maxima = other.step_maxima(run.id, [("m0", 38)], 4)[0]
        assert maxima == [(s, max(value("m0", la, s) for la in range(LAYERS))) for s in range(35, 39)]
        matrix = other.layer_matrix(run.id, "m1", 39, None, None)
        assert matrix.bucket_starts[-1] == 38 and matrix.values[0][-1] == math.inf
        newest = {(n, la): v for n, la, v in other.newest_points(run.id, 38) or []}
        assert newest[("m0", 0)] == 1e6 and newest[("loss", None)] == value("loss", None, 38)
    finally:
        other.close()


def test_a_run_that_runs_again_gets_its_last_steps_back(run: Run) -> None:
    run.write(range(39))
    run.status("finished")
    run.status("running")
    assert run.hot_rows() > 0  # the writers' layout again: steps 32-38 hot, the segment up to the boundary
    assert set(run.spans().values()) == {(0, 2)}
    run.write(range(39, 70))
    run.check_every_point()
    run.status("interrupted")
    assert run.hot_rows() == 0
    run.check_every_point()


def test_points_that_reach_a_stopped_run_stay_hot_until_its_next_stop(run: Run) -> None:
    run.write(range(39))
    run.status("finished")
    late = [Point("m0", 37, -7.0, layer=0), Point("m1", 5, 123.0, layer=1)]  # a folded step and a sealed one, corrected
    run.store.ingest(run.id, uuid.uuid4().hex, late)
    run.sent.update({(p.name, p.layer, p.step): p.value for p in late})
    run.tokens.update({(p.name, p.layer, p.step): None for p in late})
    # the batch's two series unfolded (m0 0's steps 32-38, m1 1's 32-38: 14 rows), the others still folded
    assert run.hot_rows() == 14
    run.check_every_point()
    run.write(range(39, 42))  # after the stop: appended to every series, which then stay hot
    assert run.hot_rows() > 0
    run.check_every_point()
    run.status("failed")  # the next stop folds them all
    assert run.hot_rows() == 0 and set(run.spans().values()) == {(0, 3)}
    run.check_every_point()


def test_a_tail_that_ends_its_range_makes_no_rollup_until_the_range_seals(run: Run) -> None:
    run.write(range(1022), per_batch=64, tokens=False)  # the last chunk of range 0 (steps 1008-1023) unsealed
    run.status("finished")
    assert run.hot_rows() == 0
    assert set(run.spans().values()) == {(0, 1024 // CHUNK_STEPS)}
    with run.store.engine.connect() as conn:
        rollups = conn.execute(text("SELECT count(*) FROM metric_rollups WHERE run_id = :r"), {"r": run.id}).scalar()
    assert rollups == 0  # the range is not sealed: its points are read from the row, its max from the row's own
    run.check_every_point()
    run.status("running")
    run.write(range(1022, 1030), per_batch=8, tokens=False)
    run.status("finished")
    with run.store.engine.connect() as conn:
        rollups = conn.execute(text("SELECT count(*) FROM metric_rollups WHERE run_id = :r"), {"r": run.id}).scalar()
    assert rollups == 5  # range 0 sealed now: a level-2 row per series
    assert set(run.spans().values()) == {(64, 1)}  # and steps 1024-1029 folded into range 1's first chunk
    run.check_every_point()


BEFORE = "0020_latest_lags"


def _folded(run: Run) -> bool:
    return run.hot_rows() == 0 and set(run.spans().values()) == {(0, 3)}


def test_0021_folds_stopped_runs_and_its_downgrade_puts_them_back(run: Run) -> None:
    from hyperwatch.monitor.store import migrate

    run.write(range(39))
    run.status("finished")
    live = Run(run.store, run.url, "live")  # a second run, still running: neither direction touches it
    live.write(range(39))
    hot_live = live.hot_rows()
    migrate.downgrade(run.store.engine, BEFORE)
    assert run.hot_rows() > 0 and set(run.spans().values()) == {(0, 2)}  # the layout the code before expects
    run.check_every_point()
    migrate.upgrade(run.store.engine)
    assert migrate.current_revision(run.store.engine) == migrate.head_revision()
    assert _folded(run) and live.hot_rows() == hot_live
    run.check_every_point()
    live.check_every_point()


@pytest.mark.parametrize("move", ["up", "down"])
def test_0021_waits_for_a_writer_inside_and_moves_its_point(run: Run, move: str) -> None:
    """A writer inside the hot rows when the migration starts (a late step of the stopped run, written and
    not committed): the migration waits behind its lock, then moves that point with the rest."""
    import sqlite3

    import psycopg

    from hyperwatch.monitor.store import migrate
    from tests.monitor.store.test_migration_writers import behind_writer

    run.write(range(39))
    run.status("finished")
    migrate.downgrade(run.store.engine, BEFORE)  # the run's tail hot, as the code before 0021 left it
    if move == "down":
        migrate.upgrade(run.store.engine)
    pg = run.store.engine.dialect.name == "postgresql"
    with run.store.engine.connect() as conn:
        m0 = conn.execute(text("SELECT id FROM metric_names WHERE name = 'm0'")).scalar_one()
    if pg:
        writer: Any = psycopg.connect(run.url.replace("+psycopg", ""))
    else:
        writer = sqlite3.connect(run.url.removeprefix("sqlite:///"), isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")
    mark = "%s" if pg else "?"
    # step 33 of m0 layer 1, corrected: hot under either revision (past the boundary 32)
    writer.execute(
        f"DELETE FROM metric_points WHERE run_id = {mark} AND name_id = {mark} AND layer = 1 AND step = 33",
        (run.id, m0),
    )
    if move == "up":
        writer.execute(f"INSERT INTO metric_points VALUES ({mark}, {mark}, 1, 33, NULL, -33.0)", (run.id, m0))
    target = migrate.upgrade if move == "up" else lambda engine: migrate.downgrade(engine, BEFORE)
    behind_writer(run.url, writer, lambda: target(run.store.engine))
    if move == "up":
        run.sent[("m0", 1, 33)], run.tokens[("m0", 1, 33)] = -33.0, None
        assert _folded(run)
    else:
        assert run.hot_rows() > 0
    run.check_every_point()
