"""Record the family benchmark: every run of the sweep trained into one real service, recorded whole.

Each spec of ``bench/early_warning/ew_families.py`` (families x arms x seeds) is trained on CPU through the hooks,
attached as a user would (``sink=[service URL, MemorySink]``, ``every=4``), into one
``hyperwatch serve`` (SQLite in a work folder). Every step: set the LR, forward, float32
cross-entropy, backward, optimizer step(s), ``mon.step(step, loss, lr, tokens, grad_norm)``. Every
logged step: ``mon.flush(60)`` and a scrape of ``/metrics`` (the run's gauges). A run stops two
logged steps after a non-finite loss. At the end the service's stored alerts are read once and
merged into each run's file. Written under ``--out``:

- ``runs/<family>-<arm>-s<seed>.json``: name, family, arm, seed, steps, onset, reference, fault,
  spec (every field), losses (one per step trained), logged_steps, batches (every batch the hooks
  sent, as ``[name, layer, step, value]`` rows), scrapes (``ew_prom.to_columns``: series -> value
  or null per logged step), service_alerts (rule, severity, step, name, layer), seconds, numerics (the
  worker's pinned variables and PyTorch's CPU capability). Non-finite
  numbers everywhere are the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (strict JSON).
- ``manifest.json``: the arguments, the data's sha256, the run names, each run's final loss, the
  pinned variables (``numerics``).

``--find-lr`` instead trains each family's ``best`` arm over an LR grid (loss only, no service,
seed 0) and prints the final losses (mean of the last 10% of per-step losses): how
``ew_families.BEST_LR`` was chosen.

    nice -n 5 .venv/bin/python bench/early_warning/ew_record.py --jobs 2 --out runs/bench/ewf

The default sweep (6 families, 13 arms, 3 seeds: 219 runs of 200 steps) took 704-2,303 s with ``--jobs 2``
on 2 shared cores, by the machine and its load; one run takes 5-8 s on an idle core. Runs
are deterministic: a rerun reproduced every final loss bit for bit. Across machines they were not (two
machine types gave 102 wrong / 68 healthy / 49 grey and 96 / 71 / 52 from the same bytes): PyTorch's
kernels and oneDNN pick the widest instructions the CPU has (AVX-512 rounds otherwise than AVX2), and
MKL without a reproducibility branch takes its own path per CPU vendor and model. ``pin_numerics`` fixes
all three on x86-64 (``NUMERICS``: AVX2, and MKL's AVX2 branch in its strict mode, set for the workers
before they load torch; a variable already set is kept), and every run file records what was in force
(``numerics``), so a recording states the arithmetic it was made with.
    nice -n 5 .venv/bin/python bench/early_warning/ew_record.py --find-lr --jobs 2
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from ew_families import BATCH, FAMILIES, SEQ, STEPS, WIDTH, build, losses  # noqa: E402
from ew_models import batches, stdlib_bytes  # noqa: E402
from ew_prom import Scrape, scrape, service_alerts, to_columns  # noqa: E402
from ew_specs import ARMS, DEFAULT_ARMS, Spec, make_spec, optimizers, prepare_step, sweep  # noqa: E402

from hyperwatch import hooks  # noqa: E402
from hyperwatch.hooks.sinks.base import MemorySink  # noqa: E402
from hyperwatch.monitor.processes.lifetime import exit_with_parent  # noqa: E402

PROJECT = "default"  # the sink posts without ?project=: runs land in "default"
DATA_BYTES = 2_000_000
LR_POINTS = 7  # --find-lr: 7 LRs on a x2 grid from --lr-min (default 5e-4 .. 3.2e-2)
TAIL = 0.1  # final loss: mean of the last 10% of per-step losses

_data: np.ndarray | None = None  # a worker's copy of the bytes

NUMERICS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX2"}
"""The arithmetic of the workers on x86-64: PyTorch's CPU kernels and oneDNN at AVX2, which every x86-64
CPU of the last decade has, and MKL on its conditional numerical reproducibility branch for AVX2 in strict
mode (as Intel documents it: the same bits on Intel and compatible processors with AVX2, whatever the
memory alignment; checked here on one machine type only). On this
project's AMD EPYC (AVX2, no AVX-512) the pin left every neox, llama, postln, sandwich and parallel run
bit for bit as it was and moved 34 of the 39 MoE runs' losses in their 7th digit: MKL's default path on
that CPU is not its AVX2 branch."""


def pin_numerics() -> dict[str, str]:
    """Set :data:`NUMERICS` in this process's environment, which the spawned workers inherit and read
    when they load torch (this process's own torch trains nothing), unless a variable is already set;
    on x86-64 only. Returns the variables in force."""
    if platform.machine().lower() in ("x86_64", "amd64"):
        for key, value in NUMERICS.items():
            os.environ.setdefault(key, value)
    return pinned()


def pinned() -> dict[str, str]:
    """The variables of :data:`NUMERICS` set in this process's environment (pinned, or the user's)."""
    return {k: os.environ[k] for k in NUMERICS if k in os.environ}


def numerics() -> dict[str, str]:
    """What this process computes with: the variables of :data:`NUMERICS` set, and PyTorch's CPU capability."""
    return {**pinned(), "capability": torch.backends.cpu.get_cpu_capability()}


