"""The demo's two arms side by side: PyTorch's default threads against the demo's share of the cores.

    .venv/bin/python bench/demo_threads.py [--depth 4] [--steps 6]

Two ``hyperwatch train`` processes (the demo's arms: HyperP with QK-Norm, and the baseline) run at
the same time, first with PyTorch's default thread pool (one thread per core each: oversubscribed
when there are fewer cores than runs x threads), then with ``--train.threads`` set as the demo sets
it (cores // 2). Each process's CPU time (user + sys, from ``wait4``) and the wall time of the pair
are measured in one run and printed with their ratio; the loss of each run is printed too (the
thread count must not change what is learned beyond float reduction order).

No service: the hooks write JSONL into a temporary folder, at ``log.every 1`` as in the demo.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hyperwatch.monitor.processes.children import python_env  # noqa: E402
from hyperwatch.monitor.processes.lifetime import die_with_parent  # noqa: E402
from hyperwatch.trainer.sweep import threads_per_run  # noqa: E402

ARMS = {
    "hyperp": ["--model.qk_norm", "true", "--optim.arm", "hyperp", "--optim.lr", "0.02"],
    "baseline": ["--model.qk_norm", "false", "--optim.arm", "muonh", "--optim.lr", "1.0"],
}


def pair(folder: Path, depth: int, steps: int, threads: int) -> tuple[float, dict[str, float], dict[str, str]]:
    """Both arms at once; (wall seconds, CPU seconds per arm, last progress line per arm)."""
    procs = {}
    start = time.perf_counter()
    for arm, extra in ARMS.items():
        out = folder / f"{arm}-t{threads}"
        cmd = [sys.executable, "-m", "hyperwatch", "train", "--preset", "tiny", "--model.n_kv_heads", "2", *extra]
        cmd += ["--model.depth", str(depth), "--train.tokens", str(8192 * 16), "--train.max_steps", str(steps)]
        cmd += ["--train.eval_every", "0", "--train.eval_batches", "4", "--train.progress", "false"]
        cmd += ["--train.threads", str(threads), "--train.out_dir", str(out), "--data.max_bytes", "1000000"]
        cmd += ["--log.every", "1", "--log.run", f"{arm}-t{threads}", "--log.sink", str(out / "sink")]
        env = python_env(keep_hyperwatch=False)
        procs[arm] = subprocess.Popen(
            die_with_parent(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
    cpu, last = {}, {}
    for arm, proc in procs.items():
        assert proc.stdout is not None
        text = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"{arm} run failed (exit {proc.returncode}):\n{text[-3000:]}")
        cpu[arm] = usage.ru_utime + usage.ru_stime
        lines = re.findall(r"progress \S+ (step .*)", text)
        last[arm] = lines[-1] if lines else "(no progress line)"
    return time.perf_counter() - start, cpu, last


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--depth", type=int, default=4, help="model depth of both arms (the fast demo's largest: 4)")
    p.add_argument("--steps", type=int, default=6, help="optimizer steps of 8192 tokens per run")
    args = p.parse_args()
    share = threads_per_run(2)
    print(f"cores available: {len(os.sched_getaffinity(0))}; demo share per arm: {share}; load: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="hw-demo-threads-") as tmp:
        results = {}
        for label, threads in (("default", 0), ("demo share", share)):
            wall, cpu, last = pair(Path(tmp), args.depth, args.steps, threads)
            results[label] = (wall, sum(cpu.values()))
            per_arm = ", ".join(f"{arm} {c:.1f} s" for arm, c in cpu.items())
            print(f"{label:>10} threads={threads or 'torch default'}: wall {wall:.1f} s, CPU {per_arm}")
            for arm, line in last.items():
                print(f"{'':>12}{arm}: {line}")
    (w0, c0), (w1, c1) = results["default"], results["demo share"]
    print(f"ratio default / demo share: wall {w0 / w1:.2f}x, CPU {c0 / c1:.2f}x (load after: {os.getloadavg()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
