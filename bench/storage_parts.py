"""Where each byte of ``bench/storage.py``'s workload goes, per table, on both databases (issue 36):
the figures behind ``monitor/store/README.md``'s "Where each byte goes".

SQLite: ``dbstat`` per table and index (pages, payload, unused bytes in used pages) and the free
pages. PostgreSQL: per table its heap, TOAST (with its index) and indexes, after VACUUM ANALYZE, and
``pgstattuple``'s live / dead / free bytes of the heap and of the TOAST table (space that VACUUM
keeps in the files for later writes).

    .venv/bin/python bench/storage_parts.py            # the issue's workload (8 x 64 x 2,000), ~5 min
    .venv/bin/python bench/storage_parts.py --quick    # 2 x 4 x 1,100 steps
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import create_engine, text

from bench import ingest
from bench.storage import FIXTURE, free, post, runs_of
from bench.storage_codecs import fixture, synthetic

_INDEXES = text(
    "SELECT c.relname, pg_relation_size(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
    "WHERE i.indrelid = CAST(:r AS oid)"
)
_FORKS = text("SELECT pg_relation_size(:r, 'main'), pg_relation_size(:r, 'fsm'), pg_relation_size(:r, 'vm')")
_TABLES = "SELECT c.oid, c.relname, c.reltoastrelid FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid"


def sqlite_parts(url: str) -> list[tuple[str, int, int, int]]:
    """(table or index, bytes in pages, payload bytes, unused bytes) and ('<free pages>', bytes, 0, 0)."""
    con = sqlite3.connect(url.removeprefix("sqlite:///"))
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    rows = con.execute(
        "SELECT name, sum(pgsize), sum(payload), sum(unused) FROM dbstat GROUP BY name ORDER BY 2 DESC"
    ).fetchall()
    con.close()
    return [(str(n), int(a), int(b), int(c)) for n, a, b, c in rows] + [("<free pages>", free(url), 0, 0)]


def pg_parts(url: str) -> list[tuple[str, int, int, int, int]]:
    """(relation, bytes, live tuple bytes, dead tuple bytes, free bytes) for every user table's heap, its
    TOAST table, their free space and visibility maps and its indexes; pgstattuple for heaps and TOAST
    tables."""
    ingest.vacuum(url)
    engine = create_engine(url)
    out = []
    with engine.begin() as c:
        c.execute(text("CREATE EXTENSION IF NOT EXISTS pgstattuple"))
        tables = c.execute(text(_TABLES)).all()
        for oid, name, toast in tables:
            for label, rel in ((name, oid), (f"{name} (toast)", toast)):
                if not rel:
                    continue
                size, fsm, vm = c.execute(_FORKS, {"r": rel}).one()
                for fork, pages in (("fsm", fsm), ("vm", vm)):  # the maps VACUUM makes: a few pages per table
                    if pages:  # kept by a table VACUUM emptied too
                        out.append((f"{label} ({fork})", int(pages), 0, 0, 0))
                if not size:
                    continue
                live, dead, free = c.execute(
                    text("SELECT tuple_len, dead_tuple_len, free_space FROM pgstattuple(CAST(:r AS oid))"), {"r": rel}
                ).one()
                out.append((label, int(size), int(live), int(dead), int(free)))
            for label, rel in ((name, oid), (f"{name} (toast)", toast)):
                for index, size in c.execute(_INDEXES, {"r": rel}) if rel else ():
                    out.append((f"{label} index {index}", int(size), 0, 0, 0))
    engine.dispose()
    return sorted(out, key=lambda r: -r[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 x 4 x 1,100 steps")
    ap.add_argument("--no-pg", action="store_true", help="SQLite only")
    ap.add_argument("--fixture", action="store_true", help="the real-hooks fixture's 13 runs instead")
    args = ap.parse_args(argv)
    ingest.BODY = "columns"
    ind, layers, steps = (2, 4, 1100) if args.quick else (8, 64, 2000)
    series = fixture(FIXTURE) if args.fixture else synthetic(36, ind, layers, steps, 1, 0.02, 0.02)
    n = sum(len(s["values"]) for s in series)
    runs = runs_of(series, "fixture" if args.fixture else "workload")
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/parts.db"
        ingest.fresh(url)
        post(url, runs)
        print(f"\nSQLite, {n:,} points: bytes per point by table or index (empty schema included)")
        print("| table / index | B/pt | payload B/pt | unused in its pages B/pt |\n|---|---|---|---|")
        parts = sqlite_parts(url)
        for name, size, payload, unused in parts:
            if size >= n // 100 or name == "<free pages>":
                print(f"| {name} | {size / n:.3f} | {payload / n:.3f} | {unused / n:.3f} |")
        print(f"| **all** | {sum(p[1] for p in parts) / n:.3f} | | |")
    if args.no_pg:
        return 0
    with ingest.pg_database() as url:
        ingest.fresh(url)
        post(url, runs)
        print(f"\nPostgreSQL, {n:,} points: bytes per point by relation, after VACUUM ANALYZE")
        print("| relation | B/pt | live B/pt | dead B/pt | free B/pt |\n|---|---|---|---|---|")
        rels = pg_parts(url)
        for name, size, live, dead, free in rels:
            if size >= n // 100:
                print(f"| {name} | {size / n:.3f} | {live / n:.3f} | {dead / n:.3f} | {free / n:.3f} |")
        print(f"| **all** | {sum(r[1] for r in rels) / n:.3f} | | | |")
        maps = [r for r in rels if r[0].endswith(("(fsm)", "(vm)"))]
        owners, total = len({r[0].rsplit(" (", 1)[0] for r in maps}), sum(r[1] for r in maps)
        print(f"of which the free space and visibility maps of {owners} relations: {total / n:.3f} B/pt "
              f"({total // 1024} KB, the same for any number of points: a fixed cost of the database)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
