"""Live charts under load: from a point's ingest to its pixel, and what an open live page costs the service.

``hyperwatch serve`` runs as its own process on a SQLite file; 8 runs stream 512 points per logged
step each (8 indicators x 64 layers, bench/ingest.py's workload) over keep-alive HTTP, one writer
thread per run, each logging a step every ``1/--rate`` s. Phases of ``--seconds`` each, one after
the other in one invocation:

1. no page open: the service's CPU (user + system time of its process / wall time);
2. one run page open in headless Chromium (``/runs/{id}`` of the first run, live: its stream of news
   sends at most every 0.4 s; ``--page group``: the scale page of the 8 runs, at most every 0.5 s): the
   service's CPU again, and for each step of that run posted meanwhile, the time from the POST being
   sent to the page's first paint that shows it (the page logs ``[run, step, epoch ms]`` two
   animation frames after drawing a live answer: ``window.hwLiveLog``); p50 / p95 / max;
3. the page closed: the CPU once more. Each page phase is judged against the mean of the phases
   without it on either side, so a drift of the machine's load does not read as the page's cost.

``--rounds N`` repeats 2 and 3 N times (the page's figure is then the mean over its N phases, each
against its neighbours): on a shared 2-core machine one phase's CPU drifts by +-10 %, and the
service's CPU grows as the database does.
``--control`` adds to each round a phase with the same page drawn once without live news
(``?live=0``) and its figures redrawn at the live page's pace: the browser then loads the cores as
much as the live page does (about 0.25 cores here) without asking the service anything. On this
machine the browser shares the service's 2 cores, and that alone costs the service CPU (contention:
caches, scheduling); the line "the live answers net of it" is the live page's figure minus the
control's, what the answers themselves cost the service.

Ingest is measured in every phase too (the writers' POST time, median): a live page must not slow it.
``--stacks DIR`` keeps py-spy's raw stacks of each phase (``off0.txt``, ``live0.txt``, ...; the
sampling costs the service CPU too, the same in every phase, so the CPU figures read higher).
Targets (issue 24): p95 <= 1 s; the page adds <= 10 % to the service's CPU.

    .venv/bin/python bench/live.py                 # 8 runs x 512 points/step, 2 steps/s per run, 30 s phases
    .venv/bin/python bench/live.py --rate 1 --seconds 20
    .venv/bin/python bench/live.py --page group    # the scale page of the 8 runs instead
    .venv/bin/python bench/live.py --rounds 4 --seconds 20   # 4 page phases between 5 without
    .venv/bin/python bench/live.py --rounds 3 --seconds 20 --control   # and 3 control phases
"""

from __future__ import annotations

import argparse
import contextlib
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
from dataclasses import dataclass
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


def start_writers(base: str, prefix: str, args: argparse.Namespace, stop: threading.Event) -> tuple[list[Writer], int]:
    """``args.runs`` writers, each run created and holding ``args.warmup`` steps, then streaming at
    ``args.rate``; and the first run's id (the watched one)."""
    writers = [Writer(base, f"{prefix}-{i}", 1.0 / args.rate, stop) for i in range(args.runs)]
    watched = writers[0].create()
    for w in writers[1:]:
        w.create()
    for w in writers:
        w.run_steps(args.warmup)
    for w in writers:
        w.start()
    return writers, watched


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU seconds of ``root``'s descendants now alive (the browser's processes)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, todo = 0.0, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        with contextlib.suppress(OSError):  # it ended meanwhile
            total += cpu_seconds(pid)
    return total


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


@dataclass
class Phase:
    """One phase with a page open: the service's CPU share, the index of the phase without the page
    before it, the browser's CPU share, the writers' median POST ms, when it opened and closed (epoch
    s), the live answers drawn and the page's paint log."""

    cpu: float
    before: int
    browser: float
    ingest_ms: float
    opened: float
    closed: float
    answers: int
    log: list[list[float]]

    def extra(self, off: list[float]) -> float:
        """Against the mean of the phases without the page on either side of it."""
        return self.cpu / ((off[self.before] + off[self.before + 1]) / 2) - 1


