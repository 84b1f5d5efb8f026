"""The early-warning benchmark's arms across seed sets: which configurations go wrong by seed.

An *arm* is one configuration of the sweep (scenario, model source, LR, switches) without its init
seed. Several ``bench/early_warning/run.py --seed-offset N --out sN.json`` runs train every arm again on
other seeds and another batch order. This reads them side by side and prints, per arm, each seed's
final loss excess over its twin (``W``: went wrong by the margin) and its first warning per alert
source, then sorts the misses and false alarms by the kind of arm they fell on:

- a *consistent* arm went wrong on every seed, or on none: a rule that reads the configuration's
  indicators can be right on all of its seeds;
- a *split* arm went wrong on some seeds and not on others. When its indicators do not rank its
  seeds by their outcome, every rule that warns on it cries wolf on a seed and every rule that stays
  silent misses one: the ground truth's margin, not the rule, decides.

``--peak METRIC`` prints, for each seed of a split arm, the metric's peak over the first quarter of
training (from the recorded series): whether the indicator ranks the seeds as the loss does.
``--level METRIC=X`` replays a candidate rule on the recorded series (the ``sN_series`` folder the
benchmark writes beside ``sN.json``): the metric at or above X on two logged points in a row. It
prints the runs it would newly warn (no loss-judged rule warned them), hits and false alarms apart.

    .venv/bin/python bench/early_warning/ew_arms.py /tmp/ew/s0.json /tmp/ew/s100.json /tmp/ew/s200.json
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ew_prom import column_key
from ew_score import first_loss_warning

SEED = re.compile(r"-s(\d+)$")
SOURCES = ("service", "prometheus")


def arm_of(run: str) -> str:
    """The run's name without its ``-s<seed>`` suffix."""
    if not SEED.search(run):
        raise ValueError(f"run {run!r}: the name does not end in -s<seed> (is this an early_warning/run.py output?)")
    return SEED.sub("", run)


def first_warning(run: Mapping[str, Any], source: str) -> int | None:
    """The run's first warning from a rule judged by the loss (MaxVio guards expert load)."""
    return first_loss_warning({rule: [step] for rule, step in run["first_by_rule"][source].items()})


def arms(outputs: Iterable[Mapping[str, Any]], margin: float | None = None) -> dict[str, list[dict[str, Any]]]:
    """Per arm, one entry per seed over all the outputs: run, excess, wrong, first warning per source.

    ``margin``: judge "went wrong" again at another margin (non-finite, or the final loss worse than
    the twin's by more than it); None keeps the benchmark's own verdict."""
    out: dict[str, list[dict[str, Any]]] = {}
    for output in outputs:
        for name, run in output["runs"].items():
            truth = run["truth"]
            excess = _excess_of(name, truth, output["runs"])
            wrong = truth["wrong"] if margin is None else not math.isfinite(excess) or excess > margin
            out.setdefault(arm_of(name), []).append(
                {
                    "run": name,
                    "excess": excess,
                    "wrong": wrong,
                    **{s: first_warning(run, s) for s in SOURCES},
                }
            )
    return out


def _excess_of(name: str, truth: Mapping[str, Any], runs: Mapping[str, Any]) -> float:
    """The run's final-loss excess over its twin; outputs older than the ``excess`` field give it
    as the difference of the two final losses."""
    if "excess" in truth:
        return float(truth["excess"])
    twin = runs.get(truth["twin"])
    if twin is None:
        raise ValueError(
            f"run {name}: no excess and its twin {truth['twin']!r} is not in the output (rerun the benchmark)"
        )
    return float(truth["final"]) - float(twin["truth"]["final"])


def kind(seeds: Sequence[Mapping[str, Any]]) -> str:
    wrong = sum(bool(s["wrong"]) for s in seeds)
    return "split" if 0 < wrong < len(seeds) else "consistent"


def errors(by_arm: Mapping[str, Sequence[Mapping[str, Any]]], source: str) -> dict[str, dict[str, list[str]]]:
    """Misses and false alarms of one alert source, per kind of arm (split or consistent)."""
    out: dict[str, dict[str, list[str]]] = {k: {"missed": [], "false_alarms": []} for k in ("split", "consistent")}
    for seeds in by_arm.values():
        bucket = out[kind(seeds)]
        for s in seeds:
            if s["wrong"] and s[source] is None:
                bucket["missed"].append(s["run"])
            elif not s["wrong"] and s[source] is not None:
                bucket["false_alarms"].append(s["run"])
    return out


