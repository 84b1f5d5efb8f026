"""Live charts under load: from a point's ingest to its pixel, and what an open live page costs the service.

``hyperwatch serve`` runs as its own process on a SQLite file; 8 runs stream 512 points per logged
step each (8 indicators x 64 layers, bench/ingest.py's workload) over keep-alive HTTP, one writer
thread per run, each logging a step every ``1/--rate`` s. Three phases of ``--seconds`` each, one
after the other in one invocation:

1. no page open: the service's CPU (user + system time of its process / wall time);
2. one run page open in headless Chromium (``/runs/{id}`` of the first run, live, which asks at most
   every 0.4 s; ``--page group``: the scale page of the 8 runs, at most every 0.5 s): the service's CPU
   again, and for each step of that run posted meanwhile, the time from the POST being sent to the
   page's first paint that shows it (the page logs ``[run, step, epoch ms]`` two animation frames
   after drawing a live answer: ``window.hwLiveLog``); p50 / p95 / max;
3. the page closed: the CPU once more (the baseline is the mean of phases 1 and 3, so a drift of the
   machine's load does not read as the page's cost).

Ingest is measured in every phase too (the writers' POST time, median): a live page must not slow it.
``--stacks DIR`` keeps py-spy's raw stacks of each phase (``a.txt``, ``b.txt``, ``c.txt``; the
sampling costs the service CPU too, the same in every phase, so the CPU figures read higher).
Targets (issue 24): p95 <= 1 s; the page adds <= 10 % to the service's CPU.

    .venv/bin/python bench/live.py                 # 8 runs x 512 points/step, 2 steps/s per run, 30 s phases
    .venv/bin/python bench/live.py --rate 1 --seconds 20
    .venv/bin/python bench/live.py --page group    # the scale page of the 8 runs instead
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ingest import LAYERS, NAMES, fresh  # noqa: E402
from bench.service_process import service_process  # noqa: E402
from tests.web.browser import chromium, missing_browser, wait_ready  # noqa: E402

TOKEN = "bench-live-token-0123456789abcdef"
P95_TARGET_S = 1.0
CPU_TARGET = 0.10


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Writer(threading.Thread):
    """One run logging a step of 512 points every ``period`` s over one keep-alive connection."""

    def __init__(self, base: str, run: str, period: float, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.base, self.run_name, self.period, self.stop = base, run, period, stop
        self.sent: dict[int, float] = {}  # step -> epoch s when its POST was sent
        self.post_s: list[tuple[float, float]] = []  # (epoch s sent, seconds the POST took)
        self.step = 0
        self.group_id: int | None = None
        self.error: BaseException | None = None
        url = urllib.parse.urlsplit(base)
        self.conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=120)

    def post(self, path: str, body: bytes) -> bytes:
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        try:
            self.conn.request("POST", path, body, headers)
            resp = self.conn.getresponse()
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            self.conn.close()  # the server closed an idle keep-alive connection: open a new one
            self.conn.request("POST", path, body, headers)
            resp = self.conn.getresponse()
        answer = resp.read()
        if not 200 <= resp.status < 300:
            raise RuntimeError(f"POST {path}: HTTP {resp.status} {answer[:300]!r}")
        return answer

    def body(self, step: int) -> bytes:
        pts = [
            {"name": n, "layer": la, "step": step, "tokens": 4096 * (step + 1),
             "value": level * (1.0 + 0.1 * math.sin(step * 0.05 + la))}
            for n, level in NAMES.items()
            for la in range(LAYERS)
        ]  # fmt: skip
        return json.dumps({"batch_id": uuid.uuid4().hex, "run": self.run_name, "points": pts}).encode()

    def create(self) -> int:
        body = {"name": self.run_name, "total_steps": 100_000, "group": "live-bench"}
        answer = self.post("/api/v1/runs", json.dumps(body).encode())
        found = json.loads(answer)
        self.group_id = found["group_id"]
        return int(found["id"])

    def run_steps(self, n: int) -> None:
        for _ in range(n):
            self.post("/api/v1/points", self.body(self.step))
            self.step += 1

    def run(self) -> None:
        nxt = time.monotonic()
        try:
            while not self.stop.is_set():
                body = self.body(self.step)
                t0 = time.time()
                self.sent[self.step] = t0
                self.post("/api/v1/points", body)
                self.post_s.append((t0, time.time() - t0))
                self.step += 1
                nxt += self.period
                self.stop.wait(max(0.0, nxt - time.monotonic()))
        except BaseException as exc:  # reported by the main thread
            self.error = exc


def cpu_share(pid: int, seconds: float, stacks: Path | None = None) -> float:
    """The process's CPU share over ``seconds``; ``stacks``: py-spy's raw stacks of those seconds kept there."""
    spy = None
    if stacks is not None:
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        cmd = [exe, "record", "--pid", str(pid), "--rate", "200", "--format", "raw", "-o", str(stacks)]
        spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # py-spy attaches
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    share = (cpu_seconds(pid) - c0) / (time.monotonic() - t0)
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
    return share


def post_median_ms(writers: list[Writer], t0: float, t1: float) -> float:
    took = [d for w in writers for (at, d) in w.post_s if t0 <= at < t1]
    return statistics.median(took) * 1000 if took else math.nan


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, math.ceil(q * len(s)) - 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--rate", type=float, default=2.0, help="logged steps per second per run (default 2)")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of each phase (default 30)")
    ap.add_argument("--warmup", type=int, default=50, help="steps each run holds before the phases (default 50)")
    ap.add_argument("--page", choices=("run", "group"), default="run",
                    help="the open page: the first run's page (default) or the scale page of all 8 runs")  # fmt: skip
    ap.add_argument("--stacks", type=Path, help="keep py-spy's raw stacks of each phase here (a.txt, b.txt, c.txt); "
                    "the sampling costs CPU too, the same in every phase")  # fmt: skip
    args = ap.parse_args()
    if args.stacks:
        args.stacks.mkdir(parents=True, exist_ok=True)
    where = (lambda phase: args.stacks / f"{phase}.txt") if args.stacks else (lambda phase: None)
    why = missing_browser()
    if why:
        print(f"live: cannot run: {why}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'live.db'}"
        fresh(url)
        with service_process(url, TOKEN, timeout=600) as svc:
            assert svc.proc is not None, "the service process did not start"
            pid = svc.proc.pid
            stop = threading.Event()
            writers = [Writer(svc.url, f"live-{i}", 1.0 / args.rate, stop) for i in range(args.runs)]
            watched = writers[0].create()
            for w in writers[1:]:
                w.create()
            for w in writers:
                w.run_steps(args.warmup)
            for w in writers:
                w.start()
            time.sleep(2.0)  # the writers in their stride
            t_a = time.time()
            cpu_a = cpu_share(pid, args.seconds, where("a"))
            t_b = time.time()
            with chromium() as driver:
                page = f"/runs/{watched}" if args.page == "run" else f"/groups/{writers[0].group_id}"
                driver.get(svc.url + page)
                wait_ready(driver, 120)
                driver.execute_script("window.hwLiveLog = []; document.body.dataset.livePolls = '0';")
                t_b = time.time()
                cpu_b = cpu_share(pid, args.seconds, where("b"))
                t_c = time.time()
                log = driver.execute_script("return window.hwLiveLog || [];")
                answers = int(driver.execute_script("return document.body.dataset.livePolls || '0';"))
                driver.get("about:blank")
            time.sleep(1.0)
            t_c2 = time.time()
            cpu_c = cpu_share(pid, args.seconds, where("c"))
            t_d = time.time()
            stop.set()
            for w in writers:
                w.join(30)
                if w.error is not None:
                    raise RuntimeError(f"writer {w.run_name} failed: {w.error}")
    first = writers[0]
    painted = sorted((step, at / 1000.0) for run, step, at in log if run == watched)
    lat: list[float] = []
    for step, sent in first.sent.items():
        if not t_b <= sent < t_c - 2.0:  # posted while the page was open, with time to show it
            continue
        shown = next((at for s, at in painted if s >= step), None)
        lat.append(math.inf if shown is None else shown - sent)
    points_s = args.runs * args.rate * len(NAMES) * LAYERS
    print(f"live load: {args.runs} runs x {len(NAMES) * LAYERS} points per logged step, {args.rate:g} steps/s per run "
          f"= {points_s:,.0f} points/s into SQLite; phases of {args.seconds:g} s")  # fmt: skip
    if not lat:
        print("ingest -> pixel: no step was posted while the page was open")
        return 1
    p95 = pct(lat, 0.95)
    print(
        f"ingest -> pixel on an open {args.page} page: p50 {pct(lat, 0.5):.3f} s, p95 {p95:.3f} s, "
        f"max {max(lat):.3f} s "
        f"over {len(lat)} steps (target p95 <= {P95_TARGET_S:g} s: {'MET' if p95 <= P95_TARGET_S else 'NOT MET'})"
    )
    print(f"live answers to the {args.page} page: {answers} in {t_c - t_b:.1f} s ({answers / (t_c - t_b):.2f}/s)")
    base = (cpu_a + cpu_c) / 2
    extra = cpu_b / base - 1
    verdict = "MET" if extra <= CPU_TARGET else "NOT MET"
    print(
        f"service CPU: {cpu_b:.3f} cores with one live page vs {base:.3f} without (mean of {cpu_a:.3f} before, "
        f"{cpu_c:.3f} after) = {extra:+.1%} (target <= +{CPU_TARGET:.0%}: {verdict})"
    )
    ing_a, ing_b = post_median_ms(writers, t_a, t_b), post_median_ms(writers, t_b, t_c)
    ing_c = post_median_ms(writers, t_c2, t_d)
    print(
        f"ingest POST of 512 points, median: {ing_b:.1f} ms with the page vs {ing_a:.1f} / {ing_c:.1f} ms without "
        f"(before / after) = {ing_b / ((ing_a + ing_c) / 2):.2f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
