"""``hyperwatch sweep CONFIG.toml``: a grid of training runs across scales, one subprocess each.

A sweep file has three tables::

    [sweep]                      # name = the group the runs are compared in
    name = "moe-depth"
    server = "http://127.0.0.1:8000"   # optional; --server overrides; "" = JSONL under out_dir
    workers = 1                   # runs at a time
    launcher = ""                 # e.g. "torchrun --nproc_per_node 8" on a GPU node
    out_dir = "sweeps"

    [base]                        # an ordinary run config: preset, [base.model], [base.optim], ...
    preset = "tiny"

    [grid]                        # the axes; every combination is one run
    depth = [2, 4, 6]             # -> model.depth
    lr = [0.01, 0.02]             # -> optim.lr ; also tokens, tpp, arm, moe_sparsity,
                                  #    moe_granularity, aux_loss_gamma, or any "section.key"

Each run streams its indicators through the hooks, tagged with the group and its scale fields
(params, tokens, FLOPs). A run that crashes is marked failed in the service and the sweep goes
on. Re-running a sweep skips finished runs and resumes unfinished ones from their checkpoints.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import tomllib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyperwatch.monitor.processes.lifetime import die_with_parent
from hyperwatch.trainer.config import SECTIONS, ConfigError, build_config, parse_scalar

log = logging.getLogger(__name__)

AXES = {
    "depth": "model.depth",
    "lr": "optim.lr",
    "tokens": "train.tokens",
    "tpp": "train.tpp",
    "arm": "optim.arm",
    "moe_sparsity": "model.moe_sparsity",
    "moe_granularity": "model.moe_granularity",
    "aux_loss_gamma": "model.aux_loss_gamma",
    "batch_tokens": "train.batch_tokens",
}
SHORT = {"depth": "d", "lr": "lr", "tokens": "t", "tpp": "tpp", "arm": "", "moe_sparsity": "s",
         "moe_granularity": "k", "aux_loss_gamma": "g", "batch_tokens": "b"}  # fmt: skip


PROGRESS_MARK = b" progress "
"""What the trainer's progress lines carry (``... INFO ...train: progress RUN step 3/40 ...``)."""
INTERRUPTED_CODES = (-signal.SIGINT, 130)
"""Exit codes of a run stopped by Ctrl-C (Python re-raises SIGINT; shells report 128 + 2)."""


def print_progress(line: str) -> None:
    """The default live display: one line per logged step of each run, as the trainer wrote it."""
    print(line, flush=True)


@dataclass
class SweepRun:
    name: str
    overrides: dict[str, Any]  # "section.key" -> value
    status: str = "pending"  # pending | skipped | finished | failed | interrupted
    returncode: int | None = None
    val_loss: float | None = None


@dataclass
class Sweep:
    name: str
    base: dict[str, Any]
    grid: dict[str, list[Any]]
    server: str = ""
    workers: int = 1
    launcher: str = ""
    out_dir: str = "sweeps"
    token: str = ""
    runs: list[SweepRun] = field(default_factory=list)
    on_progress: Callable[[str], None] = field(default=print_progress, repr=False)
    interrupted: bool = False  # set when a run was stopped by Ctrl-C

    @property
    def folder(self) -> Path:
        return Path(self.out_dir) / self.name


def _axis_key(axis: str) -> str:
    if axis in AXES:
        return AXES[axis]
    section, _, key = axis.partition(".")
    if section not in SECTIONS or not key:
        raise ConfigError(f"[grid] {axis!r}: use one of {sorted(AXES)} or a 'section.key' such as 'model.qk_norm'")
    return axis


