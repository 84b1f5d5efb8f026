"""``hyperwatch demo``: the main job in one command, on the embedded default (SQLite).

1. starts the service on a SQLite file (schema upgraded first), bound to localhost;
2. runs a small cross-scale MuonH+HyperP MoE sweep (``configs/cpu/demo_moe_depth.toml``: three
   depths) on a real corpus every machine has (the Python standard library's own source), each
   run streaming its per-layer indicators through the hooks into the service;
3. prints each run's loss curve and the dashboard URL, then keeps serving until Ctrl-C.

``HYPERWATCH_DEMO_FAST=1`` (or ``--fast``) makes a short version for tests; ``--no-serve`` stops
the service when the sweep is done.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from hyperwatch.trainer.config import ConfigError
from hyperwatch.trainer.sweep import Sweep, SweepRun, load_sweep, run_sweep

BARS = " ▁▂▃▄▅▆▇█"
DEMO_SWEEP = Path(__file__).resolve().parent.parent / "configs" / "cpu" / "demo_moe_depth.toml"


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


def free_port(host: str, preferred: int) -> int:
    """``preferred`` when it is free, else any free port."""
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise OSError(f"no free port on {host}")


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the service exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"the service at {url} was not ready after {timeout:.0f} s")


def start_service(db_url: str, host: str, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    hw = [sys.executable, "-m", "hyperwatch"]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    upgrade = subprocess.run([*hw, "db", "upgrade", "--db", db_url], capture_output=True, text=True)
    if upgrade.returncode != 0:
        raise RuntimeError(f"'hyperwatch db upgrade' failed: {upgrade.stderr.strip()[-500:]}")
    out = open(log_path, "ab")  # noqa: SIM115 - lives as long as the service
    return subprocess.Popen(
        [*hw, "serve", "--db", db_url, "--host", host, "--port", str(port), "--dev"],
        stdout=out,
        stderr=subprocess.STDOUT,
    )


def read_losses(folder: Path) -> list[float]:
    """The run's per-step losses from its checkpoint (written by the trainer)."""
    import torch

    path = folder / "checkpoint.pt"
    if not path.exists():
        return []
    state = torch.load(path, map_location="cpu", weights_only=False)
    return [float(v) for _, v in state["losses"]]


def report(sweep: Sweep, runs: list[SweepRun]) -> None:
    print()
    print(f"sweep {sweep.name}: {len(runs)} runs")
    for r in runs:
        losses = read_losses(sweep.folder / r.name)
        curve = f"{losses[0]:.3f} -> {losses[-1]:.3f}  {sparkline(losses)}" if losses else "(no losses)"
        val = f"{r.val_loss:.4f}" if isinstance(r.val_loss, float) else str(r.val_loss)
        print(f"  {r.status:>8}  {r.name:<16} val_loss {val:<8} loss {curve}")


def group_page(url: str, group: str) -> str:
    """The scale-comparison page of ``group`` (the runs page when the group cannot be found)."""
    import json

    try:
        with urllib.request.urlopen(f"{url}/api/v1/groups", timeout=5) as resp:
            groups = json.loads(resp.read())
    except (OSError, ValueError):
        return f"{url}/runs"
    ids = [g["id"] for g in groups if g.get("name") == group]
    return f"{url}/groups/{ids[0]}" if ids else f"{url}/runs"


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Service on SQLite and a sweep streaming into it.")
    p.add_argument("--fast", action="store_true", help="a short version for tests (also HYPERWATCH_DEMO_FAST=1)")
    p.add_argument("--out", default="runs/demo", help="folder for the database, checkpoints and logs")
    p.add_argument("--host", default="127.0.0.1", help="address the service binds to (localhost by default)")
    p.add_argument("--port", type=int, default=8000, help="service port (another free one if taken)")
    p.add_argument("--no-serve", action="store_true", help="stop the service when the sweep is done")
    p.add_argument("--sweep", default=str(DEMO_SWEEP), help="the sweep file to run")
    return p


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    fast = args.fast or os.environ.get("HYPERWATCH_DEMO_FAST", "") not in ("", "0")
    if not 0 < args.port < 65536:
        print("hyperwatch demo: --port must be in 1..65535", file=sys.stderr)
        return 2
    out = Path(args.out)
    try:
        sweep = load_sweep(args.sweep)
    except ConfigError as exc:
        print(f"hyperwatch demo: {exc}", file=sys.stderr)
        return 2
    if fast:
        sweep.base.setdefault("train", {}).update(tokens=32768, eval_every=2, eval_batches=4)
        sweep.base.setdefault("data", {}).update(max_bytes=1_000_000)
        sweep.name += "-fast"
        for r in sweep.runs:
            r.name = r.name.replace(sweep.name[: -len("-fast")], sweep.name, 1)
    sweep.out_dir = str(out / "sweeps")
    port = free_port(args.host, args.port)
    url = f"http://{args.host}:{port}"
    db_url = f"sqlite:///{(out / 'hyperwatch.db').resolve()}"
    try:
        service = start_service(db_url, args.host, port, out / "service.log")
    except RuntimeError as exc:
        print(f"hyperwatch demo: {exc}", file=sys.stderr)
        return 1
    try:
        wait_ready(url, service)
        print(f"service on {url} (database {db_url})")
        sweep.server = url
        results = run_sweep(sweep)
        report(sweep, results)
        print()
        print(f"dashboard: {group_page(url, sweep.name)}   runs: {url}/runs   API: {url}/docs")
        if args.no_serve:
            return 1 if any(r.status == "failed" for r in results) else 0
        print("serving until Ctrl-C")
        service.wait()
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        if service.poll() is None:
            service.send_signal(signal.SIGINT)
            try:
                service.wait(timeout=10)
            except subprocess.TimeoutExpired:
                service.kill()
