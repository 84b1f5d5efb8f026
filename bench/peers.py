"""HyperWatch beside its peers on one workload: MLflow (tracking server and direct SQLite), Aim, TensorBoard.

Workload: one run, 8 per-layer indicators x 64 layers per step (512 points), ``--steps`` steps
(default 50 = 25,600 points; ``--full``: 2,000 steps = 1,024,000 points, the issue's workload),
one step per write call for every system (HyperWatch: one HTTP batch per step; MLflow: one
``log_batch`` per step; Aim and TensorBoard: their per-value calls, their own buffering). Figures:
points/s, bytes per point on disk (after a checkpoint / VACUUM for the databases) and the time to
read one series back. The raw floors (SQLite executemany and PostgreSQL COPY, one transaction per
step) run beside them. Systems are interleaved per repetition; medians are printed in one table
with ratios to HyperWatch SQLite.

The peers run in their own virtualenv, never in the project's dependencies:

    bench/peers_env.sh                     # creates .venv-peers with mlflow, aim, tensorboardX
    .venv/bin/python bench/peers.py        # a peer missing from .venv-peers is reported, not run
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.ingest import (
    LAYERS,
    NAMES,
    TOKEN,
    bytes_on_disk,
    fresh,
    http_rate,
    pg_database,
    raw_pg_rate,
    raw_sqlite_rate,
    rows,
    serve,
)
from hyperwatch.monitor.processes.lifetime import die_with_parent

REPO = Path(__file__).resolve().parents[1]
PEERS_PY = REPO / ".venv-peers" / "bin" / "python"
PEERS = ("mlflow-server", "mlflow-sqlite", "aim", "tensorboard")
_PEER_MODULE = {"mlflow-server": "mlflow", "mlflow-sqlite": "mlflow", "aim": "aim", "tensorboard": "tensorboardX"}

# Runs inside .venv-peers: argv = system, directory, steps, layers, names (comma-separated), [server url]
_WORKER = r"""
import json, math, os, sys, time
system, d, steps, layers, names = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split(",")
def value(step, layer):
    return 1.0 + 0.1 * math.sin(step * 0.01 + layer)
