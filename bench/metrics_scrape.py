"""What a ``/metrics`` scrape costs, part by part, with every rule's statistics counted in logged steps.

The collector (``monitor/alerting/prometheus.py``) reads, per active run, the latest value of each
gauge's series and then, for the rules judged in logged steps, trailing windows: the Z baselines
(``spike_window`` steps of every layer of attention and router Z), the loss and grad-norm statistics
and, since 2026-11-30, the growth rises (``growth_window`` steps of every layer of the six growth
metrics). This loads ``--runs`` running runs of ``--layers`` layers (every indicator the hooks send
per layer, the run-level loss, grad norm and output Z) for ``--steps`` logged steps into a fresh
database through the store, then times each part of one scrape in the same process, side by side
(median of ``--repeats``), and the whole exposition. Target (issue 37): a scrape within 1 s.

    .venv/bin/python bench/metrics_scrape.py                 # SQLite and PostgreSQL, 8 runs x 64 layers
    .venv/bin/python bench/metrics_scrape.py --db sqlite --runs 2 --layers 8 --steps 40
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.load import database  # noqa: E402
from hyperwatch.hooks.columns import PointColumns  # noqa: E402
from hyperwatch.monitor.alerting.prometheus import RUN_GAUGES, RunCollector, build_registry  # noqa: E402
from hyperwatch.monitor.store import SqlStore  # noqa: E402

LAYER_METRICS = ("attention_z", "attention_lse_max", "attention_rms", "mlp_rms", "router_z", "max_vio",
                 "attention_outlier_ratio", "mlp_outlier_ratio")  # fmt: skip
RUN_METRICS = ("loss", "grad_norm", "output_z")


def load(store: SqlStore, runs: int, layers: int, steps: int) -> int:
    """``runs`` running runs, one batch per logged step (every 4th step); the points stored."""
    rng = np.random.default_rng(0)
    total = 0
    for r in range(runs):
        run, _ = store.upsert_run("default", f"r{r}", {"status": "running"})
        for i in range(steps):
            names: list[str] = []
            layer_of: list[int | None] = []
            for m in LAYER_METRICS:
                names += [m] * layers
                layer_of += list(range(layers))
            names += list(RUN_METRICS)
            layer_of += [None] * len(RUN_METRICS)
            values = np.exp(rng.normal(2.0 + 0.02 * i, 0.1, len(names))).tolist()
            cols = PointColumns.build(names, [4 * i] * len(names), values, layer_of, [None] * len(names))
            store.ingest(run.id, uuid.uuid4().hex, cols)
            total += len(names)
    return total


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def scrape_parts(store: SqlStore, repeats: int) -> dict[str, float]:
    """Milliseconds per part of one scrape (each part timed alone, the others' reads not repeated)."""
    from prometheus_client import generate_latest

    collector = RunCollector(store)
    latest = store.latest_for_active_runs(list(RUN_GAUGES))
    runs = store.active_runs()

    def part(name: str) -> float:
        method = getattr(collector, name, None)
        if method is None:  # a tree before the part (this script run from an older checkout): costs nothing
            return 0.0
        # after ``latest``, an empty per-scrape cache for each further parameter (groups' thresholds, windows
        # read): the part alone, as a scrape pays it first; an older tree's parts take ``latest`` only
        args = (latest, *({} for _ in list(inspect.signature(method).parameters)[1:]))
        return median_ms(lambda: list(method(*args)), repeats)

    out = {
        "latest values (read)": median_ms(lambda: store.latest_for_active_runs(list(RUN_GAUGES)), repeats),
        "latest gauges": median_ms(lambda: list(collector._latest(latest, runs)), repeats),
        "Z spike baselines": part("_spike_baselines"),
        "trend thresholds": part("_trend_thresholds"),
        "loss, grad norm statistics (new)": part("_sigma_statistics"),
        "growth rises (new)": part("_growth_statistics"),
    }
    registry = build_registry(store)
    out["whole exposition"] = median_ms(lambda: generate_latest(registry), repeats)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", choices=("sqlite", "postgresql", "both"), default="both")
    ap.add_argument("--runs", type=int, default=8, help="running runs (default 8)")
    ap.add_argument("--layers", type=int, default=64, help="layers per run (default 64)")
    ap.add_argument("--steps", type=int, default=64, help="logged steps per run (default 64)")
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args(argv)
    for name in ("runs", "layers", "steps", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name}: at least 1, got {getattr(args, name)}")
    kinds = ("sqlite", "postgresql") if args.db == "both" else (args.db,)
    for kind in kinds:
        with database(kind) as url:
            store = SqlStore(url)
            try:
                points = load(store, args.runs, args.layers, args.steps)
                parts = scrape_parts(store, args.repeats)
            finally:
                store.close()
        new = parts["loss, grad norm statistics (new)"] + parts["growth rises (new)"]
        whole = parts["whole exposition"]
        shape = f"{args.runs} running runs x {args.layers} layers x {args.steps} logged steps ({points:,} points)"
        print(f"\n{kind}: {shape}")
        print("| part of one scrape | ms (median) |")
        print("|---|---|")
        for label, ms in parts.items():
            print(f"| {label} | {ms:.1f} |")
        ratio = whole / (whole - new)
        print(f"the statistics in logged steps new since 2026-11-30: {new:.1f} ms of {whole:.1f} ({new / whole:.0%}); "
              f"a scrape without them {whole - new:.1f} ms: {ratio:.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