def _fmt(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def load_sweep(path: str | Path) -> Sweep:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"sweep file {p}: no such file")
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"sweep file {p}: not valid TOML ({exc})") from exc
    unknown = set(doc) - {"sweep", "base", "grid"}
    if unknown:
        raise ConfigError(f"sweep file {p}: unknown tables {sorted(unknown)}; use [sweep], [base] and [grid]")
    for table in ("sweep", "base", "grid"):
        if not isinstance(doc.get(table, {}), dict):
            raise ConfigError(f"sweep file {p}: '{table}' must be a table ([{table}]), got {doc[table]!r}")
    meta = doc.get("sweep", {})
    bad = set(meta) - {"name", "server", "workers", "launcher", "out_dir"}
    if bad:
        raise ConfigError(f"[sweep]: unknown options {sorted(bad)}; valid: name, server, workers, launcher, out_dir")
    name = meta.get("name") or p.stem
    if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(f"[sweep] name: {name!r}; use letters, digits, - and _")
    grid = doc.get("grid", {})
    for axis, values in grid.items():
        _axis_key(axis)
        if not isinstance(values, list) or not values:
            raise ConfigError(f"[grid] {axis}: must be a non-empty list of values")
    workers = meta.get("workers", 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"[sweep] workers: {workers!r}; must be an integer >= 1")
    for key in ("server", "launcher", "out_dir"):
        if not isinstance(meta.get(key, ""), str):
            raise ConfigError(f"[sweep] {key}: {meta[key]!r}; must be a string")
    for section, values in doc.get("base", {}).items():
        if section != "preset" and not isinstance(values, dict):
            raise ConfigError(f"[base] {section}: must be a table ([base.{section}]) of options")
    sweep = Sweep(
        name=name,
        base=doc.get("base", {}),
        grid=grid,
        server=meta.get("server", ""),
        workers=workers,
        launcher=meta.get("launcher", ""),
        out_dir=meta.get("out_dir", "sweeps"),
    )
    sweep.runs = expand(sweep)
    return sweep


def expand(sweep: Sweep) -> list[SweepRun]:
    """Every combination of the grid, validated as a full config before anything runs."""
    axes = list(sweep.grid)
    runs = []
    for combo in itertools.product(*(sweep.grid[a] for a in axes)):
        overrides = {_axis_key(a): v for a, v in zip(axes, combo)}
        parts = [f"{SHORT.get(a, a.rpartition('.')[2])}{_fmt(v)}" for a, v in zip(axes, combo)]
        name = "-".join([sweep.name, *parts]).replace("+", "")
        build_config(_merge(sweep.base, overrides))  # fail early, naming the option
        runs.append(SweepRun(name=name, overrides=overrides))
    return runs


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for dotted, value in overrides.items():
        section, _, key = dotted.partition(".")
        merged.setdefault(section, {})[key] = value
    return merged


