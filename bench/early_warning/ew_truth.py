"""Ground truth of the model-family benchmark (issue 33): what the loss says about each recorded run.

Per family, its **baseline** is the lowest, over the family's reference arms (its best-LR twin
``best`` and the LR ladder), of the arm's *median over seeds* of the final loss (the mean of the last
10% of the per-step losses, non-finite when any loss is; a non-finite final ranks above every finite
one). A run's **excess** is its final loss minus the baseline:

- **wrong**: a loss is non-finite, or the excess is at least ``WRONG_EXCESS`` (0.15 nats);
- **healthy**: the excess is at most ``HEALTHY_EXCESS`` (0.05 nats);
- **grey** in between: reported, never counted as a miss or a false alarm.

The **departure** is the first step from which the run's loss, smoothed over 10 steps, stays more than
0.05 nats above the baseline arm's per-step median curve (smoothed the same way) to the end, or is
non-finite (:func:`ew_score.departure_step`). A fault injected mid-run (``onset``) keeps the family's
``best`` arm until the onset: its **prefix** is healthy when that arm's run of the same seed is (or,
without one, the arm's median), and a warning before the onset is then a false alarm (``preFA``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any, Protocol

from ew_score import TARGET_FRAC, departure_step, final_loss

from hyperwatch.monitor.thresholds.defaults import DEFAULT_THRESHOLDS

WRONG_EXCESS = 0.15
HEALTHY_EXCESS = 0.05
DEPART = 0.05
SMOOTH = 10
TAIL = 0.1
BEST_ARM = "best"


class TruthRun(Protocol):
    """What the truth reads of a recorded run."""

    name: str
    family: str
    arm: str
    seed: int
    onset: int | None
    reference: bool
    losses: list[float]
    steps: int
    fault: str | None


Warn = tuple[int | None, int | None]  # (first warning, first at or after the onset)
COUNTS = (
    "runs",
    "wrong",
    "warned",
    "within_25pct",
    "late",
    "missed",
    "healthy",
    "false_alarms",
    "pre_fault",
    "grey",
    "before_departure",
)


@dataclass
class Baseline:
    """A family's best known setting: the reference arm with the lowest median final loss."""

    family: str
    arm: str
    final: float
    curve: list[float]  # the arm's per-step median loss over its seeds
    arm_medians: dict[str, float]  # every reference arm's median final (inf: non-finite)


@dataclass
class Truth:
    """What the loss says about one run."""

    final: float  # NaN when any loss is non-finite
    excess: float  # final - the family's baseline (NaN when non-finite)
    verdict: str  # "wrong", "healthy" or "grey"
    departure: int | None
    baseline_arm: str
    prefix_healthy: bool | None = None  # a fault injected mid-run: was the run healthy before it? (else None)


def verdict(excess: float) -> str:
    """``wrong`` (non-finite, or >= 0.15 nats over the baseline), ``healthy`` (<= 0.05) or ``grey``."""
    if not math.isfinite(excess) or excess >= WRONG_EXCESS:
        return "wrong"
    return "healthy" if excess <= HEALTHY_EXCESS else "grey"


def _ranked(value: float) -> float:
    """A value to take a median of: non-finite (a run gone wrong) ranks above every finite one."""
    return value if math.isfinite(value) else math.inf


def median_curve(curves: Sequence[Sequence[float]]) -> list[float]:
    """Per step, the median over the curves that reach it (non-finite values rank as +inf)."""
    n = max((len(c) for c in curves), default=0)
    return [median(_ranked(c[i]) for c in curves if len(c) > i) for i in range(n)]


def baselines(runs: Sequence[TruthRun]) -> dict[str, Baseline]:
    """Per family, its :class:`Baseline`; ValueError naming the family when none of its reference arms
    has a finite median final loss (or it has no reference arm)."""
    out: dict[str, Baseline] = {}
    for family in sorted({r.family for r in runs}):
        arms: dict[str, list[TruthRun]] = {}
        for r in runs:
            if r.family == family and r.reference:
                arms.setdefault(r.arm, []).append(r)
        medians = {arm: median(_ranked(final_loss(r.losses, TAIL)) for r in rs) for arm, rs in arms.items()}
        finite = {arm: m for arm, m in medians.items() if math.isfinite(m)}
        if not finite:
            raise ValueError(
                f"family {family}: no reference arm (reference: true) with a finite median final loss "
                f"(arms {sorted(arms) or 'none'}): record its best-LR twin and LR ladder"
            )
        arm = min(finite, key=lambda a: (finite[a], a))
        curve = median_curve([r.losses for r in arms[arm]])
        out[family] = Baseline(family, arm, finite[arm], curve, medians)
    return out


def ground_truth(runs: Sequence[TruthRun]) -> dict[str, Truth]:
    """Per run name, its :class:`Truth` against its family's baseline."""
    base = baselines(runs)
    finals = {r.name: final_loss(r.losses, TAIL) if r.losses else math.nan for r in runs}
    best = {(r.family, r.seed): r for r in runs if r.arm == BEST_ARM}
    out: dict[str, Truth] = {}
    for r in runs:
        b = base[r.family]
        final = finals[r.name]
        excess = final - b.final
        dep = departure_step(r.losses, b.curve, DEPART, SMOOTH) if r.losses else None
        prefix: bool | None = None
        if r.onset is not None:
            twin = best.get((r.family, r.seed))
            if twin is not None:
                prefix = verdict(finals[twin.name] - b.final) == "healthy"
            else:
                arm_median = b.arm_medians.get(BEST_ARM, b.final)
                prefix = verdict(arm_median - b.final) == "healthy"
        out[r.name] = Truth(final, excess, verdict(excess), dep, b.arm, prefix)
    return out


