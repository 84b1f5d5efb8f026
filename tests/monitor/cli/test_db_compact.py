"""``hyperwatch db compact`` (issue 36): a SQLite file made with 4 KB pages is rewritten at the store's
page size with every point intact and fewer bytes; a file in use is left untouched with a message
that says what to do; PostgreSQL and a missing file get a clear refusal."""

from __future__ import annotations

import math
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store import SqlStore, migrate
from hyperwatch.monitor.store.engine import SQLITE_PAGE_SIZE

REPO = Path(__file__).resolve().parents[3]


def _db(args: list[str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "hyperwatch", "db", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def old_sqlite_file(path: Path) -> list[tuple[int, float]]:
    """A store in a file made with 4 KB pages, as before SQLITE_PAGE_SIZE; the points it holds."""
    con = sqlite3.connect(path)
    con.execute("PRAGMA page_size=4096")
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE made_before (x INTEGER)")
    con.close()
    store = SqlStore(f"sqlite:///{path}")
    migrate.upgrade(store.engine)
    run, _ = store.upsert_run("default", "old", {})
    values = [math.nan if s == 7 else math.inf if s == 9 else math.exp((s % 97) / 13) for s in range(3000)]
    for layer in range(8):
        pts = [Point("attention_z", s, v, layer=layer) for s, v in enumerate(values)]
        store.ingest(run.id, uuid.uuid4().hex, pts)
    store.close()
    return list(enumerate(values))


def read_back(path: Path) -> list[tuple[int, float]]:
    store = SqlStore(f"sqlite:///{path}")
    run = next(r for r in store.list_runs() if r.name == "old")
    got = [(p.step, p.value) for p in store.series(run.id, "attention_z", 3, 10**6, None, None).points]
    store.close()
    return got


def same_points(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> bool:
    return len(a) == len(b) and all(
        x[0] == y[0] and (x[1] == y[1] or (math.isnan(x[1]) and math.isnan(y[1]))) for x, y in zip(a, b)
    )


def page_size(path: Path) -> int:
    con = sqlite3.connect(path)
    try:
        return int(con.execute("PRAGMA page_size").fetchone()[0])
    finally:
        con.close()


def test_compact_rewrites_an_old_file_at_the_storepage_size(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    sent = old_sqlite_file(path)
    wal = path.with_name("old.db-wal")
    before = path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    assert page_size(path) == 4096
    done = _db(["compact", "--db", f"sqlite:///{path}"])
    assert done.returncode == 0, done.stderr
    assert f"page size 4096 -> {SQLITE_PAGE_SIZE}" in done.stdout
    assert page_size(path) == SQLITE_PAGE_SIZE and path.stat().st_size < before
    assert same_points(read_back(path), sent)
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()


def test_compact_leaves_a_file_in_use_untouched(tmp_path: Path) -> None:
    path = tmp_path / "busy.db"
    sent = old_sqlite_file(path)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN")
    holder.execute("SELECT count(*) FROM metric_chunks").fetchone()  # a reader holds the file
    try:
        done = _db(["compact", "--db", f"sqlite:///{path}"])
    finally:
        holder.execute("COMMIT")
        holder.close()
    assert done.returncode == 1
    assert "in use" in done.stderr and "stop the service" in done.stderr and "nothing was changed" in done.stderr
    assert page_size(path) == 4096 and same_points(read_back(path), sent)


def test_compact_refuses_postgresql_and_a_missing_file(tmp_path: Path, pg_url: str) -> None:
    pg = _db(["compact", "--db", pg_url])
    assert pg.returncode == 2 and "PostgreSQL" in pg.stderr and "nothing to do" in pg.stderr
    missing = _db(["compact", "--db", f"sqlite:///{tmp_path}/nope.db"])
    assert missing.returncode == 2 and "no SQLite file" in missing.stderr
    assert not (tmp_path / "nope.db").exists()
