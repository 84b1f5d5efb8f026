"""``hyperwatch demo``: the main job in one command: an instability caught live, across scales.

1. starts the service on a SQLite file (schema upgraded first), bound to localhost, creates the two
   groups (with the default detector thresholds) and prints the dashboard URLs before anything trains;
2. starts Prometheus and Alertmanager as child processes when they are installed (Debian's
   ``prometheus`` and ``prometheus-alertmanager``): Prometheus scrapes the service and evaluates
   ``prometheus/rules.yml`` (every ``for:`` shortened; the Z-spike baseline is counted in steps, so
   it fires at the demo's pace as in production), Alertmanager posts what fires to the service;
3. trains two arms across the same depths (2, 3 and 4), side by side (one process each, with an
   equal share of the CPU cores as PyTorch threads), on a real corpus every machine has (the
   Python standard library's own source):

   - ``configs/cpu/demo_hyperp.toml``: MuonH + HyperP with QK-Norm, its LR swept at depth 2 and
     transferred by HyperP's rule, whose indicators stay bounded and do not grow with depth
     (verdict "transferable") and whose loss is the better one at every depth;
   - ``configs/cpu/demo_baseline.toml``: MuonH without HyperP (no LR transfer across depth) and
     without QK-Norm at a too-high learning rate, whose attention Z-value explodes (incidents
     from the service's detectors, e.g. ``logit_ceiling`` and ``z_growth``, and firing Prometheus
     rules delivered by Alertmanager; "breaks" across depth) and whose loss ends 0.17-0.26 nats
     behind HyperP's, more with depth: a run gone wrong by the benchmark's rule (issue 33), so
     its alerts are hits;

   each run prints a live line per logged step (step/total, loss, attention Z, tokens/s, ETA),
   also written to its ``train.log``;
4. prints each run's loss curve, each arm's verdict, the alerts by source, and keeps serving until
   Ctrl-C (runs stopped by Ctrl-C are marked "interrupted" and resume on the next ``make demo``).

``HYPERWATCH_DEMO_FAST=1`` (or ``--fast``) is the short version (depths 2 and 4, 16 steps) the
end-to-end test runs; ``--no-serve`` stops everything when the runs are done.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hyperwatch.monitor.processes.children import AlertingStack, ChildProcessError, ServiceProcess, alerting_available
from hyperwatch.trainer.config import ConfigError
from hyperwatch.trainer.sweep import Sweep, SweepRun, expand, load_sweep, run_sweep, threads_per_run

BARS = " ▁▂▃▄▅▆▇█"
CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "cpu"
DEMO_SWEEPS = (CONFIGS / "demo_hyperp.toml", CONFIGS / "demo_baseline.toml")
FAST_TOKENS = 131072  # 16 steps of 8192 tokens
FAST_DEPTHS = (2, 4)
DEMO_THRESHOLDS: dict[str, float] = {}
"""No demo-only thresholds (issue 21): the demo's groups use the defaults of
monitor/thresholds/defaults.py, so what the demo shows is what a user's run gets. The logit ceiling and
the growth rule need no long history, so the demo's blow-up is warned on its time scale with them."""


