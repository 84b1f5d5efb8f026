"""Opening a run page while runs stream: how long the page's first read takes, and what it does to ingest.

``hyperwatch serve`` runs as its own process on a SQLite file (``--db postgresql``: a new
PostgreSQL database); ``--runs`` runs stream 512 points per logged step each (8 indicators x 64
layers, bench/live.py's writers) at ``--rate`` steps/s. Then,
``--rounds`` times: a quiet window without a page, and one *page open*: the requests the run page
(web/static/run.js) sends when it opens, as it sends them (the run and its series index, then one
``/ui/data/runs/{id}/indicator`` per indicator, all at once). Printed: the page open's duration,
and the writers' POST times (p50 / p95 / max) while pages open against the quiet windows.

Each ``--limit`` value is a service of its own (``hyperwatch serve --max-concurrent-reads N``), run one
after the other in this invocation on the same workload, so the lines compare side by side:

    .venv/bin/python bench/page_open.py                       # --limit 0 (no limit) and 1
    .venv/bin/python bench/page_open.py --limit 0 --limit 1 --limit 2 --rounds 6
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ingest import NAMES, fresh, pg_database  # noqa: E402
from bench.live import TOKEN, Writer, pct, start_writers  # noqa: E402
from bench.service_process import service_process  # noqa: E402


def get(url: str) -> object:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


def open_page(base: str, run_id: int, buckets: int) -> float:
    """The run page's requests on open, as run.js sends them; the seconds until the last answered."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(get, [f"{base}/api/v1/runs/{run_id}", f"{base}/api/v1/runs/{run_id}/series_index"]))
    with ThreadPoolExecutor(len(NAMES)) as pool:
        urls = [f"{base}/ui/data/runs/{run_id}/indicator?name={n}&x=step&buckets={buckets}" for n in NAMES]
        list(pool.map(get, urls))
    return time.monotonic() - t0


def posts(writers: list[Writer], windows: list[tuple[float, float]]) -> list[float]:
    return [d for w in writers for (at, d) in w.post_s if any(a <= at < b for a, b in windows)]


def one(limit: int, args: argparse.Namespace) -> dict[str, float]:
    with contextlib.ExitStack() as stack:
        if args.db == "postgresql":
            url = stack.enter_context(pg_database())
        else:
            url = f"sqlite:///{Path(stack.enter_context(tempfile.TemporaryDirectory())) / 'open.db'}"
        fresh(url)
        extra = ("--max-concurrent-reads", str(limit))
        with service_process(url, TOKEN, timeout=600, args=extra) as svc:
            stop = threading.Event()
            writers, watched = start_writers(svc.url, "open", args, stop)
            time.sleep(2.0)
            quiet: list[tuple[float, float]] = []
            opening: list[tuple[float, float]] = []
            took: list[float] = []
            for _ in range(args.rounds):
                t0 = time.time()
                time.sleep(args.quiet)
                quiet.append((t0, time.time()))
                t0 = time.time()
                took.append(open_page(svc.url, watched, args.buckets))
                opening.append((t0, time.time()))
                time.sleep(1.0)  # the posts queued behind the page finish before the next quiet window
            stop.set()
            for w in writers:
                w.join(30)
                if w.error is not None:
                    raise RuntimeError(f"writer {w.run_name} failed: {w.error}")
    q, o = posts(writers, quiet), posts(writers, opening)
    return {
        "open_s": statistics.median(took),
        "open_max_s": max(took),
        "quiet_p50": pct(q, 0.5),
        "quiet_p95": pct(q, 0.95),
        "quiet_max": max(q),
        "open_p50": pct(o, 0.5) if o else math.nan,
        "open_p95": pct(o, 0.95) if o else math.nan,
        "open_max": max(o) if o else math.nan,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, action="append",
                    help="--max-concurrent-reads of a service (repeat; default 0 and 1; 0 = no limit)")  # fmt: skip
    ap.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite",
                    help="the service's database (sqlite, default; postgresql: a new one on :5432)")  # fmt: skip
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--rate", type=float, default=2.0, help="logged steps per second per run (default 2)")
    ap.add_argument("--warmup", type=int, default=200, help="steps each run holds before the pages (default 200)")
    ap.add_argument("--rounds", type=int, default=4, help="page opens per service (default 4)")
    ap.add_argument("--quiet", type=float, default=5.0, help="seconds without a page before each open (default 5)")
    ap.add_argument("--buckets", type=int, default=533, help="the page's buckets (an 800 px figure: 533)")
    args = ap.parse_args()
    for name in ("runs", "rounds", "warmup", "buckets"):
        if getattr(args, name) < 1:
            ap.error(f"--{name}: must be at least 1")
    if args.rate <= 0 or args.quiet <= 0:
        ap.error("--rate and --quiet: must be positive")
    limits = args.limit or [0, 1]
    if any(n < 0 for n in limits):
        ap.error("--limit: 0 (no limit) or a positive number of page reads at once")
    print(f"page open ({args.db}): {args.runs} runs x {len(NAMES) * 64} points per logged step at {args.rate:g} "
          f"steps/s, "
          f"{args.warmup} steps before; the run page's {len(NAMES)} indicator reads at once, "
          f"{args.rounds} opens")  # fmt: skip
    print(f"{'concurrent reads':>14} | {'open s (med/max)':>16} | {'POST ms quiet p50/p95/max':>26} | "
          f"{'POST ms opening p50/p95/max':>28}")  # fmt: skip
    for limit in limits:
        r = one(limit, args)
        ms = lambda *keys, r=r: " / ".join(f"{r[k] * 1000:.0f}" for k in keys)  # noqa: E731
        print(f"{limit or 'none':>14} | {r['open_s']:7.2f} / {r['open_max_s']:6.2f} | "
              f"{ms('quiet_p50', 'quiet_p95', 'quiet_max'):>26} | {ms('open_p50', 'open_p95', 'open_max'):>28}",
              flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
