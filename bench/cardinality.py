"""A flood of distinct metric names against the real service (issue 37), and what it costs afterwards.

The service runs as its own process (``hyperwatch serve`` on a fresh SQLite file or PostgreSQL
database, default settings unless ``HYPERWATCH_MAX_*`` are set in the environment). Before and after
a flood of ``--batches`` x 4,096 new ``user.*`` names (250 x 4,096 = 1,024,000, the attack's), this
prints one line per figure: the service's RSS (now and peak), ``/metrics`` and a series-index read
(median of 5), and a one-point write's p50 and p95, alone and beside ``--readers`` threads reading
``/metrics`` and the series index in a loop. ``--spread`` sends each flood batch to a run of its own
(the per-run limit then stops nothing; the name limit does).

    .venv/bin/python bench/cardinality.py                      # both databases, the attack's flood
    .venv/bin/python bench/cardinality.py --db sqlite --batches 20
    .venv/bin/python bench/cardinality.py --spread

Targets (issue 37): RSS <= 1 GB, /metrics and a series-index read <= 1 s, writes' p50 within 2x.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.load import database  # noqa: E402
from hyperwatch.monitor.processes.children import ServiceProcess  # noqa: E402

TOKEN = "bench-cardinality-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NAMES_PER_BATCH = 4096


def rss_mb(pid: int) -> tuple[float, float]:
    """(resident, peak resident) MB of a process, from /proc."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def timed(client: httpx.Client, method: str, url: str, **kw: object) -> tuple[float, httpx.Response]:
    t0 = time.perf_counter()
    r = client.request(method, url, **kw)  # type: ignore[arg-type]
    return time.perf_counter() - t0, r


def flood_body(run: str, batch: int) -> bytes:
    pts = ",".join(
        f'{{"name":"user.flood{batch:04d}_{i:04d}","step":{batch},"value":1.0}}' for i in range(NAMES_PER_BATCH)
    )
    return f'{{"batch_id":"{uuid.uuid4().hex}","run":"{run}","points":[{pts}]}}'.encode()


def write_latency(client: httpx.Client, run: str, n: int, step0: int) -> list[float]:
    out = []
    for i in range(n):
        body = {"batch_id": uuid.uuid4().hex, "run": run, "points": [{"name": "loss", "step": step0 + i, "value": 2.0}]}
        dt, r = timed(client, "POST", "/api/v1/points", json=body, headers=AUTH)
        assert r.status_code == 201, r.text
        out.append(dt)
    return out


def reads(client: httpx.Client, run_id: int) -> dict[str, float]:
    metrics = [timed(client, "GET", "/metrics")[0] for _ in range(5)]
    index = []
    for _ in range(5):
        dt, r = timed(client, "GET", f"/api/v1/runs/{run_id}/series_index")
        assert r.status_code == 200, r.text
        index.append(dt)
    # every page of the run's index, by the cursor
    t0, pages, cursor = time.perf_counter(), 0, None
    while True:
        params = {"limit": 5000, **({"cursor": cursor} if cursor else {})}
        r = client.get(f"/api/v1/runs/{run_id}/series_index", params=params)
        pages += 1
        cursor = r.headers.get("x-next-cursor")
        if cursor is None:
            break
    return {
        "metrics_s": statistics.median(metrics),
        "index_s": statistics.median(index),
        "index_all_s": time.perf_counter() - t0,
        "index_pages": pages,
        "metrics_bytes": len(client.get("/metrics").content),
    }


