"""Time to register N new metric names, the path before issue 25 and now, side by side on each database.

Before: one ``count(*)`` over ``metric_names``, one ``INSERT .. ON CONFLICT DO NOTHING`` and one
``SELECT`` per new name, all in the batch's write transaction (the issue measured 4.9 s for 20,000
names on SQLite, holding the write lock, and 45 s for 32,300 on PostgreSQL). It is kept here, as it
was, so that both run on the same machine in the same run. Now: :func:`monitor.store.names.name_ids`,
one ``SELECT`` and one ``INSERT .. SELECT`` per batch of at most ``MAX_NAMES_PER_BATCH`` names.

Each path starts from an empty database at head and registers the same N fresh names
(``user.bench.n<i>``), in batches of ``MAX_NAMES_PER_BATCH`` (one transaction each, as the ingest
route would: a batch is capped at that many names now). It prints both times and their ratio, and
the sequence's ``last_value`` on PostgreSQL (ids drawn: N means none leaked).

    .venv/bin/python bench/metric_names.py                # 20,000 names, SQLite and PostgreSQL
    .venv/bin/python bench/metric_names.py --names 32000 --only pg
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import func, select, text
from sqlalchemy.engine import Connection

from bench.ingest import pg_database
from hyperwatch.monitor.store import SqlStore, migrate
from hyperwatch.monitor.store.engine import managed
from hyperwatch.monitor.store.models import MetricNameRow
from hyperwatch.monitor.store.names import MAX_NAMES_PER_BATCH, name_ids
from hyperwatch.monitor.store.points import dialect_insert


def old_register(conn: Connection, names: Sequence[str], cache: dict[str, int]) -> dict[str, int]:
    """The pre-issue-25 ``SqlStore._name_id`` for each name (its 32,767-name check included)."""
    out = {}
    for name in names:
        nid = cache.get(name)
        if nid is None:
            nid = conn.execute(select(MetricNameRow.id).where(MetricNameRow.name == name)).scalar()
        if nid is None:
            count = conn.execute(select(func.count()).select_from(MetricNameRow)).scalar() or 0
            if count >= 32_767:
                raise RuntimeError("the old path's limit: 32,767 names")
            ins = dialect_insert(conn, MetricNameRow.__table__).values(name=name)
            conn.execute(ins.on_conflict_do_nothing(index_elements=["name"]))
            nid = conn.execute(select(MetricNameRow.id).where(MetricNameRow.name == name)).scalar()
        assert nid is not None
        out[name] = int(nid)
    return out


Register = Callable[[Connection, Sequence[str], dict[str, int]], dict[str, int]]


def run(url: str, n: int, register: Register) -> tuple[float, int | None]:
    store = SqlStore(url)
    try:
        migrate.upgrade(store.engine)
        names = [f"user.bench.n{i}" for i in range(n)]
        t0 = time.perf_counter()
        for a in range(0, n, MAX_NAMES_PER_BATCH):
            with managed(store.engine, "register names", write=True) as conn:
                ids = register(conn, names[a : a + MAX_NAMES_PER_BATCH], {})
                assert len(ids) == len(names[a : a + MAX_NAMES_PER_BATCH])
        dt = time.perf_counter() - t0
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM metric_names")).scalar() == n
            drawn = None
            if store.engine.dialect.name == "postgresql":
                drawn = conn.execute(text("SELECT last_value FROM metric_names_id_seq")).scalar()
        return dt, drawn
    finally:
        store.close()


def compare(label: str, urls: Callable[[], tuple[str, str]], n: int) -> None:
    old_url, new_url = urls()
    old, old_drawn = run(old_url, n, old_register)
    new, new_drawn = run(new_url, n, name_ids)
    drawn = "" if new_drawn is None else f"   ids drawn: before {old_drawn:,}, now {new_drawn:,}"
    print(f"{label:<11} {n:>7,} new names   before {old:7.2f} s   now {new:7.3f} s   {old / new:7.1f}x{drawn}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--names", type=int, default=20_000)
    parser.add_argument("--only", choices=["sqlite", "pg"])
    args = parser.parse_args()
    print(f"registering N new metric names in batches of {MAX_NAMES_PER_BATCH:,} (one transaction each)")
    if args.only != "pg":
        with tempfile.TemporaryDirectory() as tmp:
            compare("SQLite", lambda: (f"sqlite:///{tmp}/old.db", f"sqlite:///{tmp}/new.db"), args.names)
    if args.only != "sqlite":
        with pg_database() as old_url, pg_database() as new_url:
            compare("PostgreSQL", lambda: (old_url, new_url), args.names)


if __name__ == "__main__":
    main()
