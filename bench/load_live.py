"""One client must not slow everyone (issue 37): the service under N live watchers of one run, a flood of
distinct metric names and slow clients, each beside a quiet baseline measured in the same run.

The service runs as its own process (``hyperwatch serve`` on a fresh SQLite file or PostgreSQL
database). Throughout each scenario this process measures two things, each on its own keep-alive
connection, one request every ``--every`` seconds: a ``GET /healthz`` probe and a one-point writer
(``POST /api/v1/points``, a new step of the watched run). It prints their p50 and p95 and the ratio to
the quiet baseline measured just before, one line per figure:

- ``watchers``: ``--watchers`` live streams (``GET /api/v1/live/stream``, the pages' request, ``gap``
  0.5 s) of the run the writer writes, held by one asyncio client in a child process (so its work is
  off this process's GIL); they re-ask when a stream ends, as a page does;
- ``slow``: ``--slow`` connections that read very slowly: half are live streams read one byte a
  second through a small receive buffer, half send their request's headers a byte at a time;
- ``names``: batches of ``--batch`` new ``user.*`` names posted to another run until the service
  refuses one or ``--names`` are in (what the service answers is reported as it is).

    .venv/bin/python bench/load_live.py                          # 1,000 watchers, ~1 minute in all
    .venv/bin/python bench/load_live.py --duration 30 --names 1000000 --db postgresql

Targets (issue 37): 1,000 watchers of one run keep the probe's and the writer's p50 within 1.5x of quiet.
Only localhost traffic; every loop is bounded by ``--duration``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.load import database  # noqa: E402
from bench.service_process import service_process  # noqa: E402

TOKEN = "bench-live-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RUN = "watched"


@dataclass
class Timings:
    """Latencies (s) of the probe and the writer over one scenario, and what went wrong."""

    probe: list[float] = field(default_factory=list)
    write: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    @staticmethod
    def pct(xs: list[float], q: float) -> float:
        return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else math.nan


class Steps:
    """The writer's next step of the watched run (shared by every scenario)."""

    def __init__(self) -> None:
        self.next = 0


def measure(url: str, seconds: float, every: float, steps: Steps) -> Timings:
    """The probe and the one-point writer, each on its own thread and keep-alive connection."""
    out, end = Timings(), time.monotonic() + seconds

    def loop(kind: str) -> None:
        with httpx.Client(base_url=url, headers=AUTH, timeout=60) as c:
            while (due := time.monotonic()) < end:
                t = time.perf_counter()
                try:
                    if kind == "probe":
                        r = c.get("/healthz")
                    else:
                        steps.next += 1
                        pts = [{"name": "loss", "layer": None, "step": steps.next, "value": 1.0 / steps.next}]
                        r = c.post("/api/v1/points", json={"batch_id": uuid.uuid4().hex, "run": RUN, "points": pts})
                    ok = r.status_code in (200, 201)
                    label = f"{kind} HTTP {r.status_code}"
                except httpx.HTTPError as exc:
                    ok, label = False, f"{kind} {type(exc).__name__}"
                if ok:
                    (out.probe if kind == "probe" else out.write).append(time.perf_counter() - t)
                else:
                    out.errors[label] = out.errors.get(label, 0) + 1
                time.sleep(max(0.0, due + every - time.monotonic()))

    threads = [threading.Thread(target=loop, args=(k,), daemon=True) for k in ("probe", "write")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def report(scenario: str, quiet: Timings, loaded: Timings, note: str) -> dict[str, Any]:
    """One line per figure: what, the ratio to quiet, the two sides."""
    row: dict[str, Any] = {"scenario": scenario, "note": note, "errors": loaded.errors}
    for kind in ("probe", "write"):
        for q in (0.5, 0.95):
            a, b = Timings.pct(getattr(quiet, kind), q), Timings.pct(getattr(loaded, kind), q)
            what = f"{'/healthz probe' if kind == 'probe' else 'one-point write'} p{int(q * 100)}"
            row[f"{kind}_p{int(q * 100)}"] = [round(a, 2), round(b, 2), round(b / a, 2)]
            print(f"{scenario:<9} {what:<22} {b / a:6.2f}x  {b:8.2f} ms under load vs {a:6.2f} ms quiet")
    print(f"{scenario:<9} {note}{f'; errors {loaded.errors}' if loaded.errors else ''}")
    return row


# ----- (a) N live watchers of one run: a child process holds them ---------------------------------------


async def _hold_watchers(url: str, run_id: int, n: int, seconds: float, gap: float) -> dict[str, int]:
    got = {"events": 0, "opened": 0, "refused": 0, "errors": 0}
    end, ready = time.monotonic() + seconds, asyncio.Event()
    last = (await httpx.AsyncClient(base_url=url).get(f"/api/v1/runs/{run_id}")).json().get("last_step") or 0
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)

    async def one(c: httpx.AsyncClient) -> None:
        cursor = f"{run_id}:{last}:running"
        while time.monotonic() < end:
            params: dict[str, str | float] = {"cursor": cursor, "name": "loss", "wait": 30, "gap": gap}
            try:
                async with c.stream("GET", "/api/v1/live/stream", params=params) as r:
                    if r.status_code != 200:
                        got["refused"] += 1
                        await asyncio.sleep(1)
                        continue
                    got["opened"] += 1
                    if got["opened"] >= n:
                        ready.set()
                    data = ""
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            got["events"] += 1
                            data = line
                    if data:  # the stream ended: ask again from where it stopped, as a page does
                        state = json.loads(data.removeprefix("data: "))["runs"][0]
                        cursor = f"{run_id}:{state['cursor']}:{state['status']}"
            except httpx.HTTPError:
                got["errors"] += 1
                await asyncio.sleep(0.5)

    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as c:
        tasks = [asyncio.create_task(one(c)) for _ in range(n)]
        try:
            await asyncio.wait_for(ready.wait(), 60)
            print("ready", flush=True)
        except TimeoutError:
            print(f"not ready: {got}", flush=True)
        # until the parent says stop (a line on stdin) or the deadline
        stop = asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await asyncio.wait([stop], timeout=max(0.0, end - time.monotonic()))
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return got