def threads_per_run(parallel: int) -> int:
    """PyTorch threads for each of ``parallel`` runs side by side: the cores this process may use, shared.

    Without it every run starts one thread per core and runs side by side oversubscribe the machine:
    OpenMP threads spin-wait on each other (``bench/demo_threads.py``: two d=4 runs on 2 cores took
    5.2x the CPU time and 6.4x the wall time with PyTorch's default threads)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, parallel))


def command(sweep: Sweep, run: SweepRun) -> list[str]:
    """The train command of one run: every base option and grid value as ``--section.key value``.

    With ``workers > 1`` (and no launcher) each run gets its share of the cores as PyTorch threads
    unless the sweep sets ``train.threads`` itself."""
    sections = _merge(sweep.base, run.overrides)
    folder = sweep.folder / run.name
    sections.setdefault("train", {}).update(out_dir=str(folder), progress=False)
    if sweep.workers > 1 and not sweep.launcher:
        sections["train"].setdefault("threads", threads_per_run(sweep.workers))
    sections.setdefault("log", {}).update(run=run.name, group=sweep.name)
    sections["log"]["sink"] = sweep.server or str(sweep.folder / "indicators")
    if sweep.token:
        sections["log"]["token"] = sweep.token
    if (folder / "checkpoint.pt").exists():
        sections["train"]["resume"] = True
    args: list[str] = []
    for section, values in sections.items():
        if section == "preset":
            args += ["--preset", str(values)]
            continue
        for key, value in values.items():
            args += [f"--{section}.{key}", _cli_value(value)]
    launcher = shlex.split(sweep.launcher) if sweep.launcher else [sys.executable]
    return [*launcher, "-m", "hyperwatch", "train", *args]


def _cli_value(value: Any) -> str:
    """A value as the train command reads it back (TOML literal; plain text when unambiguous)."""
    if isinstance(value, str) and parse_scalar(value) == value:
        return value
    return json.dumps(value)


def _finished(folder: Path) -> dict[str, Any] | None:
    path = folder / "summary.json"
    if not path.exists():
        return None
    summary: dict[str, Any] = json.loads(path.read_text())
    return summary if summary.get("status") == "finished" else None


def _mark_failed(sweep: Sweep, run: SweepRun) -> None:
    if not sweep.server.startswith(("http://", "https://")):
        return
    from hyperwatch.hooks.sinks.client import api, request

    body = {"name": run.name, "group": sweep.name, "status": "failed"}
    resp = request("POST", api(sweep.server, "/api/v1/runs"), body, token=sweep.token or None)
    if not 200 <= resp.status < 300:
        log.warning("%s: could not mark the run failed in the service (%s)", run.name, resp.error or resp.status)


def execute(sweep: Sweep, run: SweepRun) -> SweepRun:
    if sweep.interrupted:
        return run  # Ctrl-C stopped an earlier run: start no new one (status stays "pending")
    folder = sweep.folder / run.name
    done = _finished(folder)
    if done is not None:
        run.status, run.val_loss = "skipped", done.get("val_loss")
        return run
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "train.log", "ab") as out:
        # SIGINT if the sweep dies: the run takes its Ctrl-C path (marked "interrupted", resumable);
        # when the service died with the sweep (the demo) it gives up delivering after its close
        # timeout (60 s, measured: both runs of a SIGKILLed demo gone within 70 s)
        cmd = die_with_parent(command(sweep, run), signal.SIGINT)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        for line in proc.stdout:  # the whole log goes to train.log; progress lines also to the console
            out.write(line)
            out.flush()
            if PROGRESS_MARK in line:
                sweep.on_progress(line.decode("utf-8", "replace").split(PROGRESS_MARK.decode(), 1)[1].strip())
        returncode = proc.wait()
    run.returncode = returncode
    summary = _finished(folder)
    if returncode == 0 and summary is not None:
        run.status, run.val_loss = "finished", summary.get("val_loss")
    elif returncode in INTERRUPTED_CODES:
        run.status = "interrupted"  # Ctrl-C: the trainer marked the run itself; it resumes next time
        sweep.interrupted = True
    else:
        run.status = "failed"
        _mark_failed(sweep, run)
        log.error("%s failed (exit %s); see %s", run.name, returncode, folder / "train.log")
    return run


def run_sweep(sweep: Sweep) -> list[SweepRun]:
    sweep.folder.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=sweep.workers) as pool:
        results = list(pool.map(lambda r: execute(sweep, r), sweep.runs))
    (sweep.folder / "sweep.json").write_text(json.dumps([r.__dict__ for r in results], indent=2))
    return results


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Run a grid of training runs (see configs/ for examples).")
    p.add_argument("config", help="sweep TOML with [sweep], [base] and [grid] tables")
    p.add_argument("--server", default=None, help="service URL the runs stream to (overrides [sweep] server)")
    p.add_argument("--token", default="", help="write token for the service")
    p.add_argument("--workers", type=int, default=None, help="runs at a time (overrides [sweep] workers)")
    p.add_argument("--out-dir", default=None, help="where runs keep checkpoints and logs")
    p.add_argument("--dry-run", action="store_true", help="print the runs' commands and exit")
    return p


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        sweep = load_sweep(args.config)
    except ConfigError as exc:
        print(f"hyperwatch sweep: {exc}", file=sys.stderr)
        return 2
    if args.workers is not None:
        if args.workers < 1:
            print("hyperwatch sweep: --workers must be >= 1", file=sys.stderr)
            return 2
        sweep.workers = args.workers
    sweep.server = args.server if args.server is not None else sweep.server
    sweep.token = args.token
    sweep.out_dir = args.out_dir or sweep.out_dir
    if args.dry_run:
        for r in sweep.runs:
            print(shlex.join(command(sweep, r)))
        return 0
    results = run_sweep(sweep)
    for r in results:
        print(f"{r.status:>9}  {r.name}  val_loss={r.val_loss}")
    failed = sum(r.status == "failed" for r in results)
    print(json.dumps({"group": sweep.name, "runs": len(results), "failed": failed}))
    return 1 if failed else 0
