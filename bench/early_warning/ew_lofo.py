"""Leave-one-family-out scoring of the service's thresholds on recorded runs (issue 33).

Reads ``DIR/runs/*.json`` (``bench/early_warning/ew_record.py``), replays the service's detectors
offline (``ew_replay.py``) and scores them with the families' ground truth (``ew_truth.py``).
Thresholds are chosen by a coordinate-wise search over :data:`GRID` (start at the defaults; per
threshold in turn, try each of its values with the others held, move to the one that lowers the
count most, the nearest such value; repeat until a pass changes nothing, at most :data:`MAX_PASSES`),
minimising :data:`OBJECTIVE` (missed + late + 3 x (false alarms + pre-fault false alarms)); the mean
lead fraction never moves a threshold. For each family F the thresholds are chosen on every other
family and F is scored with them: the ALL row of those left-out rows is the headline. Sources:
``service`` (the replay) and ``prometheus`` (the recorded scrapes, their threshold gauges rewritten,
through ``promtool``).

    .venv/bin/python bench/early_warning/ew_lofo.py runs/bench/ewf [--no-prom] [--json OUT] [--grid FILE]
        [--thresholds '{"attention_lse_max_limit": 80}'] [--rules FILE] [--pace 3]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ew_learn import family_peaks, learned_over, learning_scorer, loss_rule_warned  # noqa: E402
from ew_prom import at_pace  # noqa: E402
from ew_replay import (  # noqa: E402
    RunTrace,
    compare_recorded,
    prom_warnings,
)
from ew_runs import (  # noqa: E402, F401
    REQUIRED,
    InputError,
    Overrides,
    Run,
    check_thresholds,
    load_dir,
    load_run,
    read_object,
)
from ew_truth import (  # noqa: E402
    BEST_ARM,
    COUNTS,
    Truth,
    Warn,
    baselines,
    format_over,
    format_rows,
    ground_truth,
    objective,
    run_row,
    strict_json,
    summarize,
)

from hyperwatch.monitor.thresholds.defaults import DEFAULT_THRESHOLDS, LEARN_BY_DEFAULT  # noqa: E402

RULES = ROOT / "prometheus" / "rules.yml"
_D = DEFAULT_THRESHOLDS
GRID: dict[str, list[float]] = {
    "attention_lse_max_limit": [30.0, 50.0, 80.0, 120.0, 200.0],
    "growth_factor": [4.0, 8.0, 16.0, 32.0, 64.0],
    "growth_recent": [0.0, 1.0],
    **{
        k: [_D[k] * f for f in (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)]
        for k in (
            "attention_z_growth_floor",
            "attention_lse_max_growth_floor",
            "attention_rms_growth_floor",
            "mlp_rms_growth_floor",
            "router_z_growth_floor",
            "output_z_growth_floor",
        )
    },
}
OBJECTIVE: dict[str, float] = {"missed": 1.0, "late": 1.0, "false_alarms": 3.0, "pre_fault": 3.0}
MAX_PASSES = 3


def load_grid(path: Path) -> tuple[dict[str, list[float]], dict[str, float]]:
    """A grid file: ``{threshold: [values], ...}``, optionally ``"objective": {count: weight}``."""
    doc = read_object(path, f"--grid {path}", "a JSON object of threshold name -> list of values")
    objective = doc.pop("objective", OBJECTIVE)
    if not isinstance(objective, dict) or any(k not in COUNTS for k in objective):
        raise InputError(f"--grid {path}: objective: an object of count -> weight, counts among {', '.join(COUNTS)}")
    grid: dict[str, list[float]] = {}
    for k, values in doc.items():
        check_thresholds({k: 0.0}, f"--grid {path}")
        if not isinstance(values, list) or not values:
            raise InputError(f"--grid {path}: {k}: a non-empty list of values")
        if any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
            raise InputError(f"--grid {path}: {k}: numbers only, got {values!r}")
        grid[k] = [float(v) for v in values]
    return grid, {k: float(v) for k, v in objective.items()}


class Evaluator:
    """The first warnings of each run at a threshold set, one replay trace per run, results cached."""

    def __init__(self, runs: Sequence[Run], base: Overrides | None = None) -> None:
        self.runs = {r.name: r for r in runs}
        self.base = dict(base or {})  # the thresholds every set starts from: the traces are built at them
        self.cache: dict[tuple[str, tuple[tuple[str, float], ...]], Warn] = {}
        self.trace_seconds = 0.0
        self.lookups = 0
        self.computed = 0
        self.compute_seconds = 0.0

    def trace(self, run: Run) -> RunTrace:
        if run.trace is None:
            t0 = time.perf_counter()
            run.trace = RunTrace(run.batches, self.base or None)
            self.trace_seconds += time.perf_counter() - t0
        return run.trace

    def warnings(self, run: Run, over: Overrides) -> Warn:
        key = (run.name, tuple(sorted((k, v) for k, v in over.items() if v != DEFAULT_THRESHOLDS[k])))
        self.lookups += 1
        found = self.cache.get(key)
        if found is None:
            trace = self.trace(run)
            t0 = time.perf_counter()
            found = trace.first_warnings(over, run.onset)
            self.compute_seconds += time.perf_counter() - t0
            self.computed += 1
            self.cache[key] = found
        return found


Scorer = Callable[[Sequence[Run], Overrides], list[dict[str, Any]]]


def service_scorer(ev: Evaluator, truth: Mapping[str, Truth]) -> Scorer:
    def score(runs: Sequence[Run], over: Overrides) -> list[dict[str, Any]]:
        return [run_row(r, truth[r.name], ev.warnings(r, over)) for r in runs]

    return score


def search(
    runs: Sequence[Run],
    score: Scorer,
    grid: Mapping[str, Sequence[float]],
    weights: Mapping[str, float],
    start: Overrides | None = None,
) -> tuple[Overrides, dict[str, Any], int]:
    """Coordinate-wise search on ``runs`` only: (chosen overrides, their summary, sets tried).

    A threshold moves only when a value of it lowers the weighted count (:func:`ew_truth.objective`);
    among the values that lower it most, the one nearest the value in force (by ratio) is
    taken. The mean lead fraction never moves a threshold (until 2026-11-30 it broke ties: at an equal
    count it drifted to the most eager value that cost no false alarm on the families searched, the
    value most likely to cost one on the family left out)."""
    current = dict(start or {})
    best = summarize(score(runs, current))
    tried = 1
    if not runs:
        return current, best, tried
    for _ in range(MAX_PASSES):
        changed = False
        for key, values in grid.items():
            now = current.get(key, DEFAULT_THRESHOLDS[key])
            found: list[tuple[float, float, float, dict[str, Any]]] = []
            for v in values:
                if v == now:
                    continue
                s = summarize(score(runs, {**current, key: v}))
                tried += 1
                found.append((objective(s, weights), _distance(v, now), v, s))
            if found:
                count, _far, v, s = min(found, key=lambda f: (f[0], f[1]))
                if count < objective(best, weights):
                    best, current, changed = s, {**current, key: v}, True
        if not changed:
            break
    return current, best, tried


def _distance(v: float, now: float) -> float:
    """How far a threshold moves: |ln(v / now)| (the grids are multiplicative), |v - now| where either is 0."""
    if v > 0 and now > 0:
        return abs(math.log(v / now))
    return abs(v - now)


def lofo(
    runs: Sequence[Run],
    score: Scorer,
    grid: Mapping[str, Sequence[float]],
    weights: Mapping[str, float],
    start: Overrides | None = None,
) -> dict[str, dict[str, Any]]:
    """Per family F: thresholds chosen on the other families' runs, F's runs scored with them."""
    folds: dict[str, dict[str, Any]] = {}
    for family in sorted({r.family for r in runs}):
        train = [r for r in runs if r.family != family]
        held = [r for r in runs if r.family == family]
        over, train_row, tried = search(train, score, grid, weights, start)
        rows = score(held, over)
        folds[family] = {"thresholds": over, "train": train_row, "tried": tried, "rows": rows, "row": summarize(rows)}
    return folds


def prom_rows(
    runs: Sequence[Run],
    over_of: Mapping[str, Overrides],
    keys: Sequence[str],
    truth: Mapping[str, Truth],
    workdir: Path,
    cache: dict[tuple[str, tuple[tuple[str, float], ...]], Warn] | None = None,
    rules: Path = RULES,
    pace: float = 1.0,
) -> tuple[list[dict[str, Any]], list[str]]:
    """The runs scored by the Prometheus rules (``rules``), each run's scrapes with the gauges of ``keys``
    rewritten to its own threshold set and taken at ``pace`` scrapes per logged step (one promtool call
    for the runs not in ``cache``); and the keys that had no gauge to rewrite."""
    cache = {} if cache is None else cache

    def key(r: Run) -> tuple[str, tuple[tuple[str, float], ...]]:
        return r.name, tuple(sorted((k, v) for k, v in over_of[r.name].items() if v != DEFAULT_THRESHOLDS[k]))

    todo = [r for r in runs if key(r) not in cache]
    found, missing = prom_warnings(todo, over_of, keys, rules, workdir, pace) if todo else ({}, [])
    cache.update({key(r): found[r.name] for r in todo})
    return [run_row(r, truth[r.name], cache[key(r)]) for r in runs], missing


def _by_family(rows: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(f, summarize([r for r in rows if r["family"] == f])) for f in sorted({r["family"] for r in rows})]


def reproduce(runs: Sequence[Run], ev: Evaluator) -> dict[str, Any]:
    """Per run, does the replay at the recording's thresholds give the alerts its service stored?"""
    differ, used = [], {}
    for r in runs:
        over, only_service, only_replay = compare_recorded(ev.trace(r), r.scrapes, r.service_alerts, r.logged_steps)
        used.update(over)
        if only_service or only_replay:
            differ.append(
                {
                    "run": r.name,
                    "only_service": sorted(only_service, key=str),
                    "only_replay": sorted(only_replay, key=str),
                }
            )
    return {"runs": len(runs), "equal": len(runs) - len(differ), "differ": differ, "recorded_overrides": used}


