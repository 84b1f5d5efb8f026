"""Scale-comparison page load time, server and browser together. Prints one line per figure.

Seeds a group of 8 runs (d = 6..20) x 8 indicators (the seven stability indicators per layer, and
loss) x 100,000 steps into SQLite through the store (the same write path as the API, without
HTTP), serves the app with uvicorn on localhost, and loads ``/groups/{id}`` in headless Debian
Chromium (Selenium, /usr/bin/chromedriver). The time is from navigation start to the last figure
drawn (the page sets ``window.hwReadyAt`` after the last Plotly draw resolves), median of a few
loads in one browser (static files cached, as for someone who opens it every morning); the first
(cold-cache) load is printed separately. The target is 1.5 s.

    .venv/bin/python bench/dashboard.py                        # 8 x 8 x 100k, 1 layer per indicator
    .venv/bin/python bench/dashboard.py --layers 4 --db /tmp/hw-dash-4.db   # keep the DB for reruns
"""

from __future__ import annotations

import argparse
import contextlib
import math
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import uvicorn
from prometheus_client import CollectorRegistry

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hyperwatch.app import create_app  # noqa: E402
from hyperwatch.hooks.schema import Point  # noqa: E402
from hyperwatch.monitor.core.config import Settings  # noqa: E402
from hyperwatch.monitor.store import SqlStore, migrate  # noqa: E402
from hyperwatch.web.data import COMPARE_INDICATORS  # noqa: E402
from tests.web.browser import chromium, missing_browser, wait_ready  # noqa: E402

TARGET_S = 1.5
TOKEN = "bench-dashboard-token-0123456789"
DEPTHS = (6, 8, 10, 12, 14, 16, 18, 20)
LEVEL = {
    "attention_z": 60.0,
    "router_z": 30.0,
    "attention_rms": 0.8,
    "mlp_rms": 0.9,
    "attention_outlier_ratio": 0.01,
    "mlp_outlier_ratio": 0.02,
    "max_vio": 0.5,
    "loss": 3.0,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def seed(store: SqlStore, steps: int, layers: int, batch: int = 50_000) -> int:
    """8 runs of the group "bench" with every indicator at every step; returns the group id."""
    for depth in DEPTHS:
        params = 12 * (128 * depth) ** 2 * depth
        fields = {
            "group": "bench",
            "depth": depth,
            "total_params": params,
            "tokens": steps * 4096 * depth,
            "total_steps": steps,
            "flops": 6.0 * params * steps * 4096 * depth,
            "status": "finished",
        }
        run, _ = store.upsert_run("bench", f"d{depth}", fields)
        pts: list[Point] = []
        t0 = time.perf_counter()
        for step in range(steps):
            tok = 4096 * depth * (step + 1)
            wave = 1.0 + 0.2 * math.sin(step / 700.0) + (0.5 if step % 9973 == 0 else 0.0)
            for name in COMPARE_INDICATORS:
                level = LEVEL[name] * (8.0 / depth) ** 0.3 * wave
                if name == "loss":
                    pts.append(Point(name, step, level * (1.0 + 1.0 / (1.0 + step / 1000.0)), tokens=tok))
                    continue
                pts.extend(Point(name, step, level * (1.0 + 0.01 * la), layer=la, tokens=tok) for la in range(layers))
            if len(pts) >= batch:
                store.ingest(run.id, uuid.uuid4().hex, pts)
                pts = []
        if pts:
            store.ingest(run.id, uuid.uuid4().hex, pts)
        print(f"seeded d{depth}: {steps * (1 + 7 * layers):,} points in {time.perf_counter() - t0:.0f} s", flush=True)
    return store.list_groups("bench")[0].id


@contextlib.contextmanager
def serve(url: str, store: SqlStore) -> Iterator[str]:
    app = create_app(Settings(database_url=url, write_token=TOKEN), store=store, registry=CollectorRegistry())
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def page_loads(base: str, group_id: int, repeats: int, gl: bool) -> tuple[float, list[float], int]:
    """(cold load, warm loads, traces drawn) in seconds from navigation start to all figures drawn."""
    url = f"{base}/groups/{group_id}" + ("?gl=1" if gl else "")
    times: list[float] = []
    traces = 0
    with chromium(1400, 1000) as driver:
        for _ in range(repeats + 1):
            driver.get(url)
            wait_ready(driver, 120)
            times.append(float(driver.execute_script("return window.hwReadyAt")) / 1000.0)
            traces = int(
                driver.execute_script(
                    "return Array.from(document.querySelectorAll('.fig.line'))"
                    ".reduce((n, d) => n + (d.data || []).length, 0)"
                )
            )
    return times[0], times[1:], traces


def server_only(base: str, group_id: int, repeats: int) -> float:
    """Median seconds for the page's 8 figure requests made one after another (no browser)."""
    times = []
    with httpx.Client(base_url=base, timeout=120) as c:
        for _ in range(repeats):
            t0 = time.perf_counter()
            for name in COMPARE_INDICATORS:
                c.get(f"/ui/data/groups/{group_id}/compare", params={"name": name, "buckets": 370}).raise_for_status()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--layers", type=int, default=1, help="layers per per-layer indicator (default 1)")
    ap.add_argument("--repeats", type=int, default=5, help="warm page loads (median)")
    ap.add_argument("--db", type=Path, default=None, help="SQLite file to keep (reused when it exists)")
    ap.add_argument("--gl", action="store_true", help="draw the lines with WebGL (scattergl)")
    args = ap.parse_args()
    why = missing_browser()
    if why:
        print(f"dashboard: cannot run: {why}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        path = args.db or Path(tmp) / "dashboard.db"
        reuse = path.exists()
        url = f"sqlite:///{path}"
        store = SqlStore(url)
        migrate.upgrade(store.engine)
        t0 = time.perf_counter()
        group_id = store.list_groups("bench")[0].id if reuse else seed(store, args.steps, args.layers)
        if not reuse:
            print(f"seed: 8 runs x 8 indicators x {args.steps:,} steps in {time.perf_counter() - t0:.0f} s")
        with serve(url, store) as base:
            server = server_only(base, group_id, args.repeats)
            cold, warm, traces = page_loads(base, group_id, args.repeats, args.gl)
        store.close()
    med = statistics.median(warm)
    print(
        f"dashboard scale comparison (8 runs x 8 indicators x {args.steps:,} steps, {args.layers} layer(s), "
        f"{'scattergl' if args.gl else 'svg'}): page ready in {med:.3f} s (median of {len(warm)} loads; "
        f"first load {cold:.3f} s) vs target {TARGET_S} s = {med / TARGET_S:.2f}x of the target; {traces} traces drawn"
    )
    print(f"dashboard server only: the 8 figure requests one after another in {server:.3f} s (median)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
