"""Ingestion and read benchmark of the monitoring service. Prints one line per figure.

1. points/s through the HTTP API (``hyperwatch serve`` as its own process on localhost, an httpx
   client sending batches of the hooks wire format encoded beforehand) into SQLite and into PostgreSQL,
   beside the raw database's own bulk-insert rate for the same rows (SQLite: executemany in one
   transaction; PostgreSQL: COPY), as a ratio.
2. latency of a 2,000-bucket downsampled read of one series of 10^7 points (SQLite), through the
   store and through HTTP, beside the time of a plain full scan of the series' points.

    .venv/bin/python bench/ingest.py                       # defaults below
    .venv/bin/python bench/ingest.py --points 100000 --series-points 1000000 --no-pg
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.service_process import serve_process
from hyperwatch.monitor.store import SqlStore, migrate
from hyperwatch.monitor.store.rollups import seal_rollups

REPO = Path(__file__).resolve().parents[1]

TOKEN = "bench-token-0123456789abcdef"
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
# name -> typical level of the indicator (values stay far from the detectors' thresholds)
NAMES = {"attention_z": 40.0, "router_z": 20.0, "attention_rms": 0.5, "mlp_rms": 0.5, "max_vio": 0.3}


def serve(url: str) -> contextlib.AbstractContextManager[str]:
    """``hyperwatch serve`` as its own process (the client's work never shares the service's GIL)."""
    return serve_process(url, TOKEN)


def rows(n: int, layers: int = 16) -> list[tuple[str, int, int, float]]:
    """(name, layer, step, value) in logging order: every name x layer at each step."""
    out: list[tuple[str, int, int, float]] = []
    step = 0
    while len(out) < n:
        for name, level in NAMES.items():
            for layer in range(layers):
                out.append((name, layer, step, level * (1.0 + 0.1 * math.sin(step * 0.01 + layer))))
        step += 1
    return out[:n]


def http_rate(base: str, data: list[tuple[str, int, int, float]], batch: int) -> float:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=base, headers=headers, timeout=120) as c:
        c.post("/api/v1/runs", json={"name": "bench"}).raise_for_status()
        bodies = []  # encoded before the clock starts: the figure is the service's, not the client's
        for i in range(0, len(data), batch):
            pts = [
                {"name": n, "layer": la, "step": s, "tokens": s * 4096, "value": v}
                for n, la, s, v in data[i : i + batch]
            ]
            bodies.append(json.dumps({"batch_id": uuid.uuid4().hex, "run": "bench", "points": pts}).encode())
        t0 = time.perf_counter()
        for body in bodies:
            c.post("/api/v1/points", content=body, headers={"Content-Type": "application/json"}).raise_for_status()
        return len(data) / (time.perf_counter() - t0)


def raw_sqlite_rate(path: str, data: list[tuple[str, int, int, float]]) -> float:
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    ids = {n: i + 1 for i, n in enumerate(NAMES)}
    con.execute("INSERT INTO projects (id, name, created_at) VALUES (99, 'raw', '2025-01-01')")
    con.execute(
        "INSERT INTO runs (id, project_id, name, status, config, summary, export_layers, created_at, updated_at) "
        "VALUES (99, 99, 'raw', 'running', '{}', '{}', 0, '2025-01-01', '2025-01-01')"
    )
    t0 = time.perf_counter()
    con.executemany(
        "INSERT INTO metric_points (run_id, name_id, layer, step, tokens, value) VALUES (99, ?, ?, ?, ?, ?)",
        [(ids[n], la, s, s * 4096, v) for n, la, s, v in data],
    )
    con.commit()
    rate = len(data) / (time.perf_counter() - t0)
    con.close()
    return rate


def raw_pg_rate(dsn: str, data: list[tuple[str, int, int, float]]) -> float:
    import psycopg

    ids = {n: i + 1 for i, n in enumerate(NAMES)}
    with psycopg.connect(dsn) as con:
        con.execute("INSERT INTO projects (id, name, created_at) VALUES (99, 'raw', now())")
        con.execute(
            "INSERT INTO runs (id, project_id, name, status, config, summary, export_layers, created_at, updated_at) "
            "VALUES (99, 99, 'raw', 'running', '{}', '{}', false, now(), now())"
        )
        con.commit()
        t0 = time.perf_counter()
        with (
            con.cursor() as cur,
            cur.copy("COPY metric_points (run_id, name_id, layer, step, tokens, value) FROM STDIN") as copy,
        ):
            for n, la, s, v in data:
                copy.write_row((99, ids[n], la, s, s * 4096, v))
        con.commit()
        return len(data) / (time.perf_counter() - t0)


@contextlib.contextmanager
def pg_database() -> Iterator[str]:
    from sqlalchemy import create_engine, text

    name = f"hw_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_ADMIN.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def fresh(url: str) -> None:
    store = SqlStore(url)
    migrate.upgrade(store.engine)
    store.close()


def ingest_figures(label: str, url: str, raw_url: str, data: list[tuple[str, int, int, float]], batch: int) -> None:
    fresh(url)
    fresh(raw_url)
    with serve(url) as base:
        api = http_rate(base, data, batch)
    if label == "sqlite":
        raw = raw_sqlite_rate(raw_url.removeprefix("sqlite:///"), data)
        how = "executemany"
    else:
        raw = raw_pg_rate(raw_url.replace("+psycopg", ""), data)
        how = "COPY"
    print(
        f"ingest {label}: HTTP API {api:,.0f} points/s vs raw {how} {raw:,.0f} points/s "
        f"= {api / raw:.3f}x of raw ({len(data):,} points, batches of {batch})"
    )


def read_figures(tmp: Path, n: int, repeats: int) -> None:
    path = tmp / "read.db"
    url = f"sqlite:///{path}"
    fresh(url)
    store = SqlStore(url)
    run, _ = store.upsert_run("default", "big", {})
    store.ingest(run.id, "seed-batch", [])  # registers nothing; names are interned below
    with store.engine.begin() as conn:
        nid = store._name_id(conn, "attention_z")
    assert nid is not None
    con = sqlite3.connect(path)
    t0 = time.perf_counter()
    chunk = 1_000_000
    for lo in range(0, n, chunk):
        con.executemany(
            "INSERT INTO metric_points VALUES (?, ?, 0, ?, ?, ?)",
            (
                (run.id, nid, s, s * 4096, 100.0 + math.sin(s * 1e-3) + (5e3 if s % 2_500_003 == 7 else 0.0))
                for s in range(lo, min(n, lo + chunk))
            ),
        )
    con.execute("INSERT INTO series_latest VALUES (?, ?, 0, ?, 100.0)", (run.id, nid, n - 1))
    con.commit()
    con.close()
    load = time.perf_counter() - t0
    t0 = time.perf_counter()
    with store.engine.begin() as conn:
        before: int | None = None
        for lo in range(0, n, chunk):
            after = min(n, lo + chunk) - 1  # seal as if the points had come in chunks, as ingest would
            seal_rollups(conn, run.id, {(nid, 0): before}, {(nid, 0): after}, {})
            before = after
    roll = time.perf_counter() - t0
    print(f"read setup: {n:,} points loaded raw in {load:.1f} s, rollups built in {roll:.1f} s")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        s = store.series(run.id, "attention_z", 0, 2000, None, None)
        times.append(time.perf_counter() - t0)
    spikes = sum(1 for p in s.points if p.value > 1000)
    con = sqlite3.connect(path)
    t0 = time.perf_counter()
    con.execute(
        "SELECT count(*), max(value) FROM metric_points WHERE run_id=? AND name_id=? AND layer=0", (run.id, nid)
    ).fetchone()
    scan = time.perf_counter() - t0
    con.close()
    med = statistics.median(times)
    print(
        f"read sqlite: 2,000-bucket series of {n:,} points in {med * 1000:.0f} ms (median of {repeats}) vs a "
        f"full scan of the series {scan * 1000:.0f} ms = {med / scan:.3f}x; {len(s.points)} points returned, "
        f"{spikes} of {len(range(7, n, 2_500_003))} spikes kept"
    )
    with serve(url) as base, httpx.Client(base_url=base, timeout=60) as c:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            c.get(
                f"/api/v1/runs/{run.id}/series", params={"name": "attention_z", "layer": 0, "buckets": 2000}
            ).raise_for_status()
            times.append(time.perf_counter() - t0)
    print(f"read sqlite over HTTP: {statistics.median(times) * 1000:.0f} ms (median of {repeats}, incl. JSON)")
    store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=200_000, help="points ingested per database (default 200k)")
    ap.add_argument("--batch", type=int, default=5_000, help="points per HTTP batch (default 5000)")
    ap.add_argument("--series-points", type=int, default=10_000_000, help="points of the read series (default 10^7)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-pg", action="store_true", help="skip PostgreSQL")
    ap.add_argument("--no-read", action="store_true", help="skip the read benchmark")
    args = ap.parse_args()
    data = rows(args.points)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        ingest_figures("sqlite", f"sqlite:///{tmp / 'api.db'}", f"sqlite:///{tmp / 'raw.db'}", data, args.batch)
        if not args.no_pg:
            with pg_database() as api_url, pg_database() as raw_url:
                ingest_figures("postgresql", api_url, raw_url, data, args.batch)
        if not args.no_read:
            read_figures(tmp, args.series_points, args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