def first_level(values: Sequence[float | None], steps: Sequence[int], level: float, persist: int = 2) -> int | None:
    """The first logged step at which ``values`` has been at or above ``level`` ``persist`` points in a row."""
    row = 0
    for step, v in zip(steps, values, strict=True):
        row = row + 1 if v is not None and v >= level else 0
        if row >= persist:
            return step
    return None


@functools.cache
def _recorded(path: Path) -> dict[str, Any]:
    """One run's recorded series, read once however many --peak and --level options ask for it."""
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def _series(path: Path, metric: str) -> tuple[list[int], list[float | None]] | None:
    rec = _recorded(path)
    try:
        key = column_key(rec["series"], f"hyperwatch_run_{metric}")
    except ValueError:  # the run does not send it (a router Z of a dense model)
        return None
    return rec["logged_steps"], rec["series"][key]


def peak(values: Sequence[float | None], steps: Sequence[int], until: int) -> float | None:
    """The largest value logged at or before step ``until`` (None when none was)."""
    seen = [v for step, v in zip(steps, values, strict=True) if v is not None and step <= until]
    return max(seen) if seen else None


def _excess(value: float) -> str:
    return f"{value:+.3f}" if math.isfinite(value) else "nonfinite"


def _verdict(seed: Mapping[str, Any]) -> str:
    return f"{'W' if seed['wrong'] else ' '} {_excess(seed['excess'])}"


def _fmt(seed: Mapping[str, Any]) -> str:
    warned = "/".join("-" if seed[s] is None else str(seed[s]) for s in SOURCES)
    return f"{_verdict(seed)} @{warned}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outputs", nargs="+", type=Path, help="bench/early_warning/run.py --out files (one per seed set)")
    p.add_argument("--margin", type=float, help="judge went-wrong again at this margin (default: the benchmark's)")
    p.add_argument("--level", action="append", default=[], help="replay METRIC=X, e.g. attention_rms_max=5")
    p.add_argument("--peak", action="append", default=[], help="per seed of a split arm, METRIC's peak over 25%%")
    args = p.parse_args()
    loaded = []
    for path in args.outputs:
        if not path.is_file():
            p.error(f"outputs: {path} is not a file (write one with bench/early_warning/run.py --out {path})")
        loaded.append(json.loads(path.read_text()))
    try:
        by_arm = arms(loaded, args.margin)
    except ValueError as exc:
        p.error(f"outputs: {exc}")
    folders = {name: path.parent / f"{path.stem}_series" for path, out in zip(args.outputs, loaded, strict=True)
               for name in out["runs"]}  # fmt: skip
    steps = {name: run["spec"]["steps"] for out in loaded for name, run in out["runs"].items()}
    print("per arm, per seed: W = went wrong, final-loss excess over the twin, @first warning service/prometheus")
    for arm, seeds in sorted(by_arm.items()):
        print(f"  {kind(seeds):10s} {arm:36s} " + "  ".join(_fmt(s) for s in seeds))
    for source in SOURCES:
        for k, found in errors(by_arm, source).items():
            print(f"{source:10s} on {k:10s} arms: missed {len(found['missed'])} {found['missed']}, "
                  f"false alarms {len(found['false_alarms'])} {found['false_alarms']}")  # fmt: skip
    for metric in args.peak:
        for arm, seeds in sorted(by_arm.items()):
            if kind(seeds) != "split":
                continue
            shown = []
            for s in seeds:
                found = _series(folders[s["run"]] / f"{s['run']}.json", metric)
                top = None if found is None else peak(found[1], found[0], steps[s["run"]] // 4)
                value = "-" if top is None else f"{top:.3g}"
                shown.append(f"{_verdict(s)}: {value}")
            print(f"peak {metric} over the first 25%, {arm}: " + ", ".join(shown))
    for spec in args.level:
        metric, _, raw = spec.partition("=")
        try:
            level = float(raw)
        except ValueError:
            p.error(f"--level: {spec!r} is not METRIC=NUMBER (e.g. attention_rms_max=5)")
        new: dict[str, list[str]] = {"hits": [], "false_alarms": []}
        for output in loaded:
            for name, run in output["runs"].items():
                if any(first_warning(run, s) is not None for s in SOURCES):
                    continue
                found = _series(folders[name] / f"{name}.json", metric)
                step = None if found is None else first_level(found[1], found[0], level)
                if step is not None:
                    truth = run["truth"]
                    kind_of = "hits" if truth["wrong"] else "false_alarms"
                    new[kind_of].append(f"{name} ({_excess(truth['excess'])}) @{step}")
        print(f"--level {metric}={level:g} would newly warn: hits {len(new['hits'])} {new['hits']}, "
              f"false alarms {len(new['false_alarms'])} {new['false_alarms']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