def _source_tables(name: str, plan: dict[str, Any], weights: Mapping[str, float], fixed: Overrides | None) -> list[str]:
    """The printed tables of one source: per family, then the ALL rows."""
    lines = [""]
    if fixed is None:
        lines.append(f"== {name}: leave one family out (each family scored with thresholds chosen on the others) ==")
        rows = [(f"{f} (left out)", s) for f, s in _by_family(plan["lofo_rows"])]
        rows += [("ALL (left out)", summarize(plan["lofo_rows"])), ("in-sample", summarize(plan["in_sample_rows"]))]
    else:
        lines.append(f"== {name}: thresholds {format_over(fixed)} (no search) ==")
        rows = [(f, s) for f, s in _by_family(plan["given_rows"])] + [("ALL", summarize(plan["given_rows"]))]
    rows.append(("defaults", summarize(plan["default_rows"])))
    lines.append(format_rows(rows, weights))
    return lines


def report(
    args: argparse.Namespace,
    runs: list[Run],
    truth: dict[str, Truth],
    grid: dict[str, list[float]],
    weights: dict[str, float],
    fixed: Overrides | None,
) -> int:
    t0 = time.perf_counter()
    base_over = dict(args.base or {})
    ev = Evaluator(runs, base_over)
    for r in runs:
        ev.trace(r)
    # the replay checked against the stored alerts at the recording's thresholds (the traces at --base are not)
    repro: dict[str, Any] = reproduce(runs, Evaluator(runs) if base_over else ev)
    score = service_scorer(ev, truth)
    raise_of: Callable[[Run, Overrides], Overrides] = lambda _r, over: over  # noqa: E731
    if args.learn is not None:
        teach = family_peaks(runs, truth, {r.name: loss_rule_warned(ev.trace(r).fixed) for r in runs})
        score = learning_scorer(ev, truth, teach, args.learn)

        def raise_of(r: Run, over: Overrides) -> Overrides:
            return over if r.arm == BEST_ARM else learned_over(over, teach.get(r.family, {}), args.learn)

        print(f"learning: x{args.learn:g} the peaks of each family's healthy best runs (raises only): " + "; ".join(
            f"{f} {format_over({k: args.learn * v for k, v in p.items()})}" for f, p in teach.items()))  # fmt: skip
    t1 = time.perf_counter()
    service: dict[str, Any] = {"default_rows": score(runs, {})}
    over_of: dict[str, dict[str, Overrides]] = {"default_rows": {r.name: raise_of(r, {}) for r in runs}}
    folds: dict[str, dict[str, Any]] = {}
    chosen: Overrides = {}
    if fixed is None:
        folds = lofo(runs, score, grid, weights, base_over)
        chosen, _row, _tried = search(runs, score, grid, weights, base_over)
        service["lofo_rows"] = [row for f in folds.values() for row in f["rows"]]
        service["in_sample_rows"] = score(runs, chosen)
        over_of["lofo_rows"] = {r.name: raise_of(r, folds[r.family]["thresholds"]) for r in runs}
        over_of["in_sample_rows"] = {r.name: raise_of(r, chosen) for r in runs}
    else:
        fixed = {**base_over, **fixed}
        service["given_rows"] = score(runs, fixed)
        over_of["given_rows"] = {r.name: raise_of(r, fixed) for r in runs}
    t2 = time.perf_counter()
    print(
        f"ew_lofo: {len(runs)} runs, {len({r.family for r in runs})} families from {args.dir}; truth: wrong >= 0.15 "
        "nats over the family's best reference arm (median over seeds), healthy <= 0.05, grey between"
    )
    print(
        f"replay: {len(runs)} runs traced in {ev.trace_seconds:.1f} s; reproduces the service's stored alerts on "
        f"{repro['equal']}/{repro['runs']} runs"
        + (f" (recorded thresholds {repro['recorded_overrides']})" if repro["recorded_overrides"] else "")
    )
    base = baselines(runs)
    print("baselines: " + ", ".join(f"{f} {b.arm} {b.final:.3f}" for f, b in base.items()))
    for d in repro["differ"][:10]:
        print(f"  {d['run']}: only the service {d['only_service'][:4]}, only the replay {d['only_replay'][:4]}")
    rate = ev.lookups / max(t2 - t1, 1e-9)
    print(
        f"search: {ev.lookups} run x threshold-set scores ({ev.computed} computed, {ev.compute_seconds:.2f} s) "
        f"in {t2 - t1:.1f} s: {rate:.0f} per second"
    )
    lines = _source_tables("service", service, weights, fixed)
    if fixed is None:
        start = f"from {format_over(args.base)}" if args.base else "from the defaults"
        lines.append(
            f"thresholds chosen without each family (coordinate-wise search {start}; shown where not the default):"
        )
        lines += [f"  {f:12s} {format_over(fold['thresholds'])}" for f, fold in folds.items()]
        lines.append(f"  {'in-sample':12s} {format_over(chosen)}")
    print("\n".join(lines))
    prom: dict[str, Any] = {}
    if not args.no_prom:
        keys = sorted(set(grid) | set(fixed or {}))
        try:
            with tempfile.TemporaryDirectory(prefix="ew-lofo-") as tmp:
                missing: set[str] = set()
                done: dict[tuple[str, tuple[tuple[str, float], ...]], Warn] = {}
                for plan, of in over_of.items():
                    prom[plan], lost = prom_rows(runs, of, keys, truth, Path(tmp) / plan, done, args.rules, args.pace)
                    missing.update(lost)
            where = "" if args.rules == RULES else f" ({args.rules})"
            pace = "" if args.pace == 1 else f", {args.pace:g} scrapes per logged step"
            print("\n".join(_source_tables(f"prometheus{where}{pace}", prom, weights, fixed)))
            if missing:
                print(f"  no Prometheus gauge to rewrite for {', '.join(sorted(missing))}: its rules keep their values")
        except RuntimeError as exc:
            print(f"\nprometheus skipped: {exc}")
            prom = {}
    print("\nper run (service; thresholds chosen without the run's family):" if fixed is None else "\nper run:")
    plan = "lofo_rows" if fixed is None else "given_rows"
    prom_by = {row["name"]: row for row in prom.get(plan, [])}
    for row in sorted(service[plan], key=lambda x: (x["family"], x["name"])):
        pr = prom_by.get(row["name"], {})
        print(
            f"  {row['name']:34s} {row['verdict']:7s} excess {_fmt(row['excess'], '+.3f')} "
            f"dep {_fmt(row['departure'])} "
            f"first {_fmt(row['first_warning'])} lead {_fmt(row['lead_frac'], '.2f')} steps {_fmt(row['lead_steps'])}"
            + (f" | prom first {_fmt(pr.get('first_warning'))}" if pr else "")
            + (" FA" if row["false_alarm"] else "")
            + (" preFA" if row["pre_fault"] else "")
        )
    print(f"total {time.perf_counter() - t0:.1f} s")
    if args.json:
        doc = {
            "dir": str(args.dir),
            "grid": grid,
            "objective": weights,
            "given": fixed,
            "reproduction": repro,
            "baselines": {f: {"arm": b.arm, "final": b.final, "arm_medians": b.arm_medians} for f, b in base.items()},
            "timing": {"trace_s": ev.trace_seconds, "search_s": t2 - t1, "scores": ev.lookups, "per_s": rate},
            "folds": {f: {k: v for k, v in fold.items() if k != "rows"} for f, fold in folds.items()},
            "thresholds": {plan: of for plan, of in over_of.items()},
            "sources": {"service": service, "prometheus": prom},
            "summaries": {
                src: {plan: summarize(rows) for plan, rows in plans.items()}
                for src, plans in (("service", service), ("prometheus", prom))
            },
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(strict_json(doc), indent=1, allow_nan=False))
    return 0