def du(path):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)
out = {}
if system.startswith("mlflow"):
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient
    uri = sys.argv[6] if system == "mlflow-server" else "sqlite:///" + os.path.join(d, "mlflow.db")
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.create_experiment("bench")).info.run_id
    t0 = time.perf_counter()
    for s in range(steps):
        ts = int(time.time() * 1000)
        batch = [Metric(f"{n}/{la}", value(s, la), ts, s) for n in names for la in range(layers)]
        client.log_batch(run_id, metrics=batch)
    out["seconds"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = client.get_metric_history(run_id, f"{names[0]}/0")
    out["read_s"], out["read_n"] = time.perf_counter() - t0, len(got)
    out["bytes"] = os.path.getsize(os.path.join(d, "mlflow.db"))
elif system == "aim":
    from aim import Run
    run = Run(repo=d, experiment="bench")
    t0 = time.perf_counter()
    for s in range(steps):
        for n in names:
            for la in range(layers):
                run.track(value(s, la), name=n, step=s, context={"layer": la})
    run.close()
    out["seconds"] = time.perf_counter() - t0
    from aim import Repo
    t0 = time.perf_counter()
    n_read = 0
    for m in Repo(d).query_metrics(f"metric.name == '{names[0]}' and metric.context.layer == 0").iter():
        n_read += len(m.values.values_numpy())
    out["read_s"], out["read_n"] = time.perf_counter() - t0, n_read
    out["bytes"] = du(d)
elif system == "tensorboard":
    from tensorboardX import SummaryWriter
    w = SummaryWriter(d)
    t0 = time.perf_counter()
    for s in range(steps):
        for n in names:
            for la in range(layers):
                w.add_scalar(f"{n}/{la}", value(s, la), s)
    w.close()
    out["seconds"] = time.perf_counter() - t0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    t0 = time.perf_counter()
    acc = EventAccumulator(d, size_guidance={"scalars": 0})
    acc.Reload()
    out["read_s"], out["read_n"] = time.perf_counter() - t0, len(acc.Scalars(f"{names[0]}/0"))
    out["bytes"] = du(d)
print(json.dumps(out))
"""


def peer_available(system: str) -> str | None:
    """None when the peer can run, else why not (in words)."""
    if not PEERS_PY.exists():
        return f"not installed: {PEERS_PY} missing (run bench/peers_env.sh)"
    module = _PEER_MODULE[system]
    done = subprocess.run([str(PEERS_PY), "-c", f"import {module}"], capture_output=True, text=True)
    if done.returncode != 0:
        return f"not installed: import {module} fails in .venv-peers ({done.stderr.strip().splitlines()[-1:]})"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def mlflow_server(directory: Path) -> contextlib.AbstractContextManager[str]:  # type: ignore[misc]
    port = _free_port()
    cmd = [str(PEERS_PY), "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--backend-store-uri", f"sqlite:///{directory / 'mlflow.db'}", "--workers", "1"]
    cmd += ["--default-artifact-root", str(directory / "artifacts")]
    with open(directory / "server.log", "wb") as log:
        proc = subprocess.Popen(die_with_parent(cmd), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600  # slow to start on a loaded machine
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError as exc:
                if time.monotonic() > deadline or proc.poll() is not None:
                    log_tail = (directory / "server.log").read_text()[-2000:]
                    raise RuntimeError("mlflow server did not start: " + log_tail) from exc
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def run_peer(system: str, directory: Path, steps: int) -> dict[str, float]:
    names = ",".join(NAMES)
    args = [str(PEERS_PY), "-c", _WORKER, system, str(directory), str(steps), str(LAYERS), names]
    env = {**os.environ, "PYTHONPATH": ""}
    with contextlib.ExitStack() as stack:
        if system == "mlflow-server":
            args.append(stack.enter_context(mlflow_server(directory)))
        done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=7200)
    if done.returncode != 0:
        raise RuntimeError(f"{system} failed: {done.stderr[-2000:]}")
    out: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def run_hyperwatch(label: str, steps: int, directory: Path) -> dict[str, float]:
    data = rows(steps)
    with contextlib.ExitStack() as stack:
        url = f"sqlite:///{directory / 'hw.db'}" if label == "sqlite" else stack.enter_context(pg_database())
        fresh(url)
        with serve(url) as base:
            rate = http_rate(base, data, len(NAMES) * LAYERS, "peers")
            with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as c:
                run_id = c.get("/api/v1/runs", params={"limit": 1}).json()[0]["id"]
                t0 = time.perf_counter()
                got = c.get(
                    f"/api/v1/runs/{run_id}/series", params={"name": next(iter(NAMES)), "layer": 0, "buckets": 2000}
                )
                read_s = time.perf_counter() - t0
                got.raise_for_status()
        size = bytes_on_disk(url)
    return {"seconds": len(data) / rate, "bytes": size, "read_s": read_s, "read_n": len(got.json()["points"])}


def run_raw(label: str, steps: int, directory: Path) -> dict[str, float]:
    data = rows(steps)
    with contextlib.ExitStack() as stack:
        url = f"sqlite:///{directory / 'raw.db'}" if label == "sqlite" else stack.enter_context(pg_database())
        fresh(url)
        if label == "sqlite":
            rate = raw_sqlite_rate(url.removeprefix("sqlite:///"), data, len(NAMES) * LAYERS, 101)
        else:
            rate = raw_pg_rate(url.replace("+psycopg", ""), data, len(NAMES) * LAYERS, 101)
        size = bytes_on_disk(url)
    return {"seconds": len(data) / rate, "bytes": size}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50, help="steps of 512 points (default 50)")
    ap.add_argument("--full", action="store_true", help="2,000 steps = 1,024,000 points (takes long)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--no-pg", action="store_true")
    ap.add_argument("--only", nargs="*", help="run only these systems (names as in the table)")
    args = ap.parse_args()
    steps = 2000 if args.full else args.steps
    n_points = steps * len(NAMES) * LAYERS
    systems = ["hyperwatch-sqlite", "hyperwatch-postgresql", "raw-sqlite", "raw-postgresql", *PEERS]
    if args.no_pg:
        systems = [s for s in systems if "postgresql" not in s]
    if args.only:
        systems = [s for s in systems if s in args.only]
    skipped = {s: why for s in systems if s in PEERS and (why := peer_available(s)) is not None}
    results: dict[str, list[dict[str, float]]] = {s: [] for s in systems if s not in skipped}
    for _ in range(args.repeats):
        for system in results:
            with tempfile.TemporaryDirectory() as d:
                directory = Path(d)
                if system.startswith("hyperwatch-"):
                    results[system].append(run_hyperwatch(system.split("-", 1)[1], steps, directory))
                elif system.startswith("raw-"):
                    results[system].append(run_raw(system.split("-", 1)[1], steps, directory))
                else:
                    results[system].append(run_peer(system, directory, steps))
    print(f"workload: {steps} steps x {len(NAMES)} indicators x {LAYERS} layers = {n_points:,} points, 1 step per call")
    print(f"{'system':<24}{'points/s':>12}{'x HW-SQLite':>13}{'bytes/point':>13}{'read one series':>18}")
    base = None
    if "hyperwatch-sqlite" in results:
        base = n_points / statistics.median(r["seconds"] for r in results["hyperwatch-sqlite"])
    for system, runs in results.items():
        rate = n_points / statistics.median(r["seconds"] for r in runs)
        bpp = statistics.median(r["bytes"] for r in runs) / n_points
        ratio = f"{rate / base:.2f}x" if base else "-"
        read = "-"
        if "read_s" in runs[0] and runs[0]["read_n"] == 0:
            read = "  none read back"  # said, not hidden: e.g. Aim's query API returned nothing here
        elif "read_s" in runs[0]:
            read = f"{statistics.median(r['read_s'] for r in runs) * 1000:.1f} ms ({int(runs[0]['read_n'])})"
        print(f"{system:<24}{rate:>12,.0f}{ratio:>13}{bpp:>13.1f}{read:>18}")
    for system, why in skipped.items():
        print(f"{system:<24} {why}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
