"""``series_latest`` lags behind the pending rows on PostgreSQL, and every reader merges the two
(:mod:`monitor.store.latest`). Each test reads through a second store whose process cache knows
nothing (another service process), so every read below goes to the database."""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import text

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store import SqlStore, chunks, migrate

NAMES, LAYERS = ("m0", "m1"), 3
BEFORE = "0019_batch_ranges"


def value(name: str, layer: int | None, step: int) -> float:
    if (name, layer, step) == ("m1", 1, 19):
        return math.nan  # a NaN latest is a training fact: read back as NaN
    return step * 100.0 + NAMES.index(name) * 10 + (layer if layer is not None else 9) if name in NAMES else -step


def step_points(step: int) -> list[Point]:
    pts = [Point(n, step, value(n, la, step), layer=la) for n in NAMES for la in range(LAYERS)]
    pts.append(Point("loss", step, 5.0 - step / 10))
    if 16 <= step <= 18:  # a series logged only while its steps are pending
        pts.append(Point("x", step, value("x", 0, step), layer=0))
    return pts


@pytest.fixture
def written(store: SqlStore, db_url: str) -> Iterator[tuple[SqlStore, int]]:
    """Steps 0-19 one batch each through ``store`` (on PostgreSQL 17-19 stay pending rows).
    Yields a second store on the same database and the run's id."""
    run, _ = store.upsert_run("default", "r", {"group": "g", "status": "running"})
    for step in range(20):
        store.ingest(run.id, uuid.uuid4().hex, step_points(step))
    other = SqlStore(db_url)
    yield other, run.id
    other.close()


def table_steps(store: SqlStore, run_id: int) -> dict[tuple[str, int], int]:
    with store.engine.connect() as conn:
        q = (
            "SELECT n.name, s.layer, s.step FROM series_latest s JOIN metric_names n ON n.id = s.name_id "
            "WHERE run_id = :r"
        )
        return {(n, la): s for n, la, s in conn.execute(text(q), {"r": run_id})}


def test_the_table_lags_only_on_postgresql(written: tuple[SqlStore, int]) -> None:
    other, run_id = written
    steps = table_steps(other, run_id)
    if other.engine.dialect.name == "postgresql":
        # step 16's batch took the full path (x's first point, at 16, passed its series' first chunk edge);
        # 17-19 went to the pending rows and left the table as it was
        assert steps[("m0", 0)] == 16 and steps[("x", 0)] == 16
    else:
        assert steps[("m0", 0)] == 19 and steps[("x", 0)] == 18


def test_every_reader_merges_the_pending_points(written: tuple[SqlStore, int]) -> None:
    other, run_id = written
    listed = {(s.name, s.layer): (s.step, s.value) for s in other.list_series(run_id)}
    assert listed[("x", 0)] == (18, value("x", 0, 18))
    assert listed[("m0", 2)] == (19, value("m0", 2, 19))
    assert listed[("loss", None)] == (19, 5.0 - 1.9)
    assert listed[("m1", 1)][0] == 19 and math.isnan(listed[("m1", 1)][1])

    newest = other.newest_points(run_id, 19)
    assert newest is not None
    assert {(n, la) for n, la, _v in newest} == {(n, la) for n in NAMES for la in range(LAYERS)} | {("loss", None)}
    assert dict(((n, la), v) for n, la, v in newest)[("m0", 1)] == value("m0", 1, 19)

    summary = other.series_summaries([run_id], ["loss"])[(run_id, "loss")]
    assert (summary.last_step, summary.last) == (19, 5.0 - 1.9)
    assert summary.min == 5.0 - 1.9  # from the points themselves, pending ones included, as before

    group = other.get_run(run_id).group_id
    assert group is not None
    assert [h.last_loss for h in other.group_run_health(group)] == [5.0 - 1.9]

    active = {(v.name, v.layer): v.step for v in other.latest_for_active_runs(["loss", "m0"])}
    assert active[("loss", None)] == 19 and active[("m0", 0)] == 19

    matrix = other.layer_matrix(run_id, "m0", 20, None, None)
    assert matrix.layers == [0, 1, 2]
    assert matrix.values[0][-1] == value("m0", 0, 19)


