"""Revision 0018: ``series_latest`` on PostgreSQL keeps room on each page for its rows' next versions
(fillfactor 50), so the update a batch makes to each of its series stays on its page and writes no
new key entry (issue 36). Since 2026-12-01 only the batches that do not go to the pending rows update
it (monitor.store.latest). SQLite has no such setting; the revision is a no-op there."""

from __future__ import annotations

import uuid

from sqlalchemy import text

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store import SqlStore, migrate

BEFORE = "0017_batch_keys"
SERIES = 400  # ~55-byte rows: three pages of them at 100%


def _options(store: SqlStore) -> list[str]:
    with store.engine.connect() as conn:
        q = "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE relname = 'series_latest'"
        return list(conn.execute(text(q)).scalar_one())


def _post_and_measure(store: SqlStore, name: str, batches: int) -> tuple[int, int, int]:
    """A run whose every batch carries one step of ``SERIES`` series; then VACUUM and the sizes of the
    table and its key, and how many of its rows there are."""
    run, _ = store.upsert_run("default", name, {})
    for step in range(batches):
        pts = [Point(f"m{i % 8}", step, float(step * SERIES + i), layer=i // 8) for i in range(SERIES)]
        store.ingest(run.id, uuid.uuid4().hex, pts)
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM series_latest"))
        table, key = conn.execute(
            text("SELECT pg_relation_size('series_latest'), pg_relation_size('pk_series_latest')")
        ).one()
        rows = conn.execute(text("SELECT count(*) FROM series_latest WHERE run_id = :r"), {"r": run.id}).scalar_one()
    return int(table), int(key), int(rows)


def test_updates_of_the_latest_values_stay_on_their_pages(pg_store: SqlStore) -> None:
    assert _options(pg_store) == ["fillfactor=50"]
    table, key, rows = _post_and_measure(pg_store, "r", 60)
    assert rows == SERIES
    # the live rows at half a page each: 7 pages and a key of 4 (its meta page, root and two leaves); without
    # the room each batch moved every row to another page and wrote a key entry for it (measured at
    # fillfactor 100: 32 pages of table and 8 of key)
    assert table <= 8 * 8192, table
    assert key <= 4 * 8192, key
    with pg_store.engine.connect() as conn:
        stored = conn.execute(text("SELECT min(step), max(step), max(value) FROM series_latest")).one()
    # the rows as the last sealing batch (step 47) left them: steps 48-59 are pending rows, which no
    # longer rewrite them (monitor.store.latest); the readers merge the two
    assert tuple(stored) == (47, 47, 47 * SERIES + SERIES - 1)
    run = next(r for r in pg_store.list_runs() if r.name == "r")
    found = pg_store.list_series(run.id)
    assert len(found) == SERIES and {s.step for s in found} == {59}
    assert max(s.value for s in found) == 59 * SERIES + SERIES - 1  # the last batch's values, as before


def test_0018_sets_and_resets_the_fill_factor(db_url: str) -> None:
    store = SqlStore(db_url)
    try:
        migrate.upgrade(store.engine)
        pg = store.engine.dialect.name == "postgresql"
        if pg:
            assert _options(store) == ["fillfactor=50"]
        migrate.downgrade(store.engine, BEFORE)
        if pg:
            assert _options(store) == []
        run, _ = store.upsert_run("default", "r", {})
        store.ingest(run.id, uuid.uuid4().hex, [Point("loss", 0, 1.5)])
        migrate.upgrade(store.engine)
        assert migrate.current_revision(store.engine) == migrate.head_revision()
        if pg:
            assert _options(store) == ["fillfactor=50"]
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT value FROM series_latest")).scalar_one() == 1.5
    finally:
        store.close()
