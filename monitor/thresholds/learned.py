"""A group's thresholds with where each came from: its override, learned from its finished healthy runs, or the default.

Precedence: a group's override (``PATCH /api/v1/groups/{id}`` ``thresholds``) > a learned value >
the default (:data:`defaults.DEFAULT_THRESHOLDS`). :func:`effective_thresholds` is what the detectors
(the ingest route), the exported Prometheus gauges and the pages use, so all of them agree;
:func:`provenance` says, per threshold, where its value came from (``GET
/api/v1/groups/{id}/thresholds``, the group page).

Learning (a group's ``learn_thresholds``; unset: :data:`defaults.LEARN_BY_DEFAULT`) raises the level
thresholds that say where a model family's healthy runs live: the growth floors (``*_growth_floor``)
and the logit ceiling ``attention_lse_max_limit``. It reads the group's *finished healthy runs*, healthy
by their loss, as the early-warning benchmark judges them, never by the indicator rules that learning
exists to correct: status ``finished``, not archived (an archived run is neither learned from nor
counted in the best final loss), a finite last loss, no incident of a rule that reads the loss or
its gradients (:data:`LOSS_RULES`), and a final loss (the mean of its last :data:`FINAL_POINTS` logged
losses) within ``learn_loss_margin`` nats of the best final loss among the group's finished runs. A
``z_growth`` or ``logit_ceiling`` incident does not disqualify a run whose loss ended among the best:
that is the false alarm learning is there to silence. Nothing is learned below ``learn_min_runs`` of
them. A learned value is ``learn_multiple`` x the highest peak of its metric over
those runs (max over layers and steps of the finite values; the ceiling also reads the per-head
``attention_lse_max.h<k>`` series), and it counts only where it is above the default: learning
never lowers a threshold.

What is read from the runs (their names, each threshold's peak and the run it came from) is stored on
the group row (``groups.learned``, migration 0010) by :func:`refresh`, which the API calls when a run
of the group becomes finished, stops being finished, leaves the group, is archived or unarchived
or is deleted, and when the group's ``learn_thresholds`` is sent. The setting, ``learn_multiple``
and ``learn_min_runs`` are applied when read: changing them needs no new read.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hyperwatch.hooks.schema import base_name, encode_value, head_of
from hyperwatch.monitor.core.errors import MonitorError
from hyperwatch.monitor.store.base import Store
from hyperwatch.monitor.store.entities import RunHealth
from hyperwatch.monitor.thresholds.defaults import DEFAULT_THRESHOLDS, GROWTH_METRICS, LEARN_BY_DEFAULT, thresholds_for

log = logging.getLogger(__name__)

LEARNED_FROM: dict[str, tuple[str, bool]] = {
    **{f"{m}_growth_floor": (m, False) for m in GROWTH_METRICS},
    "attention_lse_max_limit": ("attention_lse_max", True),
}
"""threshold -> (the metric whose peak it is learned from, whether the metric's per-head series count too)."""

FINISHED = "finished"
LOSS_RULES = frozenset({"nan_loss", "nonfinite_value", "loss_spike", "loss_shift", "grad_norm_spike"})
"""Rules that read the loss (or its gradients, or find a non-finite value): a warning or critical incident
of one makes a run unhealthy. The indicator rules (``z_growth``, ``z_spike``, ``logit_ceiling``) do not:
whether they were right is what the run's loss says; ``max_vio_collapse`` guards expert load."""
FINAL_POINTS = 16
END = 2**62
"""A step past any run's last: a run's newest values are those before it."""
"""Logged losses averaged into a run's final loss (one logged loss is too noisy to compare runs by)."""
SERIOUS = frozenset({"warning", "critical"})
MAX_LISTED = 20
"""Runs named in a detail (and unhealthy runs kept with their reason): the first ones, then a count."""


class GroupSettings(Protocol):
    """What a group's thresholds are made of (a store ``Group`` or ``GroupThresholds``)."""

    @property
    def thresholds(self) -> dict[str, Any]: ...

    @property
    def learn_thresholds(self) -> bool | None: ...

    @property
    def learned(self) -> dict[str, Any] | None: ...


@dataclass(frozen=True)
class ThresholdSource:
    key: str
    value: float
    source: str  # "default", "override" or "learned"
    default: float
    detail: str


def learning_on(group: GroupSettings | None) -> bool:
    """Whether the group learns: its own setting, else the service's default."""
    if group is None:
        return False
    return LEARN_BY_DEFAULT if group.learn_thresholds is None else bool(group.learn_thresholds)


@dataclass(frozen=True)
class _Read:
    """A group's stored ``learned``, checked (a hand-edited row reads as what it validly holds)."""

    runs: list[str]
    peaks: dict[str, tuple[float, str]]
    excluded: dict[str, str]
    excluded_count: int

    @staticmethod
    def of(learned: dict[str, Any] | None) -> _Read | None:
        if learned is None:
            return None
        listed = learned.get("runs")
        runs = [r for r in listed if isinstance(r, str)] if isinstance(listed, list) else []
        peaks: dict[str, tuple[float, str]] = {}
        raw = learned.get("peaks")
        for key, item in raw.items() if isinstance(raw, dict) else ():
            if key in LEARNED_FROM and isinstance(item, list) and len(item) == 2 and _number(item[0]) is not None:
                peaks[key] = (float(item[0]), str(item[1]))
        excluded = learned.get("excluded")
        excluded = {str(k): str(v) for k, v in excluded.items()} if isinstance(excluded, dict) else {}
        count = learned.get("excluded_count")
        return _Read(runs, peaks, excluded, count if isinstance(count, int) else len(excluded))


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:MAX_LISTED])
    return shown + (f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _setting(group: GroupSettings, key: str) -> float:
    own = _number(group.thresholds.get(key))
    return DEFAULT_THRESHOLDS[key] if own is None else own


def _candidates(group: GroupSettings | None) -> tuple[_Read | None, dict[str, float]]:
    """What the group learned (None: learning off or nothing read yet) and each learned key's
    ``learn_multiple`` x peak (empty below ``learn_min_runs`` healthy runs)."""
    if group is None or not learning_on(group):
        return None, {}
    read = _Read.of(group.learned)
    if read is None or len(read.runs) < _setting(group, "learn_min_runs"):
        return read, {}
    multiple = _setting(group, "learn_multiple")
    return read, {key: multiple * peak for key, (peak, _run) in read.peaks.items()}


def effective_thresholds(group: GroupSettings | None) -> dict[str, float]:
    """The thresholds in force for a group's runs (None: no group, the defaults): every default, raised
    where the group learned more, and the group's overrides over both."""
    if group is None:
        return thresholds_for(None)
    _read, candidates = _candidates(group)
    raised = {k: v for k, v in candidates.items() if v > DEFAULT_THRESHOLDS[k]}
    return thresholds_for({**raised, **group.thresholds})


def provenance(group: GroupSettings | None, group_id: int | None = None) -> list[ThresholdSource]:
    """Every default threshold with the value in force, its source and how it came about."""
    read, candidates = _candidates(group)
    on = learning_on(group)
    overrides = {} if group is None else group.thresholds
    out = []
    for key, default in DEFAULT_THRESHOLDS.items():
        learned_detail = _learned_detail(key, group, read, candidates) if on and key in LEARNED_FROM else ""
        own = _number(overrides.get(key))
        if own is not None:
            where = f"PATCH /api/v1/groups/{group_id}" if group_id is not None else "the group's thresholds"
            detail = f"set on the group ({where})" + (f"; without it: {learned_detail}" if learned_detail else "")
            out.append(ThresholdSource(key, own, "override", float(default), detail))
        elif key in candidates and candidates[key] > default:
            out.append(ThresholdSource(key, candidates[key], "learned", float(default), learned_detail))
        else:
            if not learned_detail and key in LEARNED_FROM and group is not None:
                learned_detail = (
                    "learning is off for this group (learn_thresholds: true learns it from finished healthy runs)"
                )
            out.append(ThresholdSource(key, float(default), "default", float(default), learned_detail))
    return out


def _learned_detail(key: str, group: GroupSettings | None, read: _Read | None, candidates: dict[str, float]) -> str:
    assert group is not None
    if read is None:
        return "learning on, nothing read yet: the runs are read when one of the group's runs finishes"
    metric = LEARNED_FROM[key][0] + (" and its heads" if LEARNED_FROM[key][1] else "")
    n = len(read.runs)
    needed = int(_setting(group, "learn_min_runs"))
    if n < needed:
        why = f"learning on: {_plural(n, 'finished healthy run')}" + (f" ({_listed(read.runs)})" if n else "")
        why += f", learn_min_runs is {needed}"
        if read.excluded:
            reasons = [f"{name} ({reason})" for name, reason in read.excluded.items()]
            more = read.excluded_count - len(reasons)
            why += f"; finished, not learned from: {', '.join(reasons)}" + (f" and {more} more" if more > 0 else "")
        return why
    if key not in read.peaks:
        return f"learning on: none of the {_plural(n, 'finished healthy run')} logged {metric}"
    peak, run = read.peaks[key]
    multiple = _setting(group, "learn_multiple")
    text = (
        f"{multiple:g} x the highest peak {peak:.4g} of {metric} (run {run}) over "
        f"{_plural(n, 'finished healthy run')}: {_listed(read.runs)}"
    )
    if candidates[key] <= DEFAULT_THRESHOLDS[key]:
        text += f" = {candidates[key]:.4g}, not above the default (learning only raises a threshold)"
    return text


def unhealthy(run: RunHealth) -> str | None:
    """Why a finished run is not learned from by itself (None: nothing against it; its final loss
    against the group's best is judged by :func:`behind_the_best`)."""
    why = []
    if run.last_loss is None:
        why.append("no loss logged")
    elif not math.isfinite(run.last_loss):
        why.append(f"last loss {encode_value(run.last_loss)}")
    why += [f"a {sev} {rule} incident" for rule, sev in run.incidents if sev in SERIOUS and rule in LOSS_RULES]
    return "; ".join(why) or None


def behind_the_best(finals: dict[int, float], margin: float) -> dict[int, str]:
    """The runs (id -> why) whose final loss is more than ``margin`` nats above the best of ``finals``
    (the final losses of the group's finished runs that nothing else rules out)."""
    best = min((v for v in finals.values() if math.isfinite(v)), default=None)
    if best is None:
        return {}
    return {
        rid: f"final loss {v:.4g}, {v - best:.3g} nats above the group's best {best:.4g} (learn_loss_margin {margin:g})"
        for rid, v in finals.items()
        if not (math.isfinite(v) and v <= best + margin)
    }


def learn(
    runs: Iterable[RunHealth], peaks: dict[tuple[int, str], float], behind: dict[int, str] | None = None
) -> dict[str, Any]:
    """What a group learns from its runs (the stored ``learned``): its finished healthy runs, each
    learned threshold's highest peak with its run, and the finished runs left out with why (``behind``:
    those whose final loss is too far above the group's best)."""
    healthy: dict[int, str] = {}
    excluded: dict[str, str] = {}
    for run in runs:
        if run.status != FINISHED:
            continue
        why = "archived" if run.archived else unhealthy(run) or (behind or {}).get(run.id)
        if why is None:
            healthy[run.id] = run.name
        else:
            excluded[run.name] = why
    best: dict[str, list[Any]] = {}
    for (run_id, name), value in sorted(peaks.items()):
        if run_id not in healthy or not math.isfinite(value):
            continue
        for key, (metric, heads) in LEARNED_FROM.items():
            counts = name == metric or (heads and head_of(name) is not None and base_name(name) == metric)
            if counts and (key not in best or value > best[key][0]):
                best[key] = [value, healthy[run_id]]
    kept = dict(list(excluded.items())[:MAX_LISTED])
    return {"runs": list(healthy.values()), "peaks": best, "excluded": kept, "excluded_count": len(excluded)}


def _mean(values: Sequence[float]) -> float:
    """The mean of a run's last logged losses (NaN without any, or with a non-finite one)."""
    return sum(values) / len(values) if values else math.nan


def peak_metrics() -> list[str]:
    """The metric names (bases) whose peaks are read."""
    return sorted({metric for metric, _heads in LEARNED_FROM.values()})


def refresh(store: Store, group_id: int) -> dict[str, Any]:
    """Read the group's runs again and store what it learns from them (whether or not it learns now:
    turning learning on then needs no read). Returns what was stored."""
    read_at = time.time()
    runs = store.group_run_health(group_id)
    candidates = [r.id for r in runs if r.status == FINISHED and not r.archived and unhealthy(r) is None]
    finals = {rid: _mean(store.trailing_values(rid, "loss", None, END, FINAL_POINTS)) for rid in candidates}
    margin = _setting(store.get_group(group_id), "learn_loss_margin")
    behind = behind_the_best(finals, margin)
    healthy = [rid for rid in candidates if rid not in behind]
    learned = learn(runs, store.series_peaks(healthy, peak_metrics()), behind)
    store.save_learned(group_id, learned, read_at)
    return learned


def refresh_quietly(store: Store, group_ids: Iterable[int | None]) -> None:
    """:func:`refresh` each group (after a reply: a failure is logged, the next finished run reads again)."""
    for gid in dict.fromkeys(g for g in group_ids if g is not None):
        try:
            refresh(store, gid)
        except MonitorError as exc:
            log.warning("learned thresholds of group id %s not refreshed: %s", gid, exc)