def _fmt(v: Any, spec: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return format(v, spec)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path, help="the recording: DIR/runs/<name>.json (bench/early_warning/ew_record.py)")
    p.add_argument("--no-prom", action="store_true", help="skip the Prometheus source (promtool)")
    p.add_argument("--json", type=Path, help="write every row, fold and run here")
    p.add_argument("--grid", type=Path, help="a JSON grid: {threshold: [values]}, optionally 'objective'")
    p.add_argument("--thresholds", help="JSON overrides to score as they are, without a search")
    p.add_argument("--base", help="JSON overrides every threshold set starts from (kept by the search)")
    p.add_argument(
        "--rules", type=Path, default=RULES, help="the Prometheus rules to replay (default: prometheus/rules.yml)"
    )
    p.add_argument(
        "--pace",
        type=float,
        default=1.0,
        help="Prometheus scrapes per logged step: k (a run that logs every k scrape intervals) or 1/k, e.g. 0.5 "
        "(every k-th logged step scraped); default 1, as recorded",
    )
    learn = p.add_mutually_exclusive_group()
    learn.add_argument(
        "--learn",
        type=float,
        metavar="MULTIPLE",
        default=DEFAULT_THRESHOLDS["learn_multiple"] if LEARN_BY_DEFAULT else None,
        help="each family learns its level thresholds from its healthy best runs, MULTIPLE x their peaks, as a "
        "service group with learn_thresholds does (default: the service's, learn_multiple "
        f"{DEFAULT_THRESHOLDS['learn_multiple']:g}, {'on' if LEARN_BY_DEFAULT else 'off'} by default)",
    )
    learn.add_argument(
        "--no-learn", dest="learn", action="store_const", const=None, help="no learning: every run a group's first"
    )
    args = p.parse_args(argv)
    try:
        runs = load_dir(args.dir)
        grid, weights = load_grid(args.grid) if args.grid else (GRID, OBJECTIVE)
        fixed = None
        if args.thresholds is not None:
            try:
                fixed = check_thresholds(json.loads(args.thresholds), "--thresholds")
            except ValueError as exc:
                raise InputError(f"--thresholds: not JSON ({exc}): give e.g. '{{\"growth_factor\": 8}}'") from exc
        if args.base is not None:
            try:
                args.base = check_thresholds(json.loads(args.base), "--base")
            except ValueError as exc:
                raise InputError(f"--base: not JSON ({exc}): give e.g. '{{\"attention_z_min\": 1e9}}'") from exc
        if not args.rules.is_file():
            raise InputError(f"--rules {args.rules}: no such file; give a Prometheus rules file")
        try:
            at_pace({}, [], args.pace)
        except ValueError as exc:
            raise InputError(f"--pace: {exc}") from exc
        if args.learn is not None and not (math.isfinite(args.learn) and args.learn > 0):
            raise InputError(f"--learn {args.learn}: a multiple above 0, e.g. 3")
        truth = ground_truth(runs)
    except (InputError, ValueError) as exc:
        print(f"ew_lofo: {exc}", file=sys.stderr)
        return 2
    return report(args, runs, truth, grid, weights, fixed)


if __name__ == "__main__":
    raise SystemExit(main())
