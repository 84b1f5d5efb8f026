"""Ingestion and read benchmark of the monitoring service. Prints one line per figure.

1. points/s through the HTTP API (``hyperwatch serve`` as its own process on localhost, one keep-alive
   http.client connection, not httpx (see ``http_rate``), sending batches of the hooks wire format
   encoded beforehand) into SQLite and into PostgreSQL,
   beside the raw database's floor for the same rows at the same transaction granularity (SQLite:
   executemany; PostgreSQL: COPY; one transaction per step for 1-step batches, one in all for
   4,096-point batches), as ratios against the targets of issue 16, and the bytes per point on disk
   after a checkpoint (SQLite) or VACUUM (PostgreSQL). Workload: 8 indicators x 64 layers per step.
2. latency of a 2,000-bucket downsampled read of one series of 10^7 points (SQLite and PostgreSQL),
   stored as the store keeps it (packed chunks, rollups, an open tail), through the store and
   through HTTP, beside the time of a plain full scan of the series' chunk rows.

    .venv/bin/python bench/ingest.py                       # 100 steps, 3 repeats, both databases
    .venv/bin/python bench/ingest.py --full --repeats 1    # 1,024,000 points: the issue's workload
    .venv/bin/python bench/ingest.py --steps 50 --series-points 1000000 --no-pg

The targets are set for the issue's workload (``--full``). The default, 51,200 points, is a quick
check where fixed costs weigh more: the raw SQLite floor writes into a table of a few pages per
series (1.7 ms a step against ~4.5 at a million points), and the empty schema and one chunk's worth
of hot points per series are a larger part of each point's bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import math
import sqlite3
import statistics
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import text

from bench.service_process import serve_process
from hyperwatch.hooks.schema import new_batch_id
from hyperwatch.monitor.store import SqlStore, migrate, segcodec
from hyperwatch.monitor.store.chunks import CHUNK_COLUMNS
from hyperwatch.monitor.store.compact import boundary
from hyperwatch.monitor.store.models import CHUNK_STEPS, SEGMENT_CHUNKS
from hyperwatch.monitor.store.rollups import seal_rollups

REPO = Path(__file__).resolve().parents[1]

TOKEN = "bench-token-0123456789abcdef"
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
# name -> typical level of the indicator (values stay far from the detectors' thresholds); 8 x 64 layers
NAMES = {
    "attention_z": 40.0,
    "router_z": 20.0,
    "attention_rms": 0.5,
    "mlp_rms": 0.5,
    "max_vio": 0.3,
    "weight_norm": 1.0,
    "update_ratio": 0.01,
    "aux_loss": 0.1,
}
LAYERS = 64


def serve(url: str) -> contextlib.AbstractContextManager[str]:
    """``hyperwatch serve`` as its own process (the client's work never shares the service's GIL)."""
    return serve_process(url, TOKEN, timeout=600.0)  # a loaded 2-core machine starts it slowly


Row = tuple[str, int, int, float]


def rows(steps: int, layers: int = LAYERS) -> list[Row]:
    """(name, layer, step, value) in logging order: every name x layer at each step (512 per step)."""
    return [
        (name, layer, step, level * (1.0 + 0.1 * math.sin(step * 0.01 + layer)))
        for step in range(steps)
        for name, level in NAMES.items()
        for layer in range(layers)
    ]


def chunks(data: list[Row], size: int) -> list[list[Row]]:
    return [data[i : i + size] for i in range(0, len(data), size)]


BODY = "json"  # --body: how the batches travel (JSON, or the columns body the hooks' sink sends)


def encode(part: list[Row], run: str) -> tuple[bytes, str]:
    if BODY == "columns":
        from hyperwatch.hooks.columns import COLUMNS_MEDIA_TYPE, PointColumns, encode_body

        cols = PointColumns.build([r[0] for r in part], [r[2] for r in part], [r[3] for r in part],
                                  [r[1] for r in part], [r[2] * 4096 for r in part])  # fmt: skip
        return encode_body(new_batch_id(run), run, cols), COLUMNS_MEDIA_TYPE
    pts = [{"name": n, "layer": la, "step": s, "tokens": s * 4096, "value": v} for n, la, s, v in part]
    return json.dumps({"batch_id": new_batch_id(run), "run": run, "points": pts}).encode(), "application/json"


def http_rate(base: str, data: list[Row], batch: int, run: str) -> float:
    """Points/s posting ``data`` in batches of ``batch`` over one keep-alive ``http.client`` connection.

    Not httpx: bench/http_overhead.py measured an httpx.Client ~0.45 ms per 512-point batch slower
    than a plain http.client connection to the same service (issue 16), client-side time that is
    not the service's. (The hooks' own client, urllib with a connection per request, costs about as
    much as httpx; with merged batches the sink sends far fewer requests than steps.)"""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    url = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=120)

    def post(path: str, body: bytes, kind: str) -> None:
        conn.request("POST", path, body, headers | {"Content-Type": kind})
        resp = conn.getresponse()
        answer = resp.read()
        if not 200 <= resp.status < 300:
            raise RuntimeError(f"POST {path}: HTTP {resp.status} {answer[:500]!r}")

    try:
        post("/api/v1/runs", json.dumps({"name": run}).encode(), "application/json")
        # encoded before the clock starts: the figure is the service's, not the client's
        bodies = [encode(part, run) for part in chunks(data, batch)]
        t0 = time.perf_counter()
        for body, kind in bodies:
            post("/api/v1/points", body, kind)
        return len(data) / (time.perf_counter() - t0)
    finally:
        conn.close()


_RAW_RUN_SQL = (
    "INSERT INTO runs (id, project_id, name, status, config, summary, export_layers, created_at, updated_at) "
    "VALUES ({rid}, 99, 'raw{rid}', 'running', '{{}}', '{{}}', {false}, {now}, {now})"
)


def raw_sqlite_rate(path: str, data: list[Row], per_commit: int, rid: int) -> float:
    """The floor: one prepared INSERT stepped over the rows, a commit every ``per_commit`` rows."""
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    ids = {n: i + 1 for i, n in enumerate(NAMES)}
    con.execute("INSERT OR IGNORE INTO projects (id, name, created_at) VALUES (99, 'raw', '2025-01-01')")
    con.execute(_RAW_RUN_SQL.format(rid=rid, false=0, now="'2025-01-01'"))
    con.commit()
    t0 = time.perf_counter()
    for part in chunks(data, per_commit):
        con.executemany(
            "INSERT INTO metric_points (run_id, name_id, layer, step, tokens, value) VALUES (?, ?, ?, ?, ?, ?)",
            [(rid, ids[n], la, s, s * 4096, v) for n, la, s, v in part],
        )
        con.commit()
    rate = len(data) / (time.perf_counter() - t0)
    con.close()
    return rate


def raw_pg_rate(dsn: str, data: list[Row], per_commit: int, rid: int) -> float:
    """The floor: COPY of the rows, a commit every ``per_commit`` rows."""
    import psycopg

    ids = {n: i + 1 for i, n in enumerate(NAMES)}
    with psycopg.connect(dsn) as con:
        con.execute("INSERT INTO projects (id, name, created_at) VALUES (99, 'raw', now()) ON CONFLICT DO NOTHING")
        con.execute(_RAW_RUN_SQL.format(rid=rid, false="false", now="now()"))
        con.commit()
        t0 = time.perf_counter()
        for part in chunks(data, per_commit):
            with (
                con.cursor() as cur,
                cur.copy("COPY metric_points (run_id, name_id, layer, step, tokens, value) FROM STDIN") as copy,
            ):
                for n, la, s, v in part:
                    copy.write_row((rid, ids[n], la, s, s * 4096, v))
            con.commit()
        return len(data) / (time.perf_counter() - t0)


def seed_names(url: str) -> None:
    """Intern the names in a fixed order (ids 1..8) so the raw floors write the same keys."""
    store = SqlStore(url)
    with store.engine.begin() as conn:
        for n in NAMES:
            store._name_id(conn, n)
    store.close()


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
    seed_names(url)


def vacuum(url: str) -> None:
    from sqlalchemy import create_engine

    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as c:
        c.execute(text("VACUUM (ANALYZE)"))
    engine.dispose()


def bytes_on_disk(url: str) -> int:
    """The database's size after what a user would run: a WAL checkpoint (SQLite: the file), VACUUM
    (ANALYZE) (PostgreSQL: ``pg_total_relation_size`` of every user table, i.e. heap + indexes + TOAST)."""
    from sqlalchemy import create_engine

    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        con = sqlite3.connect(path)
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.close()
        return Path(path).stat().st_size
    vacuum(url)
    engine = create_engine(url)
    with engine.connect() as c:
        size = c.execute(text("SELECT sum(pg_total_relation_size(relid)) FROM pg_stat_user_tables")).scalar()
    engine.dispose()
    return int(size or 0)


def ingest_figures(label: str, data: list[Row], repeats: int) -> None:
    """The targets, interleaved: HTTP at one step (512 points) per batch vs the floor with one
    transaction per step, HTTP at 4,096-point batches vs the one-transaction floor, bytes per point."""
    step_batch, big_batch = len(NAMES) * LAYERS, 4096
    figures: dict[str, list[float]] = {k: [] for k in ("api1", "raw1", "api8", "rawall", "bpp1", "bpp8")}
    empty: list[int] = []  # the migrated, empty database: a fixed cost, not a per-point one
    for rep in range(repeats):
        with contextlib.ExitStack() as stack:
            if label == "sqlite":
                tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
                urls = [f"sqlite:///{tmp / f'db{i}.db'}" for i in range(3)]
            else:
                urls = [stack.enter_context(pg_database()) for _ in range(3)]
            for u in urls:
                fresh(u)
            empty.append(bytes_on_disk(urls[0]))
            with serve(urls[0]) as base:
                figures["api1"].append(http_rate(base, data, step_batch, f"step{rep}"))
            figures["bpp1"].append(bytes_on_disk(urls[0]) / len(data))
            with serve(urls[1]) as base:
                figures["api8"].append(http_rate(base, data, big_batch, f"big{rep}"))
            figures["bpp8"].append(bytes_on_disk(urls[1]) / len(data))
            raw = raw_sqlite_rate if label == "sqlite" else raw_pg_rate
            target = urls[2].removeprefix("sqlite:///") if label == "sqlite" else urls[2].replace("+psycopg", "")
            figures["raw1"].append(raw(target, data, step_batch, 101))
            figures["rawall"].append(raw(target, data, len(data), 102))
    med = {k: statistics.median(v) for k, v in figures.items()}
    how = "executemany" if label == "sqlite" else "COPY"
    limit = 32 if label == "sqlite" else 40
    r1, r8 = med["api1"] / med["raw1"], med["api8"] / med["rawall"]
    print(
        f"ingest {label} ({len(data):,} points, {BODY} bodies, median of {repeats}):\n"
        f"  1 step/batch:  HTTP {med['api1']:,.0f} pts/s vs raw {how}, 1 tx/step {med['raw1']:,.0f} pts/s "
        f"= {r1:.2f}x (target >= 0.5: {'MET' if r1 >= 0.5 else 'NOT MET'})\n"
        f"  4096/batch:    HTTP {med['api8']:,.0f} pts/s vs raw {how}, 1 tx {med['rawall']:,.0f} pts/s "
        f"= {r8:.2f}x (target >= 0.3: {'MET' if r8 >= 0.3 else 'NOT MET'})\n"
        f"  bytes/point on disk: {med['bpp1']:.1f} (1 step/batch), {med['bpp8']:.1f} (4096/batch) "
        f"(target <= {limit}: {'MET' if max(med['bpp1'], med['bpp8']) <= limit else 'NOT MET'}); "
        f"of which the empty schema {statistics.median(empty) / len(data):.1f}"
    )


def load_series(store: SqlStore, run_id: int, name_id: int, n: int) -> None:
    """``n`` points of one series stored as the store keeps them (issue 36: a segment per 1,024 sealed
    steps with its level-2 rollup row, the open range as a partial segment, the tail as hot rows),
    its latest step; a spike every 2,500,003 steps. Level 3 is left to the caller (``seal_rollups``)."""
    pg = store.engine.dialect.name == "postgresql"
    edge = boundary(n - 1)
    seg = SEGMENT_CHUNKS * CHUNK_STEPS

    def values(a: int, b: int) -> np.ndarray:
        s = np.arange(a, b, dtype=np.int64)
        return 100.0 + np.sin(s * 1e-3) + np.where(s % 2_500_003 == 7, 5e3, 0.0)

    def seg_rows(lo: int, hi: int) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...] | None]]:
        for a in range(lo, hi, seg):
            b = min(a + seg, hi)
            steps = np.arange(a, b, dtype=np.int64)
            tokens, vals = steps * 4096, values(a, b)
            blob = segcodec.encode(a, (b - a) // CHUNK_STEPS, steps, tokens, vals)
            i, j = int(np.argmin(vals)), int(np.argmax(vals))
            row = (run_id, name_id, 0, a // CHUNK_STEPS, 0, blob, a + i, float(vals[i]), a + j, float(vals[j]))
            rollup = None
            if b - a == seg:
                rollup = (run_id, name_id, 0, 2, a // seg, seg, a + i, (a + i) * 4096, float(vals[i]),
                          a + j, (a + j) * 4096, float(vals[j]))  # fmt: skip
            yield row, rollup

    step = 1_048_576
    mark = "%s" if pg else "?"
    with store.engine.begin() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        for lo in range(0, edge, step):
            made = list(seg_rows(lo, min(edge, lo + step)))
            rollups = [r for _c, r in made if r is not None]
            if rollups:
                conn.exec_driver_sql(f"INSERT INTO metric_rollups VALUES ({', '.join([mark] * 12)})", rollups)
            if not pg:
                sql = f"INSERT INTO metric_chunks ({', '.join(CHUNK_COLUMNS)}) VALUES ({', '.join([mark] * 10)})"
                conn.exec_driver_sql(sql, [c for c, _r in made])
                continue
            with raw.cursor() as cur, cur.copy(f"COPY metric_chunks ({', '.join(CHUNK_COLUMNS)}) FROM STDIN") as copy:  # type: ignore[attr-defined]
                for row, _r in made:
                    copy.write_row(row)
        tail = [(run_id, name_id, 0, s, s * 4096, v) for s, v in zip(range(edge, n), values(edge, n).tolist())]
        if tail:
            conn.exec_driver_sql(f"INSERT INTO metric_points VALUES ({', '.join([mark] * 6)})", tail)
        conn.exec_driver_sql(
            f"INSERT INTO series_latest VALUES ({mark}, {mark}, 0, {mark}, 100.0)", (run_id, name_id, n - 1)
        )


def read_figures(label: str, url: str, n: int, repeats: int) -> None:
    fresh(url)
    store = SqlStore(url)
    run, _ = store.upsert_run("default", "big", {})
    with store.engine.begin() as conn:
        nid = store._name_id(conn, "attention_z")
    assert nid is not None
    t0 = time.perf_counter()
    load_series(store, run.id, nid, n)
    load = time.perf_counter() - t0
    t0 = time.perf_counter()
    chunk = 1_000_000
    with store.engine.begin() as conn:
        before: int | None = None
        for lo in range(0, n, chunk):
            after = min(n, lo + chunk) - 1  # seal as if the points had come in chunks, as ingest would
            seal_rollups(conn, run.id, {(nid, 0): before}, {(nid, 0): after}, {}, from_level=3)
            before = after
    roll = time.perf_counter() - t0
    if label == "postgresql":
        vacuum(url)  # what autovacuum would have done by the time anyone reads a 10^7-point series
    print(f"read setup ({label}): {n:,} points loaded in {load:.1f} s, rollups built in {roll:.1f} s")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        s = store.series(run.id, "attention_z", 0, 2000, None, None)
        times.append(time.perf_counter() - t0)
    spikes = sum(1 for p in s.points if p.value > 1000)
    with store.engine.connect() as conn:
        t0 = time.perf_counter()
        for table in ("metric_chunks", "metric_points"):
            sql = f"SELECT count(*) FROM {table} WHERE run_id = :r AND name_id = :n AND layer = 0"
            conn.execute(text(sql), {"r": run.id, "n": nid}).one()
        scan = time.perf_counter() - t0
    med = statistics.median(times)
    print(
        f"read {label}: 2,000-bucket series of {n:,} points in {med * 1000:.0f} ms (median of {repeats}; "
        f"target <= 100: {'MET' if med <= 0.1 else 'NOT MET'}) vs a full scan of the series' rows "
        f"{scan * 1000:.0f} ms = {med / scan:.3f}x; {len(s.points)} points returned, "
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
    print(f"read {label} over HTTP: {statistics.median(times) * 1000:.0f} ms (median of {repeats}, incl. JSON)")
    store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100, help="steps of 512 points ingested (default 100)")
    ap.add_argument("--full", action="store_true", help="the issue's workload: 2,000 steps = 1,024,000 points")
    ap.add_argument("--series-points", type=int, default=10_000_000, help="points of the read series (default 10^7)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-pg", action="store_true", help="skip PostgreSQL")
    ap.add_argument("--no-sqlite", action="store_true", help="skip SQLite")
    ap.add_argument("--no-read", action="store_true", help="skip the read benchmark")
    ap.add_argument("--no-ingest", action="store_true", help="skip the ingest benchmark")
    ap.add_argument("--body", choices=("json", "columns"), default="json", help="HTTP body (default json)")
    args = ap.parse_args()
    global BODY
    BODY = args.body
    data = rows(2000 if args.full else args.steps)
    if not args.no_sqlite and not args.no_ingest:
        ingest_figures("sqlite", data, args.repeats)
    if not args.no_pg and not args.no_ingest:
        ingest_figures("postgresql", data, args.repeats)
    if not args.no_read:
        if not args.no_sqlite:
            with tempfile.TemporaryDirectory() as d:
                read_figures("sqlite", f"sqlite:///{Path(d) / 'read.db'}", args.series_points, args.repeats)
        if not args.no_pg:
            with pg_database() as url:
                read_figures("postgresql", url, args.series_points, args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