def watchers(url: str, run_id: int, steps: Steps, args: argparse.Namespace) -> tuple[Timings, str]:
    cmd = [sys.executable, __file__, "--role-watchers", url, str(run_id), str(args.watchers),
           str(args.duration + 30), str(args.gap)]  # fmt: skip
    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"the watchers did not all open: {line}")
        time.sleep(1.0)  # the streams' opening reads are done
        loaded = measure(url, args.duration, args.every, steps)
    finally:
        out, _ = child.communicate("stop\n", timeout=60)
    held = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    return loaded, f"{args.watchers} watchers of the written run: {held}"


# ----- (c) slow clients --------------------------------------------------------------------------------


def slow(url: str, run_id: int, steps: Steps, args: argparse.Namespace) -> tuple[Timings, str]:
    host, port = url.removeprefix("http://").split(":")
    socks: list[socket.socket] = []
    path = f"/api/v1/live/stream?cursor={run_id}:0&name=loss&wait=30&gap={args.gap}"
    for i in range(args.slow):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        s.connect((host, int(port)))
        s.setblocking(False)
        if i % 2 == 0:  # a stream read one byte a second
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        socks.append(s)
    stop = threading.Event()
    trickled = [0]

    def trickle() -> None:  # one byte a second on each: a header line that never ends, or a read
        while not stop.wait(1.0):
            for i, s in enumerate(socks):
                try:
                    if i % 2:
                        s.send(b"X" if trickled[0] else b"GET /healthz HTTP/1.1\r\nX-Slow: ")
                    else:
                        s.recv(1)
                except OSError:
                    pass
            trickled[0] += 1

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        loaded = measure(url, args.duration, args.every, steps)
    finally:
        stop.set()
        t.join()
        for s in socks:
            s.close()
    return loaded, f"{args.slow // 2} live streams read 1 byte/s, {args.slow - args.slow // 2} headers sent 1 byte/s"


# ----- (b) a flood of distinct names --------------------------------------------------------------------


