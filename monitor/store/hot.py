"""Keeping PostgreSQL's hot tables small: the service vacuums them itself after moving points out.

``point_batches`` and ``metric_points`` hold less than one chunk per series
(:mod:`monitor.store.pending`, :mod:`monitor.store.compact`), but every point passes through them:
inserted, then deleted when its chunk seals. PostgreSQL reuses the space
of deleted rows only once VACUUM has seen them, and autovacuum looks at a table once a minute at
most: at 10^4 points/s that is 6 x 10^5 dead rows (~60 MB with the index) between visits, more than
the chunks of a million points. So the store runs ``VACUUM`` of the hot tables (also
``series_latest``, rewritten by every batch that does not go to the pending rows (:mod:`.latest`);
since revision 0018 its pages keep half their room for those rewrites, so they stay on their page and
need no key entry) from a background thread whenever
``VACUUM_AFTER_ROWS`` rows have been moved since the last one: the table then stays at about one
chunk per series plus one vacuum interval of dead rows, whatever the ingest rate. (Measured on the
benchmark's 512 series, one step per batch, through the store: vacuuming after every chunk round,
4,096 rows, cost ~10% of the points/s; after 16,384 rows, i.e. every two rounds, no loss beyond
the noise, for ~1.5 MB more of hot table.) ``TRUNCATE false``: giving trailing empty pages back
would take a lock that stalls every writer of the table for a moment.

VACUUM (not FULL) takes a lock that never blocks reads or writes; it runs outside any transaction,
on its own pooled connection; one runs at a time. A failed one is logged and retried next time.
SQLite needs none of this: deleted pages go to its freelist and are reused by the next inserts.

``open_chunks`` churns too (revision 0015): the 16-step chunks of a running series' open range live
there until the next pack (every ``PACK_STEPS``) folds them into its partial segment and deletes
them, and each pack rewrites the partial segment (TOAST chunks and all). Left to autovacuum, a
2,000-step run of issue 36's workload left the chunks at 20 B/pt, 4x their live bytes
(``bench/storage_parts.py``, before 0015, when these rows shared ``metric_chunks`` with the
segments). So every vacuum of the hot tables takes ``open_chunks`` too: its dead rows' heap, TOAST and index space
is reused by the next chunks soon after they die. Its index is what the rhythm decides: every 8th
vacuum (once per pack round) left ``pk_open_chunks`` at 1.02 B/pt, every one at 0.54 (issue 36's
workload, PostgreSQL 7.90 -> 7.42 B/pt after one run; ingest 72.2k and 72.8k points/s against 70.1k
and 71.3k, side by side, within the runs' noise). ``metric_chunks`` only grows (segments of sealed ranges, and the
partial segments of runs that stopped), so autovacuum is enough there.

VACUUM gives an index's empty pages to later entries, never back: ``open_chunks``' indexes stay at
the size of the most open ranges they ever held, ~0.54 B/pt after one 2,000-step run of issue 36's
workload, with the table empty once the run stopped. So when a run stops (:meth:`HotVacuum.stopped`),
the service rebuilds them at the size of what is open now (``REINDEX TABLE CONCURRENTLY``, PostgreSQL
12+: reads and writes go on, the old index serves until the new one is built; one at a time, in the
background like the vacuum), after a vacuum of the hot tables: a run that stops has moved fewer
rows than ``VACUUM_AFTER_ROWS`` since the last vacuum, often no vacuum at all when it is short, so
without it the space its points passed through in ``point_batches`` and ``metric_points`` (and their
indexes) stayed dead until autovacuum came by, and the next runs took new pages (the real-hooks fixture
of ``bench/storage.py``, 13 runs of ~1,400 points: the same runs posted a second time grew the
database by 23.2 B/pt without this vacuum, 20.5 with it). Not ``TRUNCATE`` of an empty table: it would
take a lock every reader and writer of the table queues behind, and a reader whose snapshot predates it
would see rows it should still see (the run's open ranges, just moved to ``metric_chunks``) vanish.

The hot tables' own indexes keep their largest size the same way: after the real-hooks fixture's 13
runs, ``pk_metric_points`` and ``pk_point_batches`` held 13.8 and 13.4 B/pt, their tables 1.3 and 1.6
B/pt of live rows (the stopped runs' last, unsealed steps). So a stop rebuilds them too, when the table
holds at most ``REINDEX_HOT_MAX_ROWS`` rows: then the rebuild reads little (~0.1 s for 10^5 rows); a
database with more hot rows (many runs running) has churn enough to reuse its index's empty pages, and
is left alone.
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy.engine import Engine

log = logging.getLogger(__name__)
VACUUM_AFTER_ROWS = 16_384
HOT_TABLES = "metric_points, point_batches, series_latest, open_chunks"
REBUILT_WHEN_SMALL = ("metric_points", "point_batches")
"""The hot tables whose indexes a stop rebuilds when they hold few rows (``open_chunks``' it always rebuilds)."""
REINDEX_HOT_MAX_ROWS = 100_000


class HotVacuum:
    def __init__(self, engine: Engine, after_rows: int = VACUUM_AFTER_ROWS) -> None:
        self._engine = engine
        self._after = after_rows
        self._pending = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.runs = 0  # vacuums completed (for tests and the benchmark)
        self._reindex: threading.Thread | None = None
        self.rebuilt = dict.fromkeys(("open_chunks", *REBUILT_WHEN_SMALL), 0)  # rebuilds of each table's indexes
        self.stop_vacuums = 0  # vacuums of the hot tables at a run's stop completed

    def moved(self, rows: int) -> None:
        """Count ``rows`` moved out of ``metric_points`` by a committed transaction; vacuum when due."""
        if rows <= 0 or self._engine.dialect.name != "postgresql":
            return
        with self._lock:
            self._pending += rows
            if self._pending < self._after or (self._thread is not None and self._thread.is_alive()):
                return
            self._pending = 0
            self._thread = threading.Thread(target=self._vacuum, name="hyperwatch-vacuum", daemon=True)
            self._thread.start()

    def _vacuum(self) -> None:
        if self._chore(f"VACUUM (TRUNCATE false) {HOT_TABLES}", "VACUUM of the hot tables", "retried later"):
            self.runs += 1

    def stopped(self) -> None:
        """A run stopped (committed): vacuum the hot tables, so the next runs reuse the space its points
        passed through, and rebuild ``open_chunks``' indexes at the size of what is still open (its open
        ranges left), and those of ``metric_points`` and ``point_batches`` when they hold few rows (see
        the module's doc). Skipped while a rebuild runs (its snapshot may predate this stop: the entries it
        keeps are dead, and the next stop's rebuild drops them)."""
        if self._engine.dialect.name != "postgresql":
            return
        with self._lock:
            if self._reindex is not None and self._reindex.is_alive():
                return
            self._reindex = threading.Thread(target=self._after_stop, name="hyperwatch-reindex", daemon=True)
            self._reindex.start()

    def _after_stop(self) -> None:
        with self._lock:
            self._pending = 0
        if self._chore(f"VACUUM (TRUNCATE false) {HOT_TABLES}", "VACUUM of the hot tables", "retried later"):
            self.stop_vacuums += 1
        for table in ("open_chunks", *(t for t in REBUILT_WHEN_SMALL if self._small(t))):
            if self._chore(f"REINDEX TABLE CONCURRENTLY {table}", f"REINDEX of {table}", "retried when a run stops"):
                self.rebuilt[table] += 1

    @property
    def reindexed(self) -> int:
        """Rebuilds of ``open_chunks``' indexes completed."""
        return self.rebuilt["open_chunks"]

    def _small(self, table: str) -> bool:
        """Whether ``table`` holds at most ``REINDEX_HOT_MAX_ROWS`` rows (reads at most one more)."""
        sql = f"SELECT count(*) FROM (SELECT 1 FROM {table} LIMIT {REINDEX_HOT_MAX_ROWS + 1}) AS t"
        try:
            with self._engine.connect() as conn:
                return int(conn.exec_driver_sql(sql).scalar_one()) <= REINDEX_HOT_MAX_ROWS
        except Exception as exc:  # a background chore
            log.warning(
                "counting the rows of %s failed (%s: %s); its indexes are not rebuilt", table, type(exc).__name__, exc
            )
            return False

    def _chore(self, sql: str, what: str, retry: str) -> bool:
        """Run ``sql`` outside any transaction on a pooled connection; a failure is logged, never fatal."""
        try:
            with self._engine.connect() as conn:
                conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(sql)
            return True
        except Exception as exc:  # a background chore
            log.warning("%s failed (%s: %s); %s", what, type(exc).__name__, exc, retry)
            return False

    def wait(self, timeout: float = 30.0) -> None:
        """Let a running vacuum or rebuild finish (before closing the engine)."""
        for thread in (self._thread, self._reindex):
            if thread is not None:
                thread.join(timeout)