# --- scoring: a run's first warnings against its truth, and the counts of many runs ---


def run_row(run: TruthRun, t: Truth, warn: Warn) -> dict[str, Any]:
    """One run scored: its truth, the warning that counts, its lead and what it counts as."""
    first, after = warn
    step = first if run.onset is None else after
    frac = None
    if step is not None:
        frac = step / run.steps if run.onset is None else (step - run.onset) / max(1, run.steps - run.onset)
    pre = run.onset is not None and bool(t.prefix_healthy) and first is not None and first < run.onset
    wrong, healthy = t.verdict == "wrong", t.verdict == "healthy"
    return {
        "name": run.name,
        "family": run.family,
        "arm": run.arm,
        "seed": run.seed,
        "fault": run.fault,
        "onset": run.onset,
        "final": t.final,
        "excess": t.excess,
        "verdict": t.verdict,
        "departure": t.departure,
        "first_warning": first,
        "warning": step if wrong else None,
        "lead_frac": frac if wrong else None,
        "lead_steps": t.departure - step if wrong and step is not None and t.departure is not None else None,
        "warned": wrong and step is not None,
        "late": wrong and frac is not None and frac > TARGET_FRAC,
        "missed": wrong and step is None,
        "false_alarm": healthy and first is not None,
        "pre_fault": pre and not healthy,
    }


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The counts of scored runs (``grey``: between the cut-offs, never a miss or a false alarm)."""
    fracs = [r["lead_frac"] for r in rows if r["warned"]]
    return {
        "runs": len(rows),
        "wrong": sum(r["verdict"] == "wrong" for r in rows),
        "warned": sum(r["warned"] for r in rows),
        "within_25pct": sum(f <= TARGET_FRAC for f in fracs),
        "late": sum(r["late"] for r in rows),
        "missed": sum(r["missed"] for r in rows),
        "healthy": sum(r["verdict"] == "healthy" for r in rows),
        "false_alarms": sum(r["false_alarm"] for r in rows),
        "pre_fault": sum(r["pre_fault"] for r in rows),
        "grey": sum(r["verdict"] == "grey" for r in rows),
        "before_departure": sum(r["lead_steps"] is not None and r["lead_steps"] > 0 for r in rows),
        "mean_lead_frac": sum(fracs) / len(fracs) if fracs else None,
    }


def add_up(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Summaries summed (the mean lead fraction weighted by the warned runs)."""
    out: dict[str, Any] = {k: sum(s[k] for s in summaries) for k in COUNTS}
    weighted = [(s["mean_lead_frac"], s["warned"]) for s in summaries if s["mean_lead_frac"] is not None]
    n = sum(w for _f, w in weighted)
    out["mean_lead_frac"] = sum(f * w for f, w in weighted) / n if n else None
    return out


def objective(summary: Mapping[str, Any], weights: Mapping[str, float]) -> float:
    """The weighted count (lower is better); the mean lead fraction is reported, never weighed."""
    return sum(w * summary[k] for k, w in weights.items())


TABLE = (
    ("label", 20),
    ("runs", 4),
    ("wrong", 5),
    ("warned", 6),
    ("within_25pct", 5),
    ("late", 4),
    ("missed", 6),
    ("healthy", 7),
    ("false_alarms", 3),
    ("pre_fault", 5),
    ("grey", 4),
    ("before_departure", 7),
    ("mean_lead_frac", 9),
    ("objective", 5),
)
HEAD = {"within_25pct": "<=25%", "false_alarms": "FA", "pre_fault": "preFA", "before_departure": "pre-dep",
        "mean_lead_frac": "mean frac", "objective": "obj"}  # fmt: skip


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}" if not v.is_integer() else f"{v:.0f}"
    return str(v)


def format_rows(rows: Sequence[tuple[str, dict[str, Any]]], weights: Mapping[str, float]) -> str:
    head = " | ".join(HEAD.get(k, k).ljust(w) for k, w in TABLE)
    lines = [head, "-" * len(head)]
    for label, s in rows:
        cells = {**s, "label": label, "objective": objective(s, weights)}
        lines.append(" | ".join(_cell(cells[k]).ljust(w) for k, w in TABLE))
    return "\n".join(lines)


def format_over(over: Mapping[str, float]) -> str:
    diff = {k: v for k, v in over.items() if v != DEFAULT_THRESHOLDS[k]}
    return ", ".join(f"{k} {v:g}" for k, v in sorted(diff.items())) or "defaults"


def strict_json(obj: Any) -> Any:
    """``obj`` with non-finite floats as ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (as the recordings
    write them) and tuples, sets and other keys as JSON knows them: strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {str(k): strict_json(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [strict_json(v) for v in obj]
    return obj
