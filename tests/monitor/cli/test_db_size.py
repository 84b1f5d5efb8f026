"""``hyperwatch db size`` (issue 36): where a database's bytes are and what a point costs, on both
databases, through the real command: the points the service accepted (a resent batch once), every
table's bytes adding up to the total, and a clear refusal where there is nothing to measure."""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

from hyperwatch.hooks.schema import Batch, Point
from hyperwatch.monitor.store import SqlStore, migrate

REPO = Path(__file__).resolve().parents[3]


def _db(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "hyperwatch", "db", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_size_counts_every_point_once_and_every_byte(db_url: str) -> None:
    store = SqlStore(db_url)
    try:
        migrate.upgrade(store.engine)
        for name in ("a", "b"):
            run, _ = store.upsert_run("default", name, {})
            for s0 in range(0, 1200, 100):
                pts = [
                    Point("attention_z", s, math.nan if s == 7 else 1.0 + s % 9, layer=la)
                    for s in range(s0, s0 + 100)
                    for la in range(4)
                ]
                # run a: ids of a client of one's own (a row each); run b: the hooks' (ranges, revision 0019)
                bid = uuid.uuid4().hex if name == "a" else Batch(name, []).batch_id
                store.ingest(run.id, bid, pts)
                assert store.ingest(run.id, bid, pts).duplicate  # a retry: stored and counted once
    finally:
        store.close()
    done = _db("size", "--db", db_url, "--json")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["points"] == 2 * 1200 * 4 and got["runs"] == 2
    tables = {t["table"]: t for t in got["tables"]}
    assert tables["metric_chunks"]["bytes"] > 0 and "ingested_batches" in tables
    assert all(0 <= t["index_bytes"] <= t["bytes"] for t in tables.values())
    used = sum(t["bytes"] for t in tables.values())
    if got["dialect"] == "sqlite":  # every page is a table's, an index's or free
        assert used + got["free_bytes"] == got["total_bytes"]
    else:
        assert used == got["total_bytes"] and got["free_bytes"] is None
    assert got["bytes_per_point"] == got["total_bytes"] / got["points"]
    text_out = _db("size", "--db", db_url)
    assert text_out.returncode == 0, text_out.stderr
    assert f"points received: {2 * 1200 * 4:,} in 2 runs" in text_out.stdout and "metric_chunks" in text_out.stdout


def test_size_of_a_file_without_the_schema_says_so(tmp_path: Path) -> None:
    con = sqlite3.connect(tmp_path / "other.db")
    con.execute("CREATE TABLE other (x INTEGER)")
    con.close()
    done = _db("size", "--db", f"sqlite:///{tmp_path}/other.db")
    assert done.returncode == 0, done.stderr
    assert "points received: unknown" in done.stdout and "hyperwatch db upgrade" in done.stdout


def test_size_refuses_what_it_cannot_measure(tmp_path: Path) -> None:
    missing = _db("size", "--db", f"sqlite:///{tmp_path}/nothing.db")
    assert missing.returncode == 2 and "no SQLite file" in missing.stderr
    assert not (tmp_path / "nothing.db").exists()  # measuring creates nothing
    wrong = _db("current", "--json", "--db", f"sqlite:///{tmp_path}/nothing.db")
    assert wrong.returncode == 2 and "--json goes with size only" in wrong.stderr