def sparkline(values: list[float], width: int = 50) -> str:
    """A one-line chart of ``values`` resampled to ``width`` columns (NaN/Inf shown as '!')."""
    if not values:
        return ""
    step = max(1, len(values) // width)
    pts = [values[i] for i in range(0, len(values), step)]
    finite = [v for v in pts if v == v and abs(v) != float("inf")]
    if not finite:
        return "!" * len(pts)
    lo, hi = min(finite), max(finite)
    span = (hi - lo) or 1.0
    return "".join(
        "!" if v != v or abs(v) == float("inf") else BARS[1 + int((v - lo) / span * (len(BARS) - 2))] for v in pts
    )


def read_losses(folder: Path) -> list[float]:
    """The run's per-step losses from its checkpoint (written by the trainer)."""
    import torch

    path = folder / "checkpoint.pt"
    if not path.exists():
        return []
    state = torch.load(path, map_location="cpu", weights_only=False)
    return [float(v) for _, v in state["losses"]]


def _api(url: str, path: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{url}{path}", data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def create_groups(url: str, sweeps: list[Sweep]) -> dict[str, int]:
    """Each arm's group, created before training with the demo thresholds; name -> id."""
    ids = {}
    for sweep in sweeps:
        desc = f"hyperwatch demo: {sweep.base.get('optim', {}).get('arm')} arm, depths {sweep.grid.get('depth')}"
        group = _api(url, "/api/v1/groups", {"name": sweep.name, "description": desc, "thresholds": DEMO_THRESHOLDS})
        ids[sweep.name] = int(group["id"])
    return ids


def report(url: str, sweeps: list[Sweep], results: dict[str, list[SweepRun]], groups: dict[str, int]) -> None:
    print()
    for sweep in sweeps:
        runs = results.get(sweep.name, [])
        print(f"{sweep.name}: {len(runs)} runs")
        for r in runs:
            losses = read_losses(sweep.folder / r.name)
            curve = f"{losses[0]:.3f} -> {losses[-1]:.3f}  {sparkline(losses)}" if losses else "(no losses)"
            val = f"{r.val_loss:.4f}" if isinstance(r.val_loss, float) else str(r.val_loss)
            print(f"  {r.status:>11}  {r.name:<20} val_loss {val:<8} loss {curve}")
        try:
            stab = _api(url, f"/api/v1/groups/{groups[sweep.name]}/stability?name=attention_z")
            z = (stab.get("report") or {}).get("indicators", {}).get("attention_z", {})
            print(f"  attention Z across depths: {z.get('verdict', 'n/a')}  peaks {z.get('peak', {}).get('values')}")
        except (OSError, ValueError) as exc:
            print(f"  (no verdict: {exc})")
    try:
        alerts = _api(url, "/api/v1/alerts?limit=1000")
    except (OSError, ValueError):
        alerts = []
    by_source: dict[str, int] = {}
    for a in alerts:
        by_source[a["source"]] = by_source.get(a["source"], 0) + 1
    print(f"alerts: {by_source or 'none'}")


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description="Service on SQLite and two arms across scales streaming into it."
    )
    p.add_argument("--fast", action="store_true", help="a short version for tests (also HYPERWATCH_DEMO_FAST=1)")
    p.add_argument("--out", default="runs/demo", help="folder for the database, checkpoints and logs")
    p.add_argument("--host", default="127.0.0.1", help="address the service binds to (localhost by default)")
    p.add_argument("--port", type=int, default=8000, help="service port (another free one if taken)")
    p.add_argument("--no-serve", action="store_true", help="stop the service when the runs are done")
    p.add_argument("--no-prometheus", action="store_true", help="do not start Prometheus and Alertmanager")
    p.add_argument("--sweep", action="append", default=None, help="a sweep file to run (repeat; default: the two arms)")
    return p


def _load(args: argparse.Namespace, fast: bool, out: Path) -> list[Sweep]:
    sweeps = [load_sweep(path) for path in (args.sweep or DEMO_SWEEPS)]
    threads = threads_per_run(len(sweeps))
    for sweep in sweeps:
        sweep.base.setdefault("train", {}).setdefault("threads", threads)
        if fast:
            sweep.base.setdefault("train", {}).update(tokens=FAST_TOKENS, eval_every=8, eval_batches=4)
            sweep.base.setdefault("data", {}).update(max_bytes=1_000_000)
            if "depth" in sweep.grid:
                sweep.grid["depth"] = [d for d in sweep.grid["depth"] if d in FAST_DEPTHS] or sweep.grid["depth"][:1]
            sweep.name += "-fast"
            sweep.runs = expand(sweep)
        sweep.out_dir = str(out / "sweeps")
    return sweeps


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    fast = args.fast or os.environ.get("HYPERWATCH_DEMO_FAST", "") not in ("", "0")
    if not 0 < args.port < 65536:
        print("hyperwatch demo: --port must be in 1..65535", file=sys.stderr)
        return 2
    out = Path(args.out)
    try:
        sweeps = _load(args, fast, out)
    except ConfigError as exc:
        print(f"hyperwatch demo: {exc}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    db_url = f"sqlite:///{(out / 'hyperwatch.db').resolve()}"
    service = ServiceProcess(db_url, host=args.host, port=args.port, log_path=out / "service.log")
    stack: AlertingStack | None = None
    try:
        service.start()
        url = service.url
        groups = create_groups(url, sweeps)
        print(f"HyperWatch dashboard: {url}/runs   (database {db_url})", flush=True)
        for sweep in sweeps:
            print(f"  scale page {sweep.name}: {url}/groups/{groups[sweep.name]}", flush=True)
        print(f"  alerts: {url}/alerts   API: {url}/docs", flush=True)
        missing = "--no-prometheus" if args.no_prometheus else alerting_available()
        if missing is None:
            stack = AlertingStack(url, log_dir=out / "alerting").start()
            print(f"  Prometheus {stack.prometheus_url}/alerts   Alertmanager {stack.alertmanager_url}", flush=True)
        else:
            print(f"  (Prometheus and Alertmanager not started: {missing}; the service's detector still alerts)")
        lock = threading.Lock()

        def show(line: str) -> None:
            with lock:
                print(f"  {line}", flush=True)

        for sweep in sweeps:
            sweep.server, sweep.on_progress = url, show
        with ThreadPoolExecutor(max_workers=len(sweeps)) as pool:  # the arms side by side
            done = dict(zip([s.name for s in sweeps], pool.map(run_sweep, sweeps), strict=True))
        report(url, sweeps, done, groups)
        if stack is not None:
            print(f"Prometheus alerts firing now: {stack.firing() or 'none (they resolve once a run ends)'}")
        print(f"\ndashboard: {url}/groups/{groups[sweeps[-1].name]}   runs: {url}/runs   alerts: {url}/alerts")
        failed = any(r.status == "failed" for rs in done.values() for r in rs)
        if args.no_serve:
            return 1 if failed else 0
        print("serving until Ctrl-C", flush=True)
        assert service.proc is not None
        service.proc.wait()
        return 0
    except ChildProcessError as exc:
        print(f"hyperwatch demo: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted: runs stopped by Ctrl-C are marked 'interrupted' and resume next time")
        return 130
    finally:
        if stack is not None:
            stack.stop()
        service.stop()