def names(url: str, _run_id: int, steps: Steps, args: argparse.Namespace) -> tuple[Timings, str]:
    result: dict[str, Any] = {"accepted": 0, "refused": None}
    done = threading.Event()

    def flood() -> None:
        with httpx.Client(base_url=url, headers=AUTH, timeout=120) as c:
            result["run_id"] = c.post("/api/v1/runs", json={"name": "flood"}).json()["id"]
            t0, k = time.monotonic(), 0
            while result["accepted"] < args.names and time.monotonic() - t0 < args.duration * 4:
                pts = [{"name": f"user.n{k + j}", "layer": None, "step": 0, "value": 1.0} for j in range(args.batch)]
                r = c.post("/api/v1/points", json={"batch_id": uuid.uuid4().hex, "run": "flood", "points": pts})
                if r.status_code not in (200, 201):
                    result["refused"] = f"HTTP {r.status_code} after {result['accepted']} names: {r.text[:200]}"
                    break
                result["accepted"] += args.batch
                k += args.batch
            result["seconds"] = round(time.monotonic() - t0, 1)
        done.set()

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    loaded = measure(url, args.duration, args.every, steps)
    done.wait(args.duration * 4 + 120)
    after = {}
    with httpx.Client(base_url=url, headers=AUTH, timeout=120) as c:
        for what, path in (("/metrics", "/metrics"), ("series index", "/api/v1/runs/{id}/series_index")):
            path = path.format(id=result.get("run_id"))
            t0 = time.perf_counter()
            r = c.get(path)
            after[what] = f"{(time.perf_counter() - t0) * 1000:.0f} ms (HTTP {r.status_code}, {len(r.content)} B)"
    note = (f"{result['accepted']} new names accepted in {result.get('seconds')} s, refused: {result['refused']}; "
            f"then {after}")  # fmt: skip
    return loaded, note


SCENARIOS = {"watchers": watchers, "slow": slow, "names": names}


def run_all(kind: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    env = {"HYPERWATCH_WRITE_TOKEN": TOKEN, "HYPERWATCH_LIVE_MAX_PER_CLIENT": str(max(64, args.watchers + args.slow)),
           "HYPERWATCH_LIVE_MAX_TOTAL": str(max(1000, args.watchers + args.slow + 100))}  # fmt: skip
    rows = []
    os.environ.update(env)  # the service inherits HYPERWATCH_* (ServiceProcess keeps them)
    # above the connection cap each new connection closes an idle keep-alive one (the probe's, the writer's)
    serve_args = ("--max-connections", str(2 * (args.watchers + args.slow) + 1000))
    with database(kind) as db_url, service_process(db_url, TOKEN, args=serve_args) as svc:
        url = svc.url
        r = httpx.post(url + "/api/v1/runs", json={"name": RUN}, headers=AUTH, timeout=30)
        run_id = int(r.json()["id"])
        steps = Steps()
        measure(url, 1.0, args.every, steps)  # warm up
        print(f"-- {kind}: {args.duration:g} s per side, probe and writer every {args.every * 1000:g} ms")
        for name in args.scenarios:
            quiet = measure(url, args.duration, args.every, steps)
            loaded, note = SCENARIOS[name](url, run_id, steps, args)
            rows.append({"db": kind, **report(name, quiet, loaded, note)})
    return rows


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--role-watchers":
        url, run_id, n, seconds, gap = sys.argv[2:7]
        got = asyncio.run(_hold_watchers(url, int(run_id), int(n), float(seconds), float(gap)))
        print(json.dumps(got), flush=True)
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="sqlite")
    p.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS), default=list(SCENARIOS))
    p.add_argument("--duration", type=float, default=8.0, help="seconds per side of each scenario (default 8)")
    p.add_argument("--every", type=float, default=0.02, help="seconds between probes, and between writes")
    p.add_argument("--watchers", type=int, default=1000, help="live streams of the written run (default 1000)")
    p.add_argument("--gap", type=float, default=0.5, help="the watchers' gap between answers (the route's default)")
    p.add_argument("--slow", type=int, default=400, help="slow connections (default 400)")
    p.add_argument("--names", type=int, default=200_000, help="new names to flood at most (default 200,000)")
    p.add_argument("--batch", type=int, default=4096, help="new names per flood batch (default 4096)")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args(argv)
    for flag in ("duration", "every", "watchers", "slow", "names", "batch"):
        if not getattr(args, flag) > 0:
            p.error(f"--{flag}: must be positive")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * (args.watchers + args.slow) + 256  # this process's and the service's sockets
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            p.error(f"--watchers/--slow: need {need} open files, the hard limit is {hard} (ulimit -Hn)")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    rows = [
        row for kind in (["sqlite", "postgresql"] if args.db == "both" else [args.db]) for row in run_all(kind, args)
    ]
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if os.environ.get("BENCH_STRICT"):
        bad = [r for r in rows if r["scenario"] == "watchers" and max(r["probe_p50"][2], r["write_p50"][2]) > 1.5]
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
