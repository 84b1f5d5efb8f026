"""What a run's stop costs the store, and a batch that reaches the run after it (a late flush); two trees
side by side (issue 36, revision 0021: a stop folds each series' last steps into its segment).

Stores ``--steps`` one-step batches of 8 names x 64 layers (512 series) through ``SqlStore.ingest``,
stops the run (``update_run(status=finished)``) and times it, then times ``--after`` one-step batches
into the stopped run: the first one (which finds the series' last steps folded) and the median of the
rest. ``--against DIR``: the same in a second checkout (e.g. ``git worktree add /tmp/before <rev>``), each
tree in a process of its own, alternately.

    .venv/bin/python bench/stop_cost.py                                   # both databases
    .venv/bin/python bench/stop_cost.py --against /tmp/before --db sqlite
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _points(step: int) -> list:
    from hyperwatch.hooks.schema import Point

    return [Point(f"m{i}", step, 1.0 + step * 1e-3 + i + la / 100, layer=la) for i in range(8) for la in range(64)]


def measure(url: str, steps: int, after: int) -> dict[str, float]:
    """(ms) the stop, the first batch after it, the median of the next ones."""
    from hyperwatch.monitor.store import SqlStore, migrate

    store = SqlStore(url)
    try:
        migrate.upgrade(store.engine)
        run, _ = store.upsert_run("default", "stop-cost", {"status": "running"})
        for s in range(steps):
            store.ingest(run.id, uuid.uuid4().hex, _points(s))
        t0 = time.perf_counter()
        store.update_run(run.id, {"status": "finished"})
        stop = time.perf_counter() - t0
        store.hot_vacuum.wait()
        times = []
        for s in range(steps, steps + after):
            t0 = time.perf_counter()
            store.ingest(run.id, uuid.uuid4().hex, _points(s))
            times.append(time.perf_counter() - t0)
    finally:
        store.close()
    rest = statistics.median(times[1:]) if len(times) > 1 else float("nan")
    return {"stop": stop * 1e3, "first": times[0] * 1e3, "next": rest * 1e3}


def _child(db: str, steps: int, after: int) -> None:
    sys.path.insert(0, str(Path.cwd()))
    if db == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            out = measure(f"sqlite:///{tmp}/stop.db", steps, after)
    else:
        from bench import ingest

        with ingest.pg_database() as url:
            out = measure(url, steps, after)
    print(json.dumps(out))


def _run(tree: Path, db: str, steps: int, after: int) -> dict[str, float]:
    py = tree / ".venv" / "bin" / "python"
    args = [str(py if py.exists() else sys.executable), str(REPO / "bench" / "stop_cost.py"), "--child", db]
    args += ["--steps", str(steps), "--after", str(after)]
    done = subprocess.run(args, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"stop_cost in {tree} ({db}) failed:\n{done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    ap.add_argument("--steps", type=int, default=300, help="steps stored before the stop (default 300)")
    ap.add_argument("--after", type=int, default=40, help="one-step batches after the stop (default 40)")
    ap.add_argument("--against", type=Path, help="a second checkout, measured alternately")
    ap.add_argument("--pairs", type=int, default=2, help="rounds per tree (default 2)")
    ap.add_argument("--child", choices=("sqlite", "postgresql"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for flag in ("steps", "after", "pairs"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag}: at least 1, got {getattr(args, flag)}")
    if args.child:
        _child(args.child, args.steps, args.after)
        return 0
    if args.against is not None and not (args.against / "bench").is_dir():
        ap.error(f"--against: {args.against} is not a checkout of this project (no bench/ in it)")
    trees = [("this tree", REPO)] + ([("against", args.against)] if args.against else [])
    print(f"512 series, {args.steps} steps, then the stop and {args.after} one-step batches (ms)\n")
    print("| database | tree | stop | first batch after | the next ones (median) |\n|---|---|---|---|---|")
    for db in ("sqlite", "postgresql") if args.db == "both" else (args.db,):
        got: dict[str, list[dict[str, float]]] = {name: [] for name, _t in trees}
        for i in range(args.pairs):
            for name, tree in trees if i % 2 == 0 else trees[::-1]:
                got[name].append(_run(tree, db, args.steps, args.after))
        for name, rounds in got.items():
            cells = [", ".join(f"{r[k]:.1f}" for r in rounds) for k in ("stop", "first", "next")]
            print(f"| {db} | {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