def encode(v: float) -> float | str:
    """A float as strict JSON allows: finite as is, else ``"NaN"``/``"Infinity"``/``"-Infinity"``."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return v


def final_loss(values: list[float]) -> float:
    """Mean of the last ``TAIL`` of the per-step losses (NaN when any of them is not finite)."""
    tail = values[-max(1, round(TAIL * len(values))) :]
    return sum(tail) / len(tail)


def _grad_norm(params: list[torch.nn.Parameter], clip: float | None) -> torch.Tensor:
    """The total gradient norm before clipping (clipped in place when ``clip`` is set)."""
    if clip is not None:
        return torch.nn.utils.clip_grad_norm_(params, clip)
    norms = [torch.linalg.vector_norm(p.grad.float()) for p in params if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack(norms))


def train(
    spec: Spec,
    data: np.ndarray,
    url: str | None = None,
    every: int = 4,
    spool: Path | None = None,
    hooked: bool = False,
) -> dict[str, Any]:
    """One run; with ``url`` through the hooks into the service (and recorded), with ``hooked`` alone
    through the hooks into memory only (recorded, no scrapes), else loss only."""
    model = build(spec.family, spec.seed, getattr(torch, spec.dtype))
    params = list(model.parameters())
    opts = optimizers(model, spec)
    mem = MemorySink()
    mon = None
    if url is not None or hooked:
        mon = hooks.attach(
            model, run=spec.name, sink=[url, mem] if url else mem, every=every, config=spec.as_dict(),
            group=f"ewf-{spec.family}", depth=FAMILIES[spec.family].depth, width=WIDTH, spool=spool,
        )  # fmt: skip
    xs = batches(data, spec.data_seed, spec.steps, BATCH, SEQ)  # the same for every init seed
    trained: list[float] = []
    scrapes: list[Scrape] = []
    logged: list[int] = []
    nonfinite_at: int | None = None
    t0 = time.perf_counter()
    for step in range(spec.steps):
        lr = prepare_step(spec, opts, step)  # the step's LR; opt_reset clears the state at its onset
        ce, total = losses(model, spec.batch(xs[step], step), spec.aux_loss)
        total.backward()
        logged_step = step % every == 0
        gn = _grad_norm(params, spec.clip) if (logged_step and mon is not None) or spec.clip else None
        for opt in opts:
            opt.step()
        if mon is not None:
            mon.step(step, loss=ce.detach(), lr=lr, tokens=(step + 1) * BATCH * SEQ, grad_norm=gn)
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        trained.append(ce.item())
        if mon is not None and logged_step:
            mon.flush(60)
            if url is not None:
                scrapes.append(scrape(url, PROJECT, spec.name))
            logged.append(step)
        if not math.isfinite(trained[-1]) and nonfinite_at is None:
            nonfinite_at = step
        if nonfinite_at is not None and step >= nonfinite_at + 2 * every:
            break  # diverged: two more logged steps for the alerts, then stop
    if mon is not None:
        mon.close("failed" if nonfinite_at is not None else "finished")
    columns = {k: [None if v is None else encode(v) for v in vs] for k, vs in to_columns(scrapes).items()}
    return {
        "name": spec.name,
        "family": spec.family,
        "arm": spec.arm,
        "seed": spec.seed,
        "steps": spec.steps,
        "onset": spec.onset,
        "reference": spec.reference,
        "fault": spec.fault,
        "spec": spec.as_dict(),
        "losses": [encode(v) for v in trained],
        "logged_steps": logged,
        "batches": [[[p.name, p.layer, p.step, encode(p.value)] for p in b.points] for b in mem.batches],
        "scrapes": columns,
        "service_alerts": [],
        "seconds": time.perf_counter() - t0,
    }


def _init_worker(threads: int) -> None:
    global _data
    exit_with_parent()  # a recording stopped by a signal leaves no worker training on
    torch.set_num_threads(threads)
    _data = stdlib_bytes(DATA_BYTES)


def _record_one(spec: Spec, url: str, every: int, spool: Path, runs_dir: Path) -> dict[str, Any]:
    """A worker's task: train one spec into the service and write its file; returns its summary."""
    assert _data is not None
    rec = train(spec, _data, url, every, spool)
    rec["numerics"] = numerics()
    (runs_dir / f"{spec.name}.json").write_text(json.dumps(rec, allow_nan=False))
    values = [float(v) for v in rec["losses"]]
    return {"name": spec.name, "final": final_loss(values), "trained": len(values), "seconds": rec["seconds"]}


