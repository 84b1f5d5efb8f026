"""Sustained ingestion load against the real service, from a separate process. One line per figure.

The service runs as its own process (``hyperwatch serve``, started here on a free localhost port
over a fresh SQLite file and/or a fresh PostgreSQL database, or an existing one given with
``--server``). This process offers an open-loop load: request ``i`` is due at ``t0 + i / rate``,
each a batch of ``--points`` points with its own steps, sent by ``--workers`` threads over
keep-alive connections, at most ``--workers`` in flight (when the service is slower than the
rate, the rest is not offered and is counted as such); latency is measured per request, from send
to answer. At the end the
database is counted: every point must be stored exactly once (rows == points acknowledged, and
the stored batches' point counts sum to the same number).

    .venv/bin/python bench/load.py                                  # 200 req/s x 1,000 points, 10 s
    .venv/bin/python bench/load.py --duration 60                    # the full figure of issue #8
    .venv/bin/python bench/load.py --db sqlite --rate 20 --duration 3 --json   # a short burst
    .venv/bin/python bench/load.py --server http://127.0.0.1:8000 --token T    # an existing service

Only localhost traffic; every loop is bounded by ``--duration`` (plus ``--drain`` seconds).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.service_process import serve_process  # noqa: E402
from hyperwatch.monitor.store import chunks  # noqa: E402

TOKEN = "bench-load-token-0123456789abcdef"
PG_ADMIN = os.environ.get("HYPERWATCH_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
LAYERS = 64


@dataclass
class Result:
    target_rate: float
    duration: float
    sent: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    elapsed: float = 0.0
    points_acked: int = 0

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return math.nan
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))]


@contextmanager
def database(kind: str) -> Iterator[str]:
    """A fresh migrated database: a SQLite file in a temporary folder, or a new PostgreSQL database."""
    from hyperwatch.monitor.store import SqlStore, migrate

    if kind == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{tmp}/load.db"
            store = SqlStore(url)
            migrate.upgrade(store.engine)
            store.close()
            yield url
        return
    name = f"hw_load_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN.rsplit("/", 1)[0] + "/" + name
    try:
        store = SqlStore(url)
        migrate.upgrade(store.engine)
        store.close()
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def service(db_url: str) -> AbstractContextManager[str]:
    """``hyperwatch serve`` as a child process on a free localhost port."""
    return serve_process(db_url, TOKEN)


def body(run: str, i: int, points: int) -> bytes:
    """Request ``i``: ``points`` attention_z values over LAYERS layers at steps of its own."""
    per = -(-points // LAYERS)
    pts = ",".join(
        f'{{"name":"attention_z","layer":{j % LAYERS},"step":{i * per + j // LAYERS},"value":{40.0 + (j % 7) * 0.1}}}'
        for j in range(points)
    )
    return f'{{"batch_id":"{uuid.uuid4().hex}","run":"{run}","points":[{pts}]}}'.encode()


def offer_load(url: str, token: str, run: str, rate: float, duration: float, points: int, workers: int) -> Result:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    r = httpx.post(url + "/api/v1/runs", json={"name": run}, headers=headers, timeout=30)
    if r.status_code not in (200, 201):
        raise RuntimeError(f"creating run {run}: HTTP {r.status_code} {r.text[:200]}")
    total = int(rate * duration)
    res = Result(rate, duration)
    jobs: queue.Queue[int | None] = queue.Queue(maxsize=workers)
    lock = threading.Lock()

    def worker() -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=60) as c:
            while (i := jobs.get()) is not None:
                data = body(run, i, points)
                t = time.perf_counter()
                try:
                    resp = c.post("/api/v1/points", content=data)
                    kind = "ok" if resp.status_code in (200, 201) else f"HTTP {resp.status_code}"
                except httpx.HTTPError as exc:
                    kind = type(exc).__name__
                dt = time.perf_counter() - t
                with lock:
                    if kind == "ok":
                        res.ok += 1
                        res.points_acked += points
                        res.latencies.append(dt)
                    else:
                        res.errors[kind] = res.errors.get(kind, 0) + 1

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    end = t0 + duration
    for i in range(total):  # each request at its due time; at most `workers` in flight, none after `end`
        due = t0 + i / rate
        now = time.perf_counter()
        if due > now:
            time.sleep(due - now)
        try:
            jobs.put(i, timeout=max(0.0, end - time.perf_counter()))
        except queue.Full:
            break  # the service is saturated: the rest is not offered (reported as not_offered)
        res.sent += 1
    for _ in threads:
        jobs.put(None)
    for t in threads:
        t.join()
    res.elapsed = time.perf_counter() - t0
    return res


def count(db_url: str, run: str) -> tuple[int, int, int]:
    """(rows, distinct keys, sum of n_points of stored batches) of ``run``."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            rid = conn.execute(text("SELECT id FROM runs WHERE name = :n"), {"n": run}).scalar()
            keys = [p[1:4] for p in chunks.all_points(conn, rid)]  # hot rows and chunked points
            rows, distinct = len(keys), len(set(keys))
            ingested = conn.execute(
                text("SELECT COALESCE(SUM(n_points), 0) FROM ingested_batches WHERE run_id = :r"), {"r": rid}
            ).scalar()
    finally:
        engine.dispose()
    return int(rows), int(distinct), int(ingested or 0)