def under_readers(url: str, run: str, run_id: int, readers: int, step0: int) -> list[float]:
    stop = threading.Event()

    def reader() -> None:
        with httpx.Client(base_url=url, timeout=120) as c:
            while not stop.is_set():
                c.get("/metrics")
                c.get(f"/api/v1/runs/{run_id}/series_index")

    threads = [threading.Thread(target=reader, daemon=True) for _ in range(readers)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    try:
        with httpx.Client(base_url=url, timeout=120) as c:
            return write_latency(c, run, 20, step0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)


def p(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def run_one(kind: str, batches: int, readers: int, spread: bool) -> None:
    with database(kind) as db_url:
        svc = ServiceProcess(
            db_url,
            dev=False,
            upgrade=False,
            extra_args=("--log-level", "warning"),
            env={"HYPERWATCH_WRITE_TOKEN": TOKEN},
            ready_path="/healthz",
            timeout=60,
        )
        with svc, httpx.Client(base_url=svc.url, timeout=300) as c:
            pid = svc.proc.pid  # type: ignore[union-attr]
            r = c.post("/api/v1/runs", json={"name": "victim"}, headers=AUTH)
            run_id = int(r.json()["id"])
            write_latency(c, "victim", 5, 0)  # warm
            base_w = write_latency(c, "victim", 20, 100)
            base_r = reads(c, run_id)
            base_rw = under_readers(svc.url, "victim", run_id, readers, 200)
            rss0 = rss_mb(pid)
            stored = refused = 0
            codes: dict[int, int] = {}
            t0 = time.perf_counter()
            for b in range(batches):
                run = "victim"
                if spread:
                    run = f"flood{b}"
                    c.post("/api/v1/runs", json={"name": run}, headers=AUTH)
                r = c.post(
                    "/api/v1/points",
                    content=flood_body(run, 1000 + b),
                    headers={**AUTH, "content-type": "application/json"},
                )
                codes[r.status_code] = codes.get(r.status_code, 0) + 1
                if r.status_code == 201:
                    stored += NAMES_PER_BATCH
                else:
                    refused += NAMES_PER_BATCH
                    if refused == NAMES_PER_BATCH:
                        print(f"{kind}: first refusal: HTTP {r.status_code} {r.json()['detail'][:300]}")
            flood_s = time.perf_counter() - t0
            after_r = reads(c, run_id)
            after_w = write_latency(c, "victim", 20, 5000)
            after_rw = under_readers(svc.url, "victim", run_id, readers, 6000)
            rss1 = rss_mb(pid)
        tag = f"{kind}{' spread' if spread else ''}"
        print(
            f"{tag}: flood {batches * NAMES_PER_BATCH:,} names in {flood_s:.1f} s: {stored:,} stored, "
            f"{refused:,} refused (HTTP {codes})"
        )
        print(f"{tag}: service RSS MB: {rss1[0]:.0f} after / {rss0[0]:.0f} before; peak {rss1[1]:.0f} (target <= 1024)")
        for key, label in (("metrics_s", "/metrics"), ("index_s", "series index (first page)")):
            ratio = after_r[key] / base_r[key]
            print(
                f"{tag}: {label} s: {after_r[key]:.4f} after / {base_r[key]:.4f} before = {ratio:.1f}x (target <= 1 s)"
            )
        print(
            f"{tag}: whole series index by cursor: {after_r['index_all_s']:.3f} s over {after_r['index_pages']} "
            f"page(s); /metrics {after_r['metrics_bytes']:,} bytes / {base_r['metrics_bytes']:,} before"
        )
        for label, before, after in (("alone", base_w, after_w), (f"{readers} readers", base_rw, after_rw)):
            ratio = p(after, 0.5) / p(before, 0.5)
            print(
                f"{tag}: one-point write p50 {label}: {p(after, 0.5) * 1e3:.1f} ms after / "
                f"{p(before, 0.5) * 1e3:.1f} ms before = {ratio:.2f}x (p95 {p(after, 0.95) * 1e3:.1f} ms)"
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    ap.add_argument("--batches", type=int, default=250, help="flood batches of 4,096 new names each")
    ap.add_argument("--readers", type=int, default=30, help="threads reading /metrics and the index meanwhile")
    ap.add_argument("--spread", action="store_true", help="each flood batch to a run of its own")
    args = ap.parse_args(argv)
    for kind in ("sqlite", "postgresql") if args.db == "both" else (args.db,):
        run_one(kind, args.batches, args.readers, args.spread)
    return 0


if __name__ == "__main__":
    sys.exit(main())