def _loss_only(spec: Spec) -> float:
    assert _data is not None
    return final_loss([float(v) for v in train(spec, _data)["losses"]])


def stored_alerts(url: str) -> dict[str, list[dict[str, Any]]]:
    """Per run, the service's stored alerts as a recording keeps them (rule, severity, step, name, layer),
    in step order."""
    out = {
        run: [{k: a[k] for k in ("rule", "severity", "step", "name", "layer")} for a in alerts]
        for run, alerts in service_alerts(url, PROJECT).items()
    }
    for alerts in out.values():
        alerts.sort(key=lambda a: (a["step"], a["rule"], a["name"], -1 if a["layer"] is None else a["layer"]))
    return out


def _choices(p: argparse.ArgumentParser, flag: str, value: str, valid: tuple[str, ...]) -> list[str]:
    """A comma-separated list of names, each one of ``valid`` (else exit 2 naming the valid ones)."""
    names = [v for v in value.split(",") if v]
    bad = [v for v in names if v not in valid]
    if bad or not names:
        p.error(f"{flag}: unknown {', '.join(bad) or '(empty)'}; valid: {', '.join(valid)}")
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--families", default=",".join(FAMILIES), help="comma-separated (default all)")
    p.add_argument("--arms", default=",".join(DEFAULT_ARMS), help="comma-separated (default all)")
    p.add_argument("--seeds", type=int, default=3, help="init seeds per arm (default 3)")
    p.add_argument("--steps", type=int, default=STEPS, help=f"optimizer steps per run (default {STEPS})")
    p.add_argument("--every", type=int, default=4, help="log every N steps (default 4)")
    p.add_argument("--seed-offset", type=int, default=0, help="first init seed, also added to the data seed")
    p.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker (default 1)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "ewf", help="recording folder")
    p.add_argument("--workdir", type=Path, help="keep the service's database, log and spool here")
    p.add_argument("--find-lr", action="store_true", help="loss-only LR sweep of each family's best arm")
    p.add_argument("--lr-min", type=float, default=5e-4, help="--find-lr: the grid's lowest LR (default 5e-4)")
    args = p.parse_args(argv)
    args.families = _choices(p, "--families", args.families, tuple(FAMILIES))
    args.arms = _choices(p, "--arms", args.arms, ARMS)
    for flag in ("seeds", "steps", "every", "jobs", "threads"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag}: must be at least 1")
    return args