def report(label: str, res: Result, stored: tuple[int, int, int] | None, as_json: bool) -> dict[str, object]:
    achieved = res.ok / res.elapsed if res.elapsed else 0.0
    out: dict[str, object] = {
        "db": label,
        "target_rps": res.target_rate,
        "achieved_rps": round(achieved, 1),
        "points_per_s": round(achieved * (res.points_acked / res.ok if res.ok else 0)),
        "sent": res.sent,
        "not_offered": int(res.target_rate * res.duration) - res.sent,
        "ok": res.ok,
        "errors": sum(res.errors.values()),
        "error_kinds": res.errors,
        "p50_ms": round(res.percentile(0.50) * 1000, 1),
        "p99_ms": round(res.percentile(0.99) * 1000, 1),
        "elapsed_s": round(res.elapsed, 1),
        "points_acked": res.points_acked,
    }
    if stored is not None:
        out.update(rows=stored[0], distinct=stored[1], ingested=stored[2])
        out["exactly_once"] = stored[0] == stored[1] == stored[2] == res.points_acked
    if as_json:
        print(json.dumps(out))
    else:
        line = (
            f"load {label}: {out['achieved_rps']} req/s achieved of {res.target_rate:g} offered "
            f"({out['points_per_s']} points/s), p50 {out['p50_ms']} ms, p99 {out['p99_ms']} ms, "
            f"errors {out['errors']} {res.errors or ''}, {res.sent} requests in {out['elapsed_s']} s "
            f"({out['not_offered']} not offered: at most --workers in flight)"
        )
        if stored is not None:
            line += (
                f"; stored {stored[0]} rows for {res.points_acked} points acked (exactly once: {out['exactly_once']})"
            )
        print(line)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both", help="databases to start")
    p.add_argument("--server", help="an existing service's URL instead of starting one (no database count)")
    p.add_argument("--token", default=os.environ.get("HYPERWATCH_TOKEN", TOKEN), help="write token for --server")
    p.add_argument("--rate", type=float, default=200.0, help="requests per second offered (default 200)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of load (default 10; 60 for issue #8)")
    p.add_argument("--points", type=int, default=1000, help="points per request (default 1000)")
    p.add_argument("--workers", type=int, default=8, help="requests in flight at most (default 8)")
    p.add_argument("--json", action="store_true", help="one JSON object per database instead of text")
    args = p.parse_args(argv)
    for flag in ("rate", "duration", "points", "workers"):
        value = getattr(args, flag)
        if not value > 0:
            p.error(f"--{flag}: must be positive, got {value}")
    if args.points > 50_000:
        p.error("--points: at most 50000 per request (the service's batch limit)")
    if args.rate * args.duration > 1_000_000:
        p.error("--rate x --duration: at most 1,000,000 requests; shorten the run")
    if args.server:
        if not args.server.startswith(("http://127.0.0.1", "http://localhost", "http://[::1]")):
            p.error("--server: this benchmark only sends to localhost")
        res = offer_load(
            args.server, args.token, f"load-{uuid.uuid4().hex[:8]}", args.rate, args.duration, args.points, args.workers
        )
        report("server", res, None, args.json)
        return 0 if not res.errors else 1
    failed = False
    for kind in ["sqlite", "postgresql"] if args.db == "both" else [args.db]:
        with database(kind) as db_url, service(db_url) as url:
            run = f"load-{kind}"
            res = offer_load(url, TOKEN, run, args.rate, args.duration, args.points, args.workers)
            out = report(kind, res, count(db_url, run), args.json)
            failed |= bool(res.errors) or not out["exactly_once"]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
