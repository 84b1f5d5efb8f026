"""Where the service's time goes per ingested batch: py-spy on ``hyperwatch serve`` under bench load.

Starts the service on a fresh database (SQLite or PostgreSQL), attaches ``py-spy record`` (raw
collapsed stacks, idle threads excluded) to its process, posts pre-encoded batches of the
bench/ingest.py workload, and sorts every sample into one stage of the hot path by the innermost
frame that names one (our own functions first, then the library the frame lives in). Prints the
share of samples and the CPU milliseconds per batch of each stage; ``--stacks`` keeps the collapsed stacks (flame
graph input. py-spy samples the process from outside (no instrumentation in the service).

    .venv/bin/python bench/ingest_profile.py                        # SQLite, 1 step (512 points)/batch
    .venv/bin/python bench/ingest_profile.py --db postgresql --batch 4096 --stacks /tmp/pg.txt
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench.ingest
from bench.ingest import TOKEN, Row, chunks, encode, fresh, pg_database, rows
from hyperwatch.monitor.processes.children import ServiceProcess

# (stage, markers): a frame "func (path:line)" belongs to the stage of the first marker it contains.
# Our own functions are looked for first (innermost wins), so SQL run by the rollups counts as rollups.
OWN_STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("store: rollups (seal)", ("seal_rollups ",)),
    ("store: chunks sealed", ("store_sealed ", "seal_appended ")),
    ("store: points insert", ("_insert_points ", "append (hyperwatch/monitor/store/pending")),
    ("store: run lock + progress", ("lock_run ",)),
    ("store: series steps (cache miss)", ("latest_steps ",)),
    ("store: latest values", ("_write_latest ",)),
    ("store: row building", ("SortedBatch.of ", "point_rows ")),
    ("store: claim batch id", ("claim_batch ",)),
    ("store: other point work", ("write_points ", "store_points ")),
    ("detector (incl. window read)", ("detect ",)),
    ("store: alerts insert", ("_insert_alerts ",)),
    ("store: name ids", ("_name_id ",)),
    ("store: begin/commit", ("managed ",)),
    ("store: transaction (ingest)", ("_ingest ",)),
    ("parse + validate body", ("parse_batch ", "_fast_batch ", "decode_batch ", "read_batch ")),
    ("route: other", ("ingest (",)),
]
LIB_STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("JSON parse (stdlib json)", ("/json/",)),
    ("prometheus counters/timing", ("prometheus_client", "RequestTiming")),
    ("pydantic", ("pydantic",)),
    ("HTTP (uvicorn/h11/httptools)", ("/h11/", "uvicorn", "httptools")),
    ("FastAPI/Starlette routing+deps", ("fastapi", "starlette")),
    ("threadpool hop (anyio)", ("anyio",)),
    ("asyncio event loop", ("asyncio", "selectors")),
    ("SQL outside the route", ("sqlalchemy", "sqlite3", "psycopg")),
]
IDLE = "idle (waiting for a request / for work)"
# py-spy's own idle detection misses these here (a thread blocked in epoll or on a Condition)
IDLE_LEAVES = ("EpollSelector.select", "Condition.wait (", "Event.wait (", "Queue.get (")


def stage_of(stack: str) -> str:
    frames = stack.split(";")
    if any(mark in frames[-1] for mark in IDLE_LEAVES):
        return IDLE
    for frame in reversed(frames):
        if "hyperwatch" in frame or "/monitor/" in frame:
            for stage, marks in OWN_STAGES:
                if any(m in frame for m in marks):
                    return stage
    for frame in reversed(frames):
        for stage, marks in LIB_STAGES:
            if any(m in frame for m in marks):
                return stage
    return "other"


def parse_raw(path: Path) -> Counter[str]:
    """py-spy's raw output: one ``frame;frame;... count`` line per distinct stack."""
    out: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            out[stage_of(stack)] += int(n)
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def post_all(base: str, bodies: list[tuple[bytes, str]]) -> float:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=base, headers=headers, timeout=120) as c:
        t0 = time.perf_counter()
        for body, kind in bodies:
            c.post("/api/v1/points", content=body, headers={"Content-Type": kind}).raise_for_status()
        return time.perf_counter() - t0


def encode_all(data: list[Row], batch: int, run: str) -> list[tuple[bytes, str]]:
    return [encode(part, run) for part in chunks(data, batch)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    ap.add_argument("--steps", type=int, default=200, help="steps of 512 points (default 200)")
    ap.add_argument("--batch", type=int, default=512, help="points per POST (default 512: one step)")
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second (default 250)")
    ap.add_argument("--stacks", type=Path, help="also keep the collapsed stacks here (flamegraph.pl, speedscope)")
    ap.add_argument("--body", choices=("json", "columns"), default="json", help="HTTP body (default json)")
    args = ap.parse_args()
    bench.ingest.BODY = args.body
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    data = rows(args.steps)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        url = f"sqlite:///{tmp / 'p.db'}" if args.db == "sqlite" else stack.enter_context(pg_database())
        fresh(url)
        svc = stack.enter_context(
            ServiceProcess(
                url,
                dev=False,
                upgrade=False,
                extra_args=("--log-level", "warning"),
                env={"HYPERWATCH_WRITE_TOKEN": TOKEN},
                ready_path="/healthz",
                timeout=600.0,
            )
        )
        assert svc.proc is not None
        with httpx.Client(base_url=svc.url, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            c.post("/api/v1/runs", json={"name": "warm"}).raise_for_status()
            c.post("/api/v1/runs", json={"name": "prof"}).raise_for_status()
        post_all(svc.url, encode_all(rows(4), args.batch, "warm"))  # imports, caches
        bodies = encode_all(data, args.batch, "prof")
        raw = tmp / "stacks.txt"
        cmd = [spy, "record", "--pid", str(svc.proc.pid), "--rate", str(args.rate), "--format", "raw", "-o", str(raw)]
        spy_proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # py-spy attaches
        cpu0 = cpu_seconds(svc.proc.pid)
        wall = post_all(svc.url, bodies)
        cpu = cpu_seconds(svc.proc.pid) - cpu0
        spy_proc.send_signal(signal.SIGINT)
        _, err = spy_proc.communicate(timeout=60)
        if not raw.exists():
            raise SystemExit(f"py-spy wrote nothing: {err.decode(errors='replace')[-1000:]}")
        if args.stacks:
            shutil.copy(raw, args.stacks)
        counts = parse_raw(raw)
    idle = counts.pop(IDLE, 0)
    total = sum(counts.values())
    n = len(bodies)
    busy = total / args.rate / n * 1000
    print(
        f"py-spy on hyperwatch serve ({args.db}, {args.body}), {n} batches x {args.batch} points: "
        f"HTTP {len(data) / wall:,.0f} pts/s, {wall / n * 1000:.1f} ms/batch wall, "
        f"service CPU {cpu / n * 1000:.2f} ms/batch (/proc); "
        f"{total} busy samples at {args.rate} Hz ({busy:.2f} ms/batch, {idle} idle left out)"
    )
    for stage, k in counts.most_common():
        print(f"  {stage:34s} {100 * k / total:5.1f}%  {k / args.rate / n * 1000:6.2f} ms/batch")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