def find_lr(args: argparse.Namespace) -> int:
    specs = [
        replace(s, data_seed=s.data_seed + args.seed_offset)
        for f in args.families
        for lr in (args.lr_min * 2**k for k in range(LR_POINTS))
        if (s := make_spec(f, "best", args.seed_offset, args.steps, lr=lr)) is not None
    ]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.jobs, get_context("spawn"), _init_worker, (args.threads,)) as pool:
        finals = list(pool.map(_loss_only, specs))
    by_family: dict[str, list[tuple[float, float]]] = {}
    for spec, final in zip(specs, finals):
        by_family.setdefault(spec.family, []).append((spec.lr, final))
    print(f"find-lr: {len(specs)} runs of {args.steps} steps, {time.perf_counter() - t0:.0f} s")
    for family, rows in by_family.items():
        best = min(rows, key=lambda r: r[1] if math.isfinite(r[1]) else math.inf)
        sweep_text = ", ".join(f"{lr:g}: {f:.3f}" for lr, f in rows)
        print(f"  {family:9s} best {best[0]:g}  ({sweep_text})")
    return 0


def record(args: argparse.Namespace) -> int:
    specs = sweep(args.families, args.arms, args.seeds, args.steps, args.seed_offset)
    if not specs:
        print("ew_record: no run: none of --arms applies to --families", file=sys.stderr)
        return 2
    from hyperwatch.monitor.processes.children import ServiceProcess

    data = stdlib_bytes(DATA_BYTES)
    fingerprint = hashlib.sha256(data.tobytes()).hexdigest()[:12]
    runs_dir = args.out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="hyperwatch-ewf-"))
    work.mkdir(parents=True, exist_ok=True)
    # a service of an earlier recording would resume its runs of the same names (their points and alerts)
    # and run files left in the folder would be scored with this recording's
    stale = [work / f"hyperwatch.db{tail}" for tail in ("", "-wal", "-shm")] + [work / "spool"]
    stale += sorted(runs_dir.glob("*.json"))
    for path in (p for p in stale if p.exists()):
        if path.suffix != ".json":
            print(f"ew_record: removing {path} (an earlier recording's)", flush=True)
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    print(f"ew_record: {len(specs)} runs, {args.jobs} jobs, data sha256 {fingerprint}, work {work}", flush=True)
    t0 = time.perf_counter()
    summaries: list[dict[str, Any]] = []
    with ServiceProcess(f"sqlite:///{work / 'hyperwatch.db'}", log_path=work / "service.log") as svc:
        ctx = get_context("spawn")
        with ProcessPoolExecutor(args.jobs, ctx, _init_worker, (args.threads,)) as pool:
            futures = [pool.submit(_record_one, s, svc.url, args.every, work / "spool", runs_dir) for s in specs]
            for i, fut in enumerate(futures):
                s = fut.result()
                summaries.append(s)
                print(
                    f"[{i + 1}/{len(specs)}] {s['name']}: {s['trained']} steps, final {s['final']:.3f}, "
                    f"{s['seconds']:.1f} s",
                    flush=True,
                )
        alerts = stored_alerts(svc.url)
    for spec in specs:
        path = runs_dir / f"{spec.name}.json"
        rec = json.loads(path.read_text())
        rec["service_alerts"] = alerts.get(spec.name, [])
        path.write_text(json.dumps(rec, allow_nan=False))
    elapsed = time.perf_counter() - t0
    manifest = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "data_sha256": fingerprint,
        "runs": [s.name for s in specs],
        "final_losses": {s["name"]: encode(s["final"]) for s in summaries},
        "seconds": elapsed,
        "workdir": str(work),
        "numerics": pinned(),  # main pinned them before the workers started
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1, allow_nan=False))
    print(f"ew_record: {len(specs)} runs in {elapsed:.0f} s -> {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pin_numerics()
    return find_lr(args) if args.find_lr else record(args)


if __name__ == "__main__":
    raise SystemExit(main())
