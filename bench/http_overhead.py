"""Where the HTTP overhead of ingest goes: clients and uvicorn's protocol/loop, side by side. Prints one
line per figure: what, the ratio, the two sides.

Posts the same kind of pre-encoded bodies as bench/ingest.py (one step = 512 points per batch, JSON,
~30 KB; ``--body columns``: the hooks' binary body) to ``hyperwatch serve`` on SQLite, each
service its own process with its own database, and reports milliseconds per batch for:

- clients, against the service with h11 on asyncio's loop (``serve`` without the [server] extra's
  httptools and uvloop): (a) an ``httpx.Client`` keep-alive (what bench/ingest.py used), (b) a plain
  ``http.client.HTTPConnection`` keep-alive, (c) the hooks' own ``hooks.sinks.client.request`` (as
  the sink calls it);
- the service's HTTP protocol and event loop (``serve --http h11|httptools --loop asyncio|uvloop``,
  each variant whose library is installed), with client (b): new batches, and the same batches
  sent again (the store answers "duplicate" after one look-up, so what is left is mostly HTTP,
  routing, body parse and the threadpool hop, without the store's noise);
- the service's in-process floor: the route's own store call (``_store_batch``) on the parsed body,
  in this process, on a database of its own: what is left above it is HTTP, routing and the hop.

``--sink``: instead, the hooks' ``HttpSink`` end to end on the h11/asyncio service: ``--batches``
steps of 512 points written at once, timed from the first ``write`` to ``flush`` returning, with
one request per step (``max_points=512``) and with the sink's default merging (``max_points=20000``),
beside client (b) posting the same steps; interleaved the same way.

For the services, the CPU time the service process used per batch (from /proc, so Linux only) is
printed beside the wall time: on a training machine the service shares the cores with the trainer.

Every service starts before the first figure, and the measurements are interleaved (each repeat
runs every client x service once, in a rotated order) so a noisy machine slows all sides alike;
each batch goes to a fresh run, so every side stores the same rows. Ratios are the median of the
per-repeat ratios; the milliseconds the median of the repeats.

    .venv/bin/python bench/http_overhead.py                   # 100 batches x 5 repeats
    .venv/bin/python bench/http_overhead.py --batches 200 --repeats 9
    .venv/bin/python bench/http_overhead.py --sink --batches 200 --repeats 7
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import importlib.util
import os
import statistics
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.ingest
from bench.ingest import TOKEN, Row, chunks, encode, fresh, rows
from bench.service_process import service_process
from hyperwatch.hooks.schema import Batch, Point
from hyperwatch.hooks.sinks import HttpSink, RunInfo
from hyperwatch.hooks.sinks import client as hooks_client
from hyperwatch.monitor.alerting.forecast_band import ForecastWatches
from hyperwatch.monitor.api.batch_body import read_batch
from hyperwatch.monitor.api.routes.points import _store_batch
from hyperwatch.monitor.store import SqlStore

STEP = 512  # points per batch: one step of the bench's 8 indicators x 64 layers
BASE = "h11/asyncio"  # the service without httptools and uvloop
SERVERS = {
    "h11/asyncio": ("--http", "h11", "--loop", "asyncio"),
    "h11/uvloop": ("--http", "h11", "--loop", "uvloop"),
    "httptools/asyncio": ("--http", "httptools", "--loop", "asyncio"),
    "httptools/uvloop": ("--http", "httptools", "--loop", "uvloop"),
}
Bodies = list[tuple[bytes, str]]
Poster = Callable[[str, str, Bodies], float]  # (base URL, run, bodies) -> seconds for the bodies


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (Linux /proc; 10 ms ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def installed(server: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in server.split("/") if m not in ("h11", "asyncio"))


def auth(kind: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    return headers | ({"Content-Type": kind} if kind else {})


def create_run(base: str, run: str) -> None:
    resp = hooks_client.request("POST", base + "/api/v1/runs", {"name": run}, TOKEN)
    if hooks_client.classify(resp) != hooks_client.DELIVERED:
        raise RuntimeError(f"creating run {run}: HTTP {resp.status} {resp.error}")


def post_httpx(base: str, run: str, bodies: Bodies) -> float:
    with httpx.Client(base_url=base, headers=auth(), timeout=120) as c:
        c.get("/healthz").raise_for_status()  # the connection is open before the clock starts
        t0 = time.perf_counter()
        for body, kind in bodies:
            c.post("/api/v1/points", content=body, headers={"Content-Type": kind}).raise_for_status()
        return time.perf_counter() - t0


def post_http_client(base: str, run: str, bodies: Bodies) -> float:
    url = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=120)
    try:
        conn.request("GET", "/healthz")
        conn.getresponse().read()
        t0 = time.perf_counter()
        for body, kind in bodies:
            conn.request("POST", "/api/v1/points", body, auth(kind))
            resp = conn.getresponse()
            resp.read()
            if resp.status not in (200, 201):  # 200: a re-sent batch, stored once already
                raise RuntimeError(f"POST /api/v1/points: HTTP {resp.status}")
        return time.perf_counter() - t0
    finally:
        conn.close()


def post_hooks(base: str, run: str, bodies: Bodies) -> float:
    t0 = time.perf_counter()
    for body, kind in bodies:
        resp = hooks_client.request("POST", base + "/api/v1/points", body, TOKEN, 120.0, content_type=kind)
        if resp.status not in (200, 201):
            raise RuntimeError(f"POST /api/v1/points: HTTP {resp.status} {resp.error}")
    return time.perf_counter() - t0


CLIENTS: dict[str, Poster] = {
    "httpx.Client keep-alive": post_httpx,
    "http.client keep-alive": post_http_client,
    "hooks client (urllib, a connection per request)": post_hooks,
}
KEEPALIVE = "http.client keep-alive"


def in_process(store: SqlStore, run: str, bodies: Bodies) -> float:
    """The route's store call on the parsed bodies (parsing is before the clock, as in HTTP it is not)."""
    store.upsert_run("default", run, {})
    parsed = [read_batch(body, kind) for body, kind in bodies]
    watches = ForecastWatches()  # the route's forecast bands, as the app keeps them per process
    t0 = time.perf_counter()
    for batch in parsed:
        _store_batch(store, "default", batch, watches)
    return time.perf_counter() - t0