def test_a_writer_that_missed_the_cache_and_a_back_fill_keep_every_point_once(written: tuple[SqlStore, int]) -> None:
    other, run_id = written
    other.ingest(run_id, uuid.uuid4().hex, step_points(20))  # steps read merged: step 20 is new for every series
    # a correction of a pending step: the run's pending points are taken back, and the rows follow them
    other.ingest(run_id, uuid.uuid4().hex, [Point("m0", 17, -1.0, layer=0)])
    if other.engine.dialect.name == "postgresql":
        steps = table_steps(other, run_id)
        assert steps[("x", 0)] == 18 and steps[("m0", 0)] == 20 and steps[("m1", 2)] == 20
    listed = {(s.name, s.layer): (s.step, s.value) for s in other.list_series(run_id)}
    assert listed[("x", 0)] == (18, value("x", 0, 18)) and listed[("m0", 0)] == (20, value("m0", 0, 20))
    with other.engine.connect() as conn:
        m0 = conn.execute(text("SELECT id FROM metric_names WHERE name = 'm0'")).scalar_one()
        got = [(n, la, s, v) for _r, n, la, s, _t, v in chunks.all_points(conn, run_id)]
    keys = [(n, la, s) for n, la, s, _v in got]
    assert len(keys) == len(set(keys)) == 21 * (len(NAMES) * LAYERS + 1) + 3  # each key once
    assert [v for n, la, s, v in got if (n, la, s) == (m0, 0, 17)] == [-1.0]  # the correction won


def test_0020_downgrade_brings_every_row_to_its_newest_pending_step(written: tuple[SqlStore, int]) -> None:
    other, run_id = written
    migrate.downgrade(other.engine, BEFORE)
    steps = table_steps(other, run_id)
    assert steps[("m0", 0)] == 19 and steps[("x", 0)] == 18 and steps[("loss", -1)] == 19
    with other.engine.connect() as conn:
        q = "SELECT value FROM series_latest s JOIN metric_names n ON n.id = s.name_id"
        q += " WHERE n.name = 'm1' AND layer = 1"
        assert conn.execute(text(q)).scalar_one() is None  # the NaN, stored as the table stores it
    migrate.upgrade(other.engine)
    assert migrate.current_revision(other.engine) == migrate.head_revision()


def test_0020_downgrade_waits_for_a_writer_inside_and_catches_its_step_up(pg_url: str) -> None:
    """A pending batch being written when the downgrade starts: the catch-up waits behind the lock for it
    to commit and then includes it, so the code before 0020 finds even that step in the table."""
    pg = SqlStore(pg_url)
    try:
        migrate.upgrade(pg.engine)
        run_pg, _ = pg.upsert_run("default", "w", {"status": "running"})
        for step in range(18):
            pg.ingest(run_pg.id, uuid.uuid4().hex, [Point("m0", step, float(step), layer=0)])
        with pg.engine.connect() as conn:
            m0 = conn.execute(text("SELECT id FROM metric_names WHERE name = 'm0'")).scalar_one()
        writer = psycopg.connect(pg_url.replace("+psycopg", ""))
        writer.execute(  # the 0020 service's next batch, written and not yet committed
            "INSERT INTO point_batches (run_id, name_id, token, layer, step, tokens, value) "
            "VALUES (%s, %s, 12345, '{0}'::int2[], '{18}'::int8[], '{-1}'::int8[], '{7.5}'::float8[])",
            (run_pg.id, m0),
        )
        failed: list[BaseException] = []

        def downgrade() -> None:
            try:
                migrate.downgrade(pg.engine, BEFORE)
            except BaseException as exc:  # reported below
                failed.append(exc)

        mover = threading.Thread(target=downgrade, daemon=True)
        mover.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _waiting(pg_url):
            time.sleep(0.05)
        assert mover.is_alive(), "the downgrade finished while a writer was inside the tables it reads"
        writer.commit()
        writer.close()
        mover.join(60)
        assert not mover.is_alive() and not failed, failed
        assert table_steps(pg, run_pg.id)[("m0", 0)] == 18
    finally:
        pg.close()


def _waiting(url: str) -> bool:
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as c:
        return bool(c.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()[0])  # type: ignore[index]
