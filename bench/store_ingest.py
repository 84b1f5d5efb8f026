"""The store's own cost per ingested batch (no HTTP), the batches that seal and pack timed apart; two
trees side by side.

Posts ``--batches`` one-step batches of 512 points (8 names x 64 layers, linear tokens, a few NaN)
through ``SqlStore.ingest``, each with the batch id the tree's hooks make, into a fresh database
(SQLite file or PostgreSQL database), and prints, per database and tree, the mean milliseconds per
batch, and the mean of a plain batch, of one that seals its 16-step chunks (every 16th step) and of
one that packs a segment range (every 256th).
``--against DIR``: also a second checkout (e.g. ``git worktree add /tmp/before <rev>``), each tree
in a process of its own, alternately (A B B A ...), so a noisy machine slows both alike; the last
column is this tree's mean over the other's.

    .venv/bin/python bench/store_ingest.py                                  # both databases
    .venv/bin/python bench/store_ingest.py --db sqlite --against /tmp/before --pairs 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEAL_EVERY, PACK_EVERY = 16, 256


def measure(db: str, batches: int) -> dict[str, float]:
    """In this process (the tree on ``sys.path``): ms per batch, overall and by kind."""
    import numpy as np

    import bench.ingest as bi
    from hyperwatch.hooks.columns import PointColumns
    from hyperwatch.hooks.schema import Batch
    from hyperwatch.monitor.store import SqlStore

    def run(url: str) -> list[float]:
        bi.fresh(url)
        store = SqlStore(url)
        try:
            run_, _ = store.upsert_run("default", "store-ingest", {"status": "running"})
            rng = np.random.default_rng(0)
            names = [f"m{k}" for k in range(8) for _ in range(64)]
            layers = [la for _ in range(8) for la in range(64)]
            times = []
            for i in range(batches):
                values = rng.normal(size=512)
                values[rng.integers(0, 512, 3)] = np.nan
                cols = PointColumns.build(names, [i] * 512, values.tolist(), layers, [i * 1024] * 512)
                batch_id = Batch("store-ingest", []).batch_id  # what this tree's hooks send
                t0 = time.perf_counter()
                store.ingest(run_.id, batch_id, cols)
                times.append((time.perf_counter() - t0) * 1000)
            return times
        finally:
            store.close()

    if db == "postgresql":
        with bi.pg_database() as url:
            times = run(url)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            times = run(f"sqlite:///{tmp}/store.db")
    kinds: dict[str, list[float]] = {"plain": [], "seal": [], "pack": []}
    for i, ms in enumerate(times):
        kind = "pack" if i % PACK_EVERY == PACK_EVERY - 1 else "seal" if i % SEAL_EVERY == SEAL_EVERY - 1 else "plain"
        kinds[kind].append(ms)
    return {
        "mean": statistics.fmean(times),
        **{k: statistics.fmean(v) if v else float("nan") for k, v in kinds.items()},
    }


def in_tree(tree: Path, db: str, batches: int) -> dict[str, float]:
    """:func:`measure` in a fresh process whose imports resolve to ``tree``."""
    code = (
        f"import json, sys; sys.path.insert(0, {str(tree)!r}); sys.path.insert(1, {str(REPO)!r}); "
        f"from bench.store_ingest import measure; print(json.dumps(measure({db!r}, {batches})))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"store_ingest in {tree} failed:\n{out.stderr[-2000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    ap.add_argument("--batches", type=int, default=512, help="one-step batches per measurement (default 512)")
    ap.add_argument("--against", type=Path, help="another checkout to measure beside this one")
    ap.add_argument("--pairs", type=int, default=2, help="measurements per tree (default 2)")
    args = ap.parse_args(argv)
    if args.batches < 1 or args.pairs < 1:
        ap.error("--batches and --pairs: at least 1")
    if args.against is not None and not (args.against / "monitor" / "store").is_dir():
        ap.error(f"--against: {args.against} is not a HyperWatch checkout (no monitor/store)")
    trees = [("this tree", REPO)] + ([("against", args.against.resolve())] if args.against else [])
    dbs = ["sqlite", "postgresql"] if args.db == "both" else [args.db]
    print(f"{args.batches} one-step batches of 512 points through SqlStore.ingest, ms (mean of each kind)\n")
    print("| database | tree | ms per batch | plain | seal (every 16th) | pack (every 256th) |")
    print("|---|---|---|---|---|---|")
    for db in dbs:
        got: dict[str, list[dict[str, float]]] = {label: [] for label, _ in trees}
        for p in range(args.pairs):
            order = trees if p % 2 == 0 else trees[::-1]  # A B, then B A
            for label, tree in order:
                got[label].append(in_tree(tree, db, args.batches))
        for label, runs in got.items():
            cells = [", ".join(f"{r[k]:.2f}" for r in runs) for k in ("mean", "plain", "seal", "pack")]
            print(f"| {db} | {label} | " + " | ".join(cells) + " |")
        if args.against:
            mine = statistics.fmean(r["mean"] for r in got["this tree"])
            other = statistics.fmean(r["mean"] for r in got["against"])
            print(f"| {db} | this tree / against | {mine / other:.2f}x | | | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