def sink_seconds(base: str, run: str, data: list[Row], spool: Path, max_points: int) -> float:
    """``HttpSink`` from the first write of the steps to the end of ``flush``."""
    sink = HttpSink(base, token=TOKEN, spool=spool, max_points=max_points, close_timeout=60)
    sink.start(RunInfo(name=run))
    steps = [
        Batch(run, [Point(n, s, v, la, s * 4096) for n, la, s, v in part]) for part in chunks(data, STEP)
    ]  # built before the clock, as the monitor builds them on its own thread
    try:
        t0 = time.perf_counter()
        for batch in steps:
            sink.write(batch)
        if not sink.flush(600):
            raise RuntimeError(f"HttpSink did not deliver: {sink.last_error}")
        return time.perf_counter() - t0
    finally:
        sink.close()


def sink_figures(data: list[Row], repeats: int) -> None:
    sides: dict[str, list[float]] = {"one": [], "merged": [], "raw": []}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        url = "sqlite:///" + str(Path(tmp) / "sink.db")
        fresh(url)
        base = stack.enter_context(service_process(url, TOKEN, 600.0, SERVERS[BASE])).url
        n = 0

        def measure(side: str, steps: list[Row]) -> float:
            nonlocal n
            n += 1
            run = f"s{n}"
            if side == "raw":
                create_run(base, run)
                secs = post_http_client(base, run, [encode(part, run) for part in chunks(steps, STEP)])
            else:
                secs = sink_seconds(base, run, steps, Path(tmp) / f"spool{n}", STEP if side == "one" else 20_000)
            return secs / (len(steps) // STEP) * 1000

        for side in sides:
            measure(side, data[: 10 * STEP])  # warm-up
        for rep in range(repeats):
            order = list(sides)
            k = rep % len(order)
            for side in order[k:] + order[:k]:
                sides[side].append(measure(side, data))
    med = {k: statistics.median(v) for k, v in sides.items()}
    print(f"HttpSink end to end ({len(data) // STEP} steps of {STEP} points written at once, median of {repeats}):")
    for side, what in (("one", "one request per step (max_points=512)"), ("merged", "merged (max_points=20000)")):
        ratio = statistics.median(x / y for x, y in zip(sides[side], sides["raw"]))
        print(
            f"  sink, {what} vs http.client keep-alive posting each step: {ratio:.2f}x  "
            f"(sink {med[side]:.2f} ms/step vs http.client {med['raw']:.2f} ms/step)"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=100, help="batches (steps of 512 points) per measurement")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--body", choices=("json", "columns"), default="json", help="HTTP body (default json)")
    ap.add_argument("--sink", action="store_true", help="the hooks' HttpSink end to end instead")
    args = ap.parse_args()
    bench.ingest.BODY = args.body
    data = rows(args.batches)
    if args.sink:
        sink_figures(data, args.repeats)
        return 0
    servers = [s for s in SERVERS if installed(s)]
    missing = [s for s in SERVERS if s not in servers]
    # (server, client) pairs measured: every client on the base service, client (b) on every service
    pairs = [(BASE, c) for c in CLIENTS] + [(s, KEEPALIVE) for s in servers if s != BASE]
    ms: dict[tuple[str, str], list[float]] = {p: [] for p in pairs}
    dup: dict[str, list[float]] = {s: [] for s in servers}  # the same batches again, client (b)
    cpu: dict[str, list[float]] = {s: [] for s in servers}  # the service's CPU ms per batch, client (b)
    cpu_dup: dict[str, list[float]] = {s: [] for s in servers}
    floor: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        urls = {s: "sqlite:///" + str(Path(tmp) / (s.replace("/", "_") + ".db")) for s in [*servers, "floor"]}
        for u in urls.values():
            fresh(u)
        procs = {s: stack.enter_context(service_process(urls[s], TOKEN, 600.0, SERVERS[s])) for s in servers}
        bases = {s: p.url for s, p in procs.items()}
        store = SqlStore(urls["floor"])
        stack.callback(store.close)
        n = 0

        def measure(server: str, poster: Poster, batches: int) -> float:
            nonlocal n
            n += 1
            run = f"r{n}"
            bodies = [encode(part, run) for part in chunks(data[: batches * STEP], STEP)]
            if server == "floor":
                return in_process(store, run, bodies) / len(bodies) * 1000
            create_run(bases[server], run)
            pid = procs[server].proc.pid  # type: ignore[union-attr]
            c0 = cpu_seconds(pid)
            took = poster(bases[server], run, bodies) / len(bodies) * 1000
            if poster is post_http_client and batches == args.batches:
                c1 = cpu_seconds(pid)
                cpu[server].append((c1 - c0) / len(bodies) * 1000)
                dup[server].append(poster(bases[server], run, bodies) / len(bodies) * 1000)
                cpu_dup[server].append((cpu_seconds(pid) - c1) / len(bodies) * 1000)
            return took

        for s, c in pairs:  # warm-up: imports, caches, the first connection; not counted
            measure(s, CLIENTS[c], 10)
        measure("floor", post_http_client, 10)
        for rep in range(args.repeats):
            order = [*pairs, ("floor", "")]
            k = rep % len(order)
            for s, c in order[k:] + order[:k]:
                if s == "floor":
                    floor.append(measure("floor", post_http_client, args.batches))
                else:
                    ms[(s, c)].append(measure(s, CLIENTS[c], args.batches))

    def line(what: str, a: list[float], b: list[float], a_name: str, b_name: str) -> None:
        ratio = statistics.median(x / y for x, y in zip(a, b))
        print(
            f"{what}: {ratio:.2f}x  ({a_name} {statistics.median(a):.2f} ms/batch vs "
            f"{b_name} {statistics.median(b):.2f} ms/batch; {statistics.median(a) - statistics.median(b):+.2f} ms)"
        )

    print(
        f"http overhead ({args.batches} batches of {STEP} points, {args.body} bodies, "
        f"median of {args.repeats}; service on SQLite)" + (f"; not installed: {', '.join(missing)}" if missing else "")
    )
    keep = ms[(BASE, KEEPALIVE)]
    line("client httpx vs http.client (service h11/asyncio)", ms[(BASE, "httpx.Client keep-alive")], keep,
         "httpx", "http.client")  # fmt: skip
    line("client hooks (urllib) vs http.client (service h11/asyncio)",
         ms[(BASE, "hooks client (urllib, a connection per request)")], keep, "hooks", "http.client")  # fmt: skip
    for s in servers:
        if s != BASE:
            line(f"service {s} vs {BASE} (http.client)", ms[(s, KEEPALIVE)], keep, s, BASE)
    for s in servers:
        if s != BASE:
            line(f"service {s} vs {BASE}, re-sent batches (http.client)", dup[s], dup[BASE], s, BASE)
    for s in servers:
        if s != BASE:
            line(f"service CPU {s} vs {BASE} (http.client)", cpu[s], cpu[BASE], s, BASE)
            line(f"service CPU {s} vs {BASE}, re-sent batches (http.client)", cpu_dup[s], cpu_dup[BASE], s, BASE)
    for s in servers:
        line(f"HTTP ({s}, http.client) vs the store in process", ms[(s, KEEPALIVE)], floor, "HTTP", "in process")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
