"""Scoring of the early-warning benchmark: pure functions over loss curves and first-warning steps.

Ground truth comes from the loss alone, never from an indicator under test:

- a run's *final loss* is the mean of its last ``tail`` fraction of per-step training losses;
- a run **went wrong** when any of its losses is non-finite, or its final loss is worse than its
  healthy twin's by more than ``margin`` nats. The twin is the best (finite) run of the cell's
  healthy arm (same scenario, same model source, a safe LR, several seeds);
- its **departure** is the first step from which its loss, averaged over a trailing ``smooth`` steps,
  stays above the twin's by more than ``depart`` nats (0.05) to the end, or is non-finite.

Per alert source (service detectors, Prometheus rules) a run's first warning step is scored:
``lead_frac`` = first warning step / steps trained (the target: <= 0.25 for every run that went
wrong), ``lead_steps`` = departure step - first warning step (> 0: warned before the loss departed),
and a warning on a run that did not go wrong is a false alarm.

A run whose fault is injected mid-run (an LR bump from step ``onset``) is healthy until its onset:
nothing can warn of it before, and a warning before it is a false alarm on the healthy part
(``pre_fault``). Its warning is the first at or after the onset, and its ``lead_frac`` is counted on
the training left from the onset: (warning - onset) / (steps - onset).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

TARGET_FRAC = 0.25
# the counts the ALL row sums over a source's rows
SUMMED = (
    "runs",
    "wrong",
    "warned",
    "within_25pct",
    "missed",
    "before_departure",
    "healthy",
    "false_alarms",
    "pre_fault",
)


@dataclass
class RunResult:
    """One run as the scorer sees it: its cell, its per-step losses and, per source, its first warning step."""

    name: str
    scenario: str
    source: str
    steps: int
    losses: list[float]
    first_warning: dict[str, int | None] = field(default_factory=dict)  # alert source -> step (None: never)
    onset: int | None = None  # the step a fault is injected from (None: the run is what its config makes it)
    after_onset: dict[str, int | None] = field(default_factory=dict)  # alert source -> first step >= onset

    def warning(self, alert: str) -> tuple[int | None, float | None]:
        """The warning that counts for a run gone wrong, and its lead fraction: the first one, or with
        an injected fault the first at or after the onset, on the training left from the onset."""
        if self.onset is None:
            step = self.first_warning.get(alert)
            return step, None if step is None else step / self.steps
        step = self.after_onset.get(alert)
        return step, None if step is None else (step - self.onset) / (self.steps - self.onset)

    def pre_fault(self, alert: str) -> bool:
        """Warned before its injected fault, while the run was still healthy: a false alarm."""
        first = self.first_warning.get(alert)
        return self.onset is not None and first is not None and first < self.onset

    @property
    def cell(self) -> str:
        return f"{self.scenario}/{self.source}"


@dataclass
class Truth:
    """What the loss says about one run."""

    final: float
    wrong: bool
    departure: int | None  # first step the loss departs from the twin's by ``depart`` nats
    twin: str
    excess: float = math.nan  # final loss - the twin's (NaN when non-finite)


def final_loss(losses: Sequence[float], tail: float = 0.1) -> float:
    """Mean of the last ``tail`` fraction of the losses; NaN when any loss is non-finite."""
    if not losses:
        raise ValueError("final_loss: no losses (the run trained no step)")
    if any(not math.isfinite(v) for v in losses):
        return math.nan
    n = max(1, round(len(losses) * tail))
    return sum(losses[-n:]) / n


def trailing_mean(losses: Sequence[float], smooth: int) -> list[float]:
    """Mean over the trailing ``smooth`` steps (fewer at the start); non-finite stays non-finite."""
    out: list[float] = []
    for i in range(len(losses)):
        window = losses[max(0, i - smooth + 1) : i + 1]
        out.append(sum(window) / len(window))
    return out


def departure_step(
    losses: Sequence[float], twin: Sequence[float], depart: float = 0.05, smooth: int = 10
) -> int | None:
    """First step from which the smoothed loss stays above the twin's by more than ``depart`` to the
    end of the run (a sustained departure, not early noise between inits), or is non-finite."""
    mine, theirs = trailing_mean(losses, smooth), trailing_mean(twin, smooth)
    n = min(len(mine), len(theirs))
    if n < len(mine):  # the twin stopped early (non-finite): compare where both exist
        mine = mine[:n]
    found: int | None = None
    for i in range(len(mine) - 1, -1, -1):
        a, b = mine[i], theirs[i]
        if not math.isfinite(a):
            found = i
            continue
        if math.isfinite(b) and a - b > depart:
            found = i
        else:
            break
    first_bad = next((i for i, v in enumerate(mine) if not math.isfinite(v)), None)
    if first_bad is not None:  # a non-finite loss departs wherever it happens
        return first_bad if found is None else min(found, first_bad)
    return found


def ground_truth(
    runs: Sequence[RunResult],
    twins: Mapping[str, Sequence[str]] | None = None,
    margin: float = 0.1,
    depart: float = 0.05,
    smooth: int = 10,
    tail: float = 0.1,
) -> dict[str, Truth]:
    """Per run name, its :class:`Truth`, against its cell's healthy twin: the run with the best finite
    final loss among ``twins[cell]`` (the cell's healthy arm, e.g. its seeds), or among the whole
    cell when no twin is named."""
    cells: dict[str, list[RunResult]] = {}
    for r in runs:
        cells.setdefault(r.cell, []).append(r)
    truth: dict[str, Truth] = {}
    for cell, members in cells.items():
        finals = {r.name: final_loss(r.losses, tail) for r in members}
        named = set((twins or {}).get(cell, ()))
        pool = [r for r in members if (not named or r.name in named) and math.isfinite(finals[r.name])]
        if not pool:
            raise ValueError(f"cell {cell}: no finite run among its healthy twins, there is nothing to compare to")
        best = min(pool, key=lambda r: finals[r.name])
        for r in members:
            f = finals[r.name]
            wrong = not math.isfinite(f) or f > finals[best.name] + margin
            dep = None if r is best else departure_step(r.losses, best.losses, depart, smooth)
            truth[r.name] = Truth(f, wrong, dep, best.name, f - finals[best.name])
    return truth


def clear_false_alarms(names: Sequence[str], truth: Mapping[str, Truth], clear: float) -> list[str]:
    """The false alarms on runs that are clearly healthy: final loss within ``clear`` nats of the twin's.

    The others sat between ``clear`` and the margin: worse than the twin, not worse enough to count
    as gone wrong. Both are false alarms; this says which kind (the strict count stays the target)."""
    return [n for n in names if not truth[n].wrong and truth[n].excess <= clear]


def first_loss_warning(steps_by_rule: Mapping[str, Sequence[int]], since: int = 0) -> int | None:
    """The first step from ``since`` on at which a rule judged by the loss warned (the MaxVio rules
    guard expert load: they have their own table)."""
    return min(
        (s for rule, steps in steps_by_rule.items() if rule not in EFFICIENCY_RULES for s in steps if s >= since),
        default=None,
    )


def _median(values: list[float]) -> float | None:
    return median(values) if values else None


def score(runs: Sequence[RunResult], truth: dict[str, Truth], alert_sources: Sequence[str]) -> list[dict[str, Any]]:
    """One row per (scenario, model source, alert source): counts, leads, misses and false alarms."""
    rows: list[dict[str, Any]] = []
    keys = sorted({(r.scenario, r.source) for r in runs})
    for scenario, source in keys:
        members = [r for r in runs if (r.scenario, r.source) == (scenario, source)]
        for alert in alert_sources:
            wrong = [r for r in members if truth[r.name].wrong]
            healthy = [r for r in members if not truth[r.name].wrong]
            hits = {r.name: r.warning(alert) for r in wrong}
            warned = [r for r in wrong if hits[r.name][0] is not None]
            fracs = [f for r in warned if (f := hits[r.name][1]) is not None]
            leads = [
                dep - step
                for r in warned
                if (dep := truth[r.name].departure) is not None and (step := hits[r.name][0]) is not None
            ]
            rows.append(
                {
                    "scenario": scenario,
                    "model": source,
                    "alerts": alert,
                    "runs": len(members),
                    "wrong": len(wrong),
                    "warned": len(warned),
                    "within_25pct": sum(f <= TARGET_FRAC for f in fracs),
                    "missed": len(wrong) - len(warned),
                    "median_lead_frac": _median(fracs),
                    "worst_lead_frac": max(fracs) if fracs else None,
                    "before_departure": sum(v > 0 for v in leads),
                    "median_lead_steps": _median([float(v) for v in leads]),
                    "healthy": len(healthy),
                    "false_alarms": sum(r.first_warning.get(alert) is not None for r in healthy),
                    "pre_fault": sum(r.pre_fault(alert) for r in wrong),
                }
            )
    return rows


def totals(rows: Sequence[dict[str, Any]], alert_sources: Sequence[str]) -> list[dict[str, Any]]:
    """The rows summed per alert source (medians are not summed: the worst lead fraction is kept)."""
    out = []
    for alert in alert_sources:
        mine = [r for r in rows if r["alerts"] == alert]
        worst = [r["worst_lead_frac"] for r in mine if r["worst_lead_frac"] is not None]
        out.append(
            {
                "scenario": "ALL",
                "model": "*",
                "alerts": alert,
                **{k: sum(r[k] for r in mine) for k in SUMMED},
                "median_lead_frac": None,
                "worst_lead_frac": max(worst) if worst else None,
                "median_lead_steps": None,
            }
        )
    return out


COLUMNS = (
    ("scenario", 13),
    ("model", 7),
    ("alerts", 10),
    ("runs", 4),
    ("wrong", 5),
    ("warned", 6),
    ("within_25pct", 8),
    ("missed", 6),
    ("median_lead_frac", 9),
    ("worst_lead_frac", 9),
    ("before_departure", 9),
    ("median_lead_steps", 9),
    ("healthy", 7),
    ("false_alarms", 6),
    ("pre_fault", 5),
)
HEADERS = {
    "within_25pct": "<=25%",
    "median_lead_frac": "med frac",
    "worst_lead_frac": "max frac",
    "before_departure": "pre-dep",
    "median_lead_steps": "lead stp",
    "false_alarms": "FA",
    "pre_fault": "preFA",
}


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if not value.is_integer() or abs(value) < 1 else f"{value:.0f}"
    return str(value)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a fixed-width text table."""
    head = " | ".join(HEADERS.get(k, k).ljust(w) for k, w in COLUMNS)
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(" | ".join(_cell(r[k]).ljust(w) for k, w in COLUMNS))
    return "\n".join(lines)


# --- the efficiency guard: MaxVio alarms judged by the expert load they guard, not by the loss ---

EFFICIENCY_RULES = frozenset({"max_vio_collapse", "HyperWatchMaxVioCollapse"})  # service rule, Prometheus alert


@dataclass
class LoadTruth:
    """What the routed token counts say about one MoE run at the end of training."""

    busiest_share: float  # worst layer: busiest expert's tokens / all routed tokens, over the tail
    busiest_vs_fair: float  # busiest_share x n_experts (1.0 = perfectly even)
    dead_experts: int  # worst layer: experts that received no token over the tail
    wrong: bool


def expert_load_truth(counts: Sequence[Sequence[Sequence[int]]], tail: float = 0.1, limit: float = 2.0) -> LoadTruth:
    """Ground truth for "expert load went wrong", from the routed counts themselves.

    ``counts[step][layer][expert]``: tokens routed per step, read by the benchmark from the trainer's
    MoE layers (never from an alert). Over the last ``tail`` fraction of the steps, per layer: the busiest
    expert's share of the routed tokens; the load went wrong when, in any layer, the busiest expert got
    more than ``limit`` times its fair share (1 / experts) or some expert got no token at all."""
    if not counts or not counts[0]:
        raise ValueError("expert_load_truth: no routed counts (is the model an MoE, and did it train a step?)")
    n = max(1, round(len(counts) * tail))
    window = counts[-n:]
    layers, experts = len(window[0]), len(window[0][0])
    worst_share, worst_dead = 0.0, 0
    for layer in range(layers):
        load = [sum(step[layer][e] for step in window) for e in range(experts)]
        total = sum(load)
        if total <= 0:
            raise ValueError(f"expert_load_truth: layer {layer} routed no token over the last {n} steps")
        worst_share = max(worst_share, max(load) / total)
        worst_dead = max(worst_dead, sum(v == 0 for v in load))
    ratio = worst_share * experts
    return LoadTruth(worst_share, ratio, worst_dead, ratio > limit or worst_dead > 0)


def score_efficiency(
    runs: Mapping[str, Mapping[str, int | None]],
    truth: Mapping[str, LoadTruth],
    steps: Mapping[str, int],
    alert_sources: Sequence[str],
) -> list[dict[str, Any]]:
    """One row per alert source for the MaxVio rules: ``runs[name][source]`` is the first MaxVio alarm
    step (None: never). A warned run whose load went wrong is a hit, an alarm on a run whose load
    stayed even is a false alarm."""
    rows = []
    for alert in alert_sources:
        wrong = [n for n in runs if truth[n].wrong]
        even = [n for n in runs if not truth[n].wrong]
        warned = [n for n in wrong if runs[n].get(alert) is not None]
        fracs = [runs[n][alert] / steps[n] for n in warned]  # type: ignore[operator]
        rows.append(
            {
                "guard": "expert load (MaxVio)",
                "alerts": alert,
                "runs": len(runs),
                "load_wrong": len(wrong),
                "warned": len(warned),
                "within_25pct": sum(f <= TARGET_FRAC for f in fracs),
                "missed": len(wrong) - len(warned),
                "median_lead_frac": _median(fracs),
                "load_even": len(even),
                "false_alarms": sum(runs[n].get(alert) is not None for n in even),
            }
        )
    return rows


EFFICIENCY_COLUMNS = (
    ("guard", 20),
    ("alerts", 10),
    ("runs", 4),
    ("load_wrong", 10),
    ("warned", 6),
    ("within_25pct", 5),
    ("missed", 6),
    ("median_lead_frac", 8),
    ("load_even", 9),
    ("false_alarms", 4),
)


def format_efficiency(rows: Sequence[dict[str, Any]]) -> str:
    """The MaxVio rows as a fixed-width text table (their own table: they guard expert load, not the loss)."""
    names = {"load_wrong": "load wrong", "load_even": "load even", **HEADERS}
    head = " | ".join(names.get(k, k).ljust(w) for k, w in EFFICIENCY_COLUMNS)
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(" | ".join(_cell(r[k]).ljust(w) for k, w in EFFICIENCY_COLUMNS))
    return "\n".join(lines)
