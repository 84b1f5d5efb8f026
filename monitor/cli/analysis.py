"""``hyperwatch fit``: the paper's fits on a CSV file, JSON on stdout.

    hyperwatch fit lr --csv sweep.csv [--lr-col lr --loss-col loss --group-col depth]
    hyperwatch fit power-law --csv laws.csv --x tokens --y lr [--irreducible]
    hyperwatch fit scaling --csv runs.csv --baseline muon [--method-col method --flops-col flops --loss-col loss]
    hyperwatch fit sensitivity --csv sweep.csv [--lr-col lr --loss-col loss --max-subsets N --seed S]
    hyperwatch fit stability --csv points.csv [--run-col run --scale-col scale --indicator-col indicator ...]

Bad input exits with status 2 and one line on stderr naming the file, the column (and line) and
the fix. Non-finite numbers in the JSON are the strings "NaN", "Infinity", "-Infinity".
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from hyperwatch.monitor.analysis._common import AnalysisError, jsonable
from hyperwatch.monitor.analysis.csvio import CSVError, Table, read_csv
from hyperwatch.monitor.analysis.lr import R2_THRESHOLD, LRFit, fit_optimal_lr
from hyperwatch.monitor.analysis.sensitivity import DEFAULT_MAX_SUBSETS, lr_sensitivity
from hyperwatch.monitor.analysis.stability import DEFAULT_RTOL, stability_verdict


class _InputError(Exception):
    """A fit refused the data of a file: the message names the file and column."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; give a positive integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive; give a positive integer")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give a number in (0, 1]") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"{value} is outside (0, 1]; the paper uses 0.99")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; give a number >= 0") from None
    if not (math.isfinite(value) and value >= 0.0):
        raise argparse.ArgumentTypeError(f"{value} is not a finite number >= 0")
    return value


def _refused(table: Table, exc: AnalysisError, columns: dict[str, str]) -> _InputError:
    """Rephrase a fit's error about an input (lr, loss, x...) as one about the file's column."""
    column = columns.get(exc.field, exc.field)
    return _InputError(f"{table.path}: column {column!r}: {exc.detail}")


def _fit_lr(args: argparse.Namespace) -> Any:
    table = read_csv(args.csv)
    lr = table.numeric(args.lr_col, "--lr-col")
    loss = table.numeric(args.loss_col, "--loss-col")
    columns = {"lr": args.lr_col, "loss": args.loss_col}
    if args.group_col is None:
        try:
            return fit_optimal_lr(lr, loss, args.r2_threshold)
        except AnalysisError as exc:
            raise _refused(table, exc, columns) from exc
    keys = table.text(args.group_col, "--group-col")
    groups = list(dict.fromkeys(keys))
    key_arr = np.asarray(keys, dtype=object)
    numeric = _all_positive_numbers(groups)
    fits: list[LRFit] = []
    for g in groups:
        sel = key_arr == g
        try:
            fit = fit_optimal_lr(lr[sel], loss[sel], args.r2_threshold)
        except AnalysisError as exc:
            raise _InputError(
                f"{table.path}: {args.group_col} = {g}: column {columns.get(exc.field, exc.field)!r}: {exc.detail}"
            ) from exc
        fits.append(fit)
    out: dict[str, Any] = {
        "group_col": args.group_col,
        "groups": [{"group": float(g) if numeric else g, "fit": f} for g, f in zip(groups, fits, strict=True)],
        "transfer": None,
        "transfer_note": None,
    }
    if len(groups) < 2:
        out["transfer_note"] = "one group: a law of optimal lr vs the group value needs at least 2"
    elif not numeric:
        out["transfer_note"] = f"column {args.group_col!r} is not all positive numbers: no power law fitted"
    else:
        xs = [float(g) for g in groups]
        try:
            from hyperwatch.monitor.analysis.powerlaw import fit_power_law  # scipy: loaded when used

            out["transfer"] = fit_power_law(xs, [f.optimal_lr for f in fits])
        except AnalysisError as exc:
            out["transfer_note"] = f"optimal lr vs {args.group_col}: {exc.detail}"
    return out


def _all_positive_numbers(cells: list[str]) -> bool:
    try:
        return all(math.isfinite(float(c)) and float(c) > 0 for c in cells)
    except ValueError:
        return False


def _fit_power_law(args: argparse.Namespace) -> Any:
    table = read_csv(args.csv)
    x = table.positive(args.x, "--x", what="x for a power law")
    y = table.finite(args.y, "--y")
    try:
        from hyperwatch.monitor.analysis.powerlaw import fit_power_law  # scipy: loaded when used

        fit = fit_power_law(x, y, irreducible=args.irreducible)
    except AnalysisError as exc:
        raise _refused(table, exc, {"x": args.x, "y": args.y}) from exc
    return {"x": args.x, "y": args.y, **fit.to_json()}


def _fit_scaling(args: argparse.Namespace) -> Any:
    table = read_csv(args.csv)
    methods = table.text(args.method_col, "--method-col")
    flops = table.positive(args.flops_col, "--flops-col", what="FLOPs count")
    loss = table.numeric(args.loss_col, "--loss-col")
    floor = {"auto": None, "yes": True, "no": False}[args.floor]
    try:
        from hyperwatch.monitor.analysis.scaling import compare_methods  # scipy: loaded when used

        return compare_methods(methods, flops, loss, args.baseline, floor)
    except AnalysisError as exc:
        if exc.field == "baseline":
            raise _InputError(f"{table.path}: --baseline {exc.detail}") from exc
        raise _refused(table, exc, {"flops": args.flops_col, "loss": args.loss_col}) from exc


