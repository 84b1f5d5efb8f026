"""Which rule made each false alarm and each warning of recorded runs (issue 33): the detail behind
``ew_lofo.py``'s counts, at the defaults (or ``--thresholds``), with the service's learning as the
benchmark applies it (a family's ``best`` runs unlearned, every other run at 2 x their peaks).

For every healthy run warned (a false alarm), every pre-fault warning and every wrong run: the
first alert of each rule that counts as a warning (rule, severity, step, metric, layer), the value
of the metric there, and the run's loss verdict.

    .venv/bin/python bench/early_warning/ew_explain.py runs/bench/ewf [--no-learn] [--thresholds JSON]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ew_learn import family_peaks, learned_over, loss_rule_warned  # noqa: E402
from ew_replay import COUNTED, RunTrace  # noqa: E402
from ew_runs import Run, check_thresholds, load_dir  # noqa: E402
from ew_score import EFFICIENCY_RULES  # noqa: E402
from ew_truth import BEST_ARM, ground_truth, run_row  # noqa: E402

from hyperwatch.monitor.thresholds.defaults import DEFAULT_THRESHOLDS  # noqa: E402


def value_at(run: Run, name: str, layer: int | None, step: int) -> float | None:
    for cols in run.batches:
        for i, n in enumerate(cols.names):
            if n != name:
                continue
            hit = (cols.name_index == i) & (cols.step == step)
            if layer is not None:
                hit &= cols.layer == layer
            if hit.any():
                return float(cols.value[hit].max())
    return None


def trace(run: Run) -> RunTrace:
    """The run's replay trace, built once."""
    if run.trace is None:
        run.trace = RunTrace(run.batches)
    return run.trace


def firsts(run: Run, over: dict[str, float]) -> list[tuple[str, str, int, str, int | None]]:
    """The first counted alert of each (rule, metric) pair, in step order."""
    seen: dict[tuple[str, str], tuple[str, str, int, str, int | None]] = {}
    for rule, severity, step, name, layer in trace(run).alerts(over):
        if severity in COUNTED and rule not in EFFICIENCY_RULES and (rule, name) not in seen:
            seen[(rule, name)] = (rule, severity, step, name, layer)
    return sorted(seen.values(), key=lambda a: a[2])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--no-learn", action="store_true", help="every run scored as a group's first")
    ap.add_argument("--thresholds", default="{}", help="JSON overrides of the defaults")
    ap.add_argument("--all", action="store_true", help="also healthy and grey runs with no warning")
    args = ap.parse_args(argv)
    base = check_thresholds(json.loads(args.thresholds), "--thresholds")
    runs = load_dir(args.dir)
    truth = ground_truth(runs)
    loss_warned = {r.name: loss_rule_warned(trace(r).alerts(base)) for r in runs if r.arm == BEST_ARM}
    peaks = {} if args.no_learn else family_peaks(runs, truth, loss_warned)
    multiple = float(DEFAULT_THRESHOLDS["learn_multiple"])
    counts = {"fa": 0, "pre": 0, "missed": 0}
    for r in sorted(runs, key=lambda r: (truth[r.name].verdict, r.family, r.arm, r.seed)):
        t = truth[r.name]
        over = base if r.arm == BEST_ARM else learned_over(base, peaks.get(r.family, {}), multiple)
        fired = firsts(r, dict(over))
        steps = [a[2] for a in fired]
        after = [st for st in steps if r.onset is not None and st >= r.onset]
        row = run_row(r, t, (min(steps, default=None), min(after, default=None)))
        fa, pre, missed = row["false_alarm"], row["pre_fault"], row["missed"]
        counts["fa"] += fa
        counts["pre"] += pre
        counts["missed"] += missed
        if not (fa or pre or t.verdict == "wrong" or args.all):
            continue
        tag = "FALSE ALARM" if fa else "PRE-FAULT" if pre else "MISSED" if missed else t.verdict
        print(f"{r.name:34s} {tag:11s} excess {t.excess:+.3f} onset {r.onset} departure {t.departure}")
        for rule, severity, step, name, layer in fired[:6]:
            v = value_at(r, name, layer, step)
            print(f"    {step:4d} {rule:16s} {severity:8s} {name}[{layer}] = {v if v is None else f'{v:.4g}'}")
    print(f"false alarms {counts['fa']}, pre-fault {counts['pre']}, missed {counts['missed']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