REDRAW = """
const ms = arguments[0];
setInterval(() => { for (const d of document.querySelectorAll(".fig")) if (d.data) HW.redraw(d); }, ms);
"""
"""The control page's drawing: every figure redrawn at the live page's pace (HW.redraw skips the ones
out of view, as for live answers)."""


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
    ap.add_argument("--rounds", type=int, default=1,
                    help="page phases, each between two without it (default 1: without, with, without)")  # fmt: skip
    ap.add_argument("--control", action="store_true",
                    help="each round also opens the page without live news, redrawn at its pace")  # fmt: skip
    ap.add_argument("--stacks", type=Path, help="keep py-spy's raw stacks of each phase here (off0.txt, live0.txt, "
                    "...); the sampling costs CPU too, the same in every phase")  # fmt: skip
    args = ap.parse_args()
    kinds = ["live", "control"] if args.control else ["live"]
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
            writers, watched = start_writers(svc.url, "live", args, stop)
            time.sleep(2.0)  # the writers in their stride
            gap_ms = 400 if args.page == "run" else 500  # the page's own pace (web/static/run.js, group.js)
            t0 = time.time()
            off: list[float] = [cpu_share(pid, args.seconds, where("off0"))]
            off_ing = [post_median_ms(writers, t0, time.time())]
            phases: dict[str, list[Phase]] = {kind: [] for kind in kinds}
            with chromium() as driver:
                page = f"/runs/{watched}" if args.page == "run" else f"/groups/{writers[0].group_id}"
                for r in range(args.rounds):
                    for kind in kinds:
                        driver.get(svc.url + page + ("?live=0" if kind == "control" else ""))
                        wait_ready(driver, 120)
                        driver.execute_script("window.hwLiveLog = []; document.body.dataset.livePolls = '0';")
                        if kind == "control":  # the live page's drawing, without its answers
                            driver.execute_script(REDRAW, gap_ms)
                        t_b, browser0 = time.time(), tree_cpu_seconds(driver.service.process.pid)
                        cpu = cpu_share(pid, args.seconds, where(f"{kind}{r}"))
                        t_c = time.time()
                        browser = (tree_cpu_seconds(driver.service.process.pid) - browser0) / (t_c - t_b)
                        log = driver.execute_script("return window.hwLiveLog || [];")
                        answers = int(driver.execute_script("return document.body.dataset.livePolls || '0';"))
                        driver.get("about:blank")
                        ing = post_median_ms(writers, t_b, t_c)
                        phases[kind].append(Phase(cpu, len(off) - 1, browser, ing, t_b, t_c, answers, log))
                        time.sleep(1.0)
                        t_d = time.time()
                        off.append(cpu_share(pid, args.seconds, where(f"off{len(off)}")))
                        off_ing.append(post_median_ms(writers, t_d, time.time()))
            stop.set()
            for w in writers:
                w.join(30)
                if w.error is not None:
                    raise RuntimeError(f"writer {w.run_name} failed: {w.error}")
    live = phases["live"]
    painted = sorted((step, at / 1000.0) for ph in live for run, step, at in ph.log if run == watched)
    lat: list[float] = []
    slow: list[tuple[float, int, float]] = []  # (latency, step, s after its page opened)
    steady: list[float] = []  # of steps posted after the page's first live answer was drawn
    for step, sent in writers[0].sent.items():
        ph = next((ph for ph in live if ph.opened <= sent < ph.closed - 2.0), None)
        if ph is None:  # posted while the page was open, with time to show it
            continue
        shown = next((at for s, at in painted if s >= step), None)
        lat.append(math.inf if shown is None else shown - sent)
        slow.append((lat[-1], step, sent - ph.opened))
        if ph.log and sent >= ph.log[0][2] / 1000.0:
            steady.append(lat[-1])
    points_s = args.runs * args.rate * len(NAMES) * LAYERS
    print(f"live load: {args.runs} runs x {len(NAMES) * LAYERS} points per logged step, {args.rate:g} steps/s per run "
          f"= {points_s:,.0f} pts/s into SQLite; {args.seconds:g} s phases ({args.rounds} with the page)")  # fmt: skip
    if not lat:
        print("ingest -> pixel: no step was posted while the page was open")
        return 1
    p95 = pct(lat, 0.95)
    print(
        f"ingest -> pixel on an open {args.page} page: p50 {pct(lat, 0.5):.3f} s, p95 {p95:.3f} s, "
        f"max {max(lat):.3f} s "
        f"over {len(lat)} steps (target p95 <= {P95_TARGET_S:g} s: {'MET' if p95 <= P95_TARGET_S else 'NOT MET'})"
    )
    if steady:
        print(f"  of them the {len(steady)} posted after the page drew its first live answer: p50 "
              f"{pct(steady, 0.5):.3f} s, p95 {pct(steady, 0.95):.3f} s, max {max(steady):.3f} s")  # fmt: skip
    print("slowest steps: " + ", ".join(f"step {st} {la:.2f} s ({at:.1f} s after its page opened)"
                                        for la, st, at in sorted(slow, reverse=True)[:5]))  # fmt: skip
    opened = sum(ph.closed - ph.opened for ph in live)
    answers = sum(ph.answers for ph in live)
    print(f"live answers to the {args.page} page: {answers} in {opened:.1f} s ({answers / opened:.2f}/s)")
    base = statistics.mean(off)
    fmt = lambda xs, f=".3f": " / ".join(f"{x:{f}}" for x in xs)  # noqa: E731
    on = statistics.mean(ph.cpu for ph in live)
    extra = statistics.mean(ph.extra(off) for ph in live)  # each against its neighbours: a drift cancels
    verdict = "MET" if extra <= CPU_TARGET else "NOT MET"
    each = f" (the mean of each page phase against its neighbours: {fmt([ph.extra(off) for ph in live], '+.1%')})"
    print(
        f"service CPU: {on:.3f} cores with one live page vs {base:.3f} without (pages: {fmt([ph.cpu for ph in live])}; "
        f"without: {fmt(off)}) = {extra:+.1%}{each if args.rounds > 1 else ''} "
        f"(target <= +{CPU_TARGET:.0%}: {verdict})"
    )
    browser = statistics.mean(ph.browser for ph in live)
    print(f"the browser meanwhile (on the same {os.cpu_count()} cores): {browser:.3f} cores")
    if args.control:
        control = phases["control"]
        c_on = statistics.mean(ph.cpu for ph in control)
        c_extra = statistics.mean(ph.extra(off) for ph in control)
        print(
            f"control, the page drawing at its pace without asking the service (?live=0, figures redrawn every "
            f"{gap_ms} ms; the browser {statistics.mean(ph.browser for ph in control):.3f} cores): {c_on:.3f} cores "
            f"= {c_extra:+.1%} (the browser's load on the shared cores; each: "
            f"{fmt([ph.extra(off) for ph in control], '+.1%')}); the live answers net of it: {extra - c_extra:+.1%}"
        )
    ing_on, ing_off = statistics.mean(ph.ingest_ms for ph in live), statistics.mean(off_ing)
    print(
        f"ingest POST of 512 points, median: {ing_on:.1f} ms with the page vs {ing_off:.1f} ms without "
        f"(with: {fmt([ph.ingest_ms for ph in live], '.1f')}; without: {fmt(off_ing, '.1f')}) = {ing_on / ing_off:.2f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