def _fit_sensitivity(args: argparse.Namespace) -> Any:
    table = read_csv(args.csv)
    lr = table.numeric(args.lr_col, "--lr-col")
    loss = table.numeric(args.loss_col, "--loss-col")
    try:
        return lr_sensitivity(lr, loss, args.max_subsets, args.seed, args.r2_threshold)
    except AnalysisError as exc:
        raise _refused(table, exc, {"lr": args.lr_col, "loss": args.loss_col}) from exc


def _fit_stability(args: argparse.Namespace) -> Any:
    table = read_csv(args.csv)
    runs = table.text(args.run_col, "--run-col")
    scales = table.positive(args.scale_col, "--scale-col", what="scale")
    names = table.text(args.indicator_col, "--indicator-col")
    steps = table.finite(args.step_col, "--step-col")
    values = table.numeric(args.value_col, "--value-col")
    records: dict[str, dict[str, Any]] = {}
    for run, scale, name, step, value, line in zip(runs, scales, names, steps, values, table.lines, strict=True):
        rec = records.setdefault(run, {"run": run, "scale": float(scale), "series": {}})
        if rec["scale"] != scale:
            raise CSVError(
                table.path,
                args.scale_col,
                f"line {line}: run {run!r} has scale {scale:g} here and {rec['scale']:g} before; give a run one scale",
            )
        rec["series"].setdefault(name, []).append((step, value))
    payload = [
        {
            "run": r["run"],
            "scale": r["scale"],
            "indicators": {n: [v for _, v in sorted(s)] for n, s in r["series"].items()},
        }
        for r in records.values()
    ]
    return stability_verdict(payload, rtol=args.rtol, atol=args.atol)


_COMMANDS: dict[str, Callable[[argparse.Namespace], Any]] = {
    "lr": _fit_lr,
    "power-law": _fit_power_law,
    "scaling": _fit_scaling,
    "sensitivity": _fit_sensitivity,
    "stability": _fit_stability,
}


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Scaling analysis on a CSV file (one row per run); prints JSON.",
    )
    sub = parser.add_subparsers(dest="fit", required=True, metavar="{" + ",".join(_COMMANDS) + "}")

    p = sub.add_parser("lr", help="optimal LR of a sweep: quadratic in log(lr), observed-best fallback")
    p.add_argument("--csv", required=True, help="CSV file with one row per run")
    p.add_argument("--lr-col", default="lr", help="column of learning rates (default: lr)")
    p.add_argument("--loss-col", default="loss", help="column of final losses (default: loss)")
    p.add_argument("--group-col", default=None, help="fit one sweep per value of this column (e.g. depth)")
    p.add_argument("--r2-threshold", type=_fraction, default=R2_THRESHOLD, help="fallback below this R^2")

    p = sub.add_parser("power-law", help="y = a * x^b by nonlinear least squares, leave-one-out MAPE")
    p.add_argument("--csv", required=True, help="CSV file")
    p.add_argument("--x", required=True, help="column of x (positive)")
    p.add_argument("--y", required=True, help="column of y")
    p.add_argument("--irreducible", action="store_true", help="fit y = a * x^b + c")

    p = sub.add_parser("scaling", help="L = A * C^-b + C0 per method, leverage over a baseline")
    p.add_argument("--csv", required=True, help="CSV file with one row per run")
    p.add_argument("--baseline", required=True, help="the method the others are compared with")
    p.add_argument("--method-col", default="method", help="column naming the method (default: method)")
    p.add_argument("--flops-col", default="flops", help="column of training FLOPs (default: flops)")
    p.add_argument("--loss-col", default="loss", help="column of final losses (default: loss)")
    p.add_argument(
        "--floor",
        choices=("auto", "yes", "no"),
        default="auto",
        help="fit the irreducible loss C0: auto = when a method has 5 or more budgets (default)",
    )

    p = sub.add_parser("sensitivity", help="error of k-point subsets of an LR sweep against the full fit")
    p.add_argument("--csv", required=True, help="CSV file of one LR sweep")
    p.add_argument("--lr-col", default="lr", help="column of learning rates (default: lr)")
    p.add_argument("--loss-col", default="loss", help="column of final losses (default: loss)")
    p.add_argument("--max-subsets", type=_positive_int, default=DEFAULT_MAX_SUBSETS, help="sample beyond this")
    p.add_argument("--seed", type=int, default=0, help="seed of the subset sample (default: 0)")
    p.add_argument("--r2-threshold", type=_fraction, default=R2_THRESHOLD, help="fallback below this R^2")

    p = sub.add_parser("stability", help="transferable-stability verdict from indicator series at several scales")
    p.add_argument("--csv", required=True, help="CSV file, one row per (run, indicator, step)")
    p.add_argument("--run-col", default="run", help="column naming the run (default: run)")
    p.add_argument("--scale-col", default="scale", help="column of the run's scale (default: scale)")
    p.add_argument("--indicator-col", default="indicator", help="column of indicator names (default: indicator)")
    p.add_argument("--step-col", default="step", help="column of steps (default: step)")
    p.add_argument("--value-col", default="value", help="column of values (default: value)")
    p.add_argument("--rtol", type=_non_negative, default=DEFAULT_RTOL, help="relative tolerance (default: 0.05)")
    p.add_argument("--atol", type=_non_negative, default=0.0, help="absolute tolerance (default: 0)")
    return parser


def run(args: argparse.Namespace) -> int:
    prog = f"hyperwatch fit {args.fit}"
    try:
        result = _COMMANDS[args.fit](args)
    except CSVError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except _InputError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except AnalysisError as exc:
        print(f"{prog}: {args.csv}: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(jsonable(result), indent=2, allow_nan=False))
    return 0
