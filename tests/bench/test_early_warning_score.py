"""The early-warning benchmark's scoring (``bench/early_warning/ew_score.py``) on synthetic loss curves: ground
truth from the loss alone, leads, misses and false alarms. The sweep itself is ``make bench``."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "early_warning"))

from ew_score import (
    RunResult,
    clear_false_alarms,
    departure_step,
    expert_load_truth,
    final_loss,
    first_loss_warning,
    format_efficiency,
    format_table,
    ground_truth,
    score,
    score_efficiency,
    totals,
)

STEPS = 100


def _curve(start: float = 4.0, end: float = 2.0, bend_at: int | None = None, rise: float = 0.0) -> list[float]:
    """A decaying loss; from ``bend_at`` on it rises by ``rise`` nats per step above the decay."""
    out = []
    for i in range(STEPS):
        v = end + (start - end) * math.exp(-i / 20)
        if bend_at is not None and i >= bend_at:
            v += rise * (i - bend_at)
        out.append(v)
    return out


def _run(name: str, losses: list[float], svc: int | None = None, prom: int | None = None, cell: str = "s") -> RunResult:
    return RunResult(name, cell, "gpt", STEPS, losses, {"service": svc, "prometheus": prom})


def test_final_loss_is_the_tail_mean_and_nan_when_any_loss_is_not_finite() -> None:
    assert final_loss([5.0] * 90 + [1.0] * 10) == pytest.approx(1.0)
    assert final_loss([5.0] * 80 + [1.0] * 20, tail=0.2) == pytest.approx(1.0)
    assert math.isnan(final_loss([2.0, math.inf, 2.0]))
    assert math.isnan(final_loss([2.0, math.nan]))
    with pytest.raises(ValueError, match="no losses"):
        final_loss([])


def test_departure_is_where_the_smoothed_gap_passes_005_nats() -> None:
    twin = _curve()
    bent = _curve(bend_at=40, rise=0.01)  # 0.01 nats more per step from step 40
    dep = departure_step(bent, twin, depart=0.05, smooth=1)
    assert dep == 46  # 0.06 > 0.05 at step 46 (0.05 at 45 is not above)
    smoothed = departure_step(bent, twin, depart=0.05, smooth=10)
    assert smoothed is not None and smoothed > dep  # the trailing mean lags the raw gap
    assert departure_step(twin, twin) is None
    assert departure_step([3.0, 3.0, math.nan], [3.0, 3.0, 3.0], smooth=1) == 2


def test_ground_truth_comes_from_the_cells_best_final_loss() -> None:
    runs = [
        _run("best", _curve()),
        _run("close", [v + 0.05 for v in _curve()]),  # within the margin: healthy
        _run("worse", [v + 0.3 for v in _curve()]),
        _run("nan", _curve()[:50] + [math.nan] * 50),
        _run("other-cell", [v + 1.0 for v in _curve()], cell="t"),  # the best of its own cell
    ]
    truth = ground_truth(runs, margin=0.1)
    assert {n for n, t in truth.items() if t.wrong} == {"worse", "nan"}
    assert truth["worse"].twin == "best" and truth["other-cell"].twin == "other-cell"
    assert truth["best"].departure is None
    assert truth["worse"].departure == 0  # 0.3 nats above from the first step
    assert truth["nan"].departure == 50
    assert truth["close"].excess == pytest.approx(0.05) and truth["best"].excess == 0.0
    assert math.isnan(truth["nan"].excess)


def test_clear_false_alarms_are_those_well_inside_the_margin() -> None:
    runs = [
        _run("best", _curve()),
        _run("near", [v + 0.02 for v in _curve()]),
        _run("edge", [v + 0.08 for v in _curve()]),  # healthy by the 0.1 margin, 0.08 worse
        _run("worse", [v + 0.3 for v in _curve()]),
    ]
    truth = ground_truth(runs, margin=0.1)
    assert clear_false_alarms(["near", "edge", "worse"], truth, 0.05) == ["near"]  # a wrong run is no false alarm


def test_a_cell_with_only_nonfinite_runs_is_refused() -> None:
    with pytest.raises(ValueError, match="no finite run"):
        ground_truth([_run("a", [math.nan] * STEPS)])


def test_score_counts_leads_misses_and_false_alarms_per_alert_source() -> None:
    healthy = _curve()
    runs = [
        _run("twin", healthy),
        _run("quiet-healthy", [v + 0.01 for v in healthy]),
        _run("noisy-healthy", [v + 0.02 for v in healthy], svc=30),  # a false alarm for the service only
        _run("early", _curve(bend_at=40, rise=0.02), svc=10, prom=60),  # service early, prometheus late
        _run("missed", _curve(bend_at=40, rise=0.02), svc=None, prom=20),
    ]
    truth = ground_truth(runs, margin=0.1)
    assert [n for n in truth if truth[n].wrong] == ["early", "missed"]
    dep = truth["early"].departure
    assert dep is not None and 40 < dep < 60
    rows = {r["alerts"]: r for r in score(runs, truth, ("service", "prometheus"))}
    svc, prom = rows["service"], rows["prometheus"]
    assert (svc["runs"], svc["wrong"], svc["warned"], svc["missed"]) == (5, 2, 1, 1)
    assert svc["within_25pct"] == 1 and svc["median_lead_frac"] == pytest.approx(0.10)
    assert svc["before_departure"] == 1 and svc["median_lead_steps"] == dep - 10
    assert (svc["healthy"], svc["false_alarms"]) == (3, 1)
    assert (prom["warned"], prom["missed"], prom["within_25pct"]) == (2, 0, 1)
    assert prom["worst_lead_frac"] == pytest.approx(0.60)
    assert prom["before_departure"] == 1  # step 20 is before the departure, step 60 after it
    assert prom["false_alarms"] == 0
    total = {r["alerts"]: r for r in totals([*rows.values()], ("service", "prometheus"))}
    assert total["service"]["false_alarms"] == 1 and total["prometheus"]["missed"] == 0
    table = format_table([*rows.values(), *total.values()])
    assert "service" in table and "prometheus" in table and "ALL" in table


def test_a_fault_injected_mid_run_is_scored_from_its_onset() -> None:
    """Nothing can warn of an LR bump before it comes: the warning that counts is the first from the
    onset, its lead is on the training left, and a warning before it is a false alarm on the healthy part."""
    healthy = _curve()
    bumped = _curve(bend_at=50, rise=0.02)

    def bump(name: str, first: int | None, after: int | None) -> RunResult:
        warn = {"service": first, "prometheus": first}
        return RunResult(name, "s", "gpt", STEPS, bumped, warn, 50, {"service": after, "prometheus": after})

    runs = [
        _run("twin", healthy),
        bump("at-bump", 55, 55),  # 5 of the 50 steps left: 0.1
        bump("early-then-at", 20, 60),  # a pre-fault false alarm, then the bump warned at 0.2
        bump("only-early", 10, None),  # warned while healthy, silent on the fault
        bump("late", 80, 80),  # 0.6 of the steps left
    ]
    truth = ground_truth(runs, margin=0.1)
    assert all(truth[n].wrong for n in ("at-bump", "early-then-at", "only-early", "late"))
    assert runs[1].warning("service") == (55, pytest.approx(0.1))
    assert runs[3].warning("service") == (None, None) and runs[3].pre_fault("service")
    assert not runs[1].pre_fault("service") and not runs[0].pre_fault("service")
    row = score(runs, truth, ("service",))[0]
    assert (row["warned"], row["missed"], row["within_25pct"], row["pre_fault"]) == (3, 1, 2, 2)
    assert row["worst_lead_frac"] == pytest.approx(0.6) and row["median_lead_frac"] == pytest.approx(0.2)
    assert (row["healthy"], row["false_alarms"]) == (1, 0)
    assert totals([row], ("service",))[0]["pre_fault"] == 2
    assert "preFA" in format_table([row])


def test_the_first_loss_warning_leaves_maxvio_out_and_can_start_at_an_onset() -> None:
    by_rule = {"max_vio_collapse": [4], "z_growth": [28, 40], "loss_spike": [104], "HyperWatchMaxVioCollapse": [2]}
    assert first_loss_warning(by_rule) == 28
    assert first_loss_warning(by_rule, since=100) == 104
    assert first_loss_warning(by_rule, since=105) is None
    assert first_loss_warning({"max_vio_collapse": [4]}) is None


def test_the_bump_onset_is_the_first_step_its_lr_applies() -> None:
    from ew_models import RunSpec

    spec = RunSpec("loss_spike", "gpt", "bump", 1e-3, 199, warmup=1, lr_bump=(0.5, 0.55, 30.0))
    assert spec.onset == 100  # 0.5 x 199 = 99.5: step 99 runs at the plain LR
    assert spec.lr_at(spec.onset) == pytest.approx(3e-2) and spec.lr_at(spec.onset - 1) == pytest.approx(1e-3)
    assert RunSpec("nan", "gpt", "plain", 1e-3, 200).onset is None


def test_the_twin_is_the_best_of_the_named_healthy_arm_and_departures_are_sustained() -> None:
    runs = [
        _run("safe-s0", [v + 0.02 for v in _curve()]),
        _run("safe-s1", _curve()),
        _run("better-lr", [v - 0.3 for v in _curve()]),  # better than the twin: not wrong, whatever the cell's best
        _run("blip", [v + (0.5 if 10 <= i < 15 else 0.0) for i, v in enumerate(_curve())]),  # back on track
    ]
    truth = ground_truth(runs, {"s/gpt": ["safe-s0", "safe-s1"]}, margin=0.1)
    assert truth["better-lr"].twin == "safe-s1" and not truth["better-lr"].wrong
    assert not truth["blip"].wrong and truth["blip"].departure is None  # a blip that recovers never departs
    assert not truth["safe-s0"].wrong and truth["safe-s0"].departure is None
    with pytest.raises(ValueError, match="no finite run"):
        ground_truth([_run("a", [math.nan] * STEPS), _run("b", _curve())], {"s/gpt": ["a"]})


def _routed(steps: int, per_expert: list[int], layers: int = 2, collapse_from: int | None = None) -> list:
    """Per step, per layer, tokens per expert: ``per_expert`` until ``collapse_from``, then all on expert 0."""
    total = sum(per_expert)
    out = []
    for i in range(steps):
        load = per_expert if collapse_from is None or i < collapse_from else [total] + [0] * (len(per_expert) - 1)
        out.append([list(load) for _ in range(layers)])
    return out


def test_expert_load_truth_reads_the_tail_of_the_routed_counts() -> None:
    even = expert_load_truth(_routed(100, [10, 10, 10, 10]))
    assert (even.busiest_share, even.busiest_vs_fair, even.dead_experts, even.wrong) == (0.25, 1.0, 0, False)
    # the last 10% of the steps are summed: a collapse over the whole tail starves three experts ...
    tail = expert_load_truth(_routed(100, [10, 10, 10, 10], collapse_from=90))
    assert (tail.dead_experts, tail.busiest_vs_fair, tail.wrong) == (3, 4.0, True)
    # ... one over half of it feeds them in the other half: the busiest got (5 x 10 + 5 x 40) / 400 of the tokens
    half = expert_load_truth(_routed(100, [10, 10, 10, 10], collapse_from=95))
    assert (half.dead_experts, half.busiest_share, half.wrong) == (0, 0.625, True)
    # skewed but every expert fed: wrong only past the limit (busiest vs its fair share)
    skew = _routed(10, [25, 5, 5, 5])
    assert expert_load_truth(skew, limit=2.0).wrong and not expert_load_truth(skew, limit=3.0).wrong
    assert expert_load_truth(skew).busiest_vs_fair == pytest.approx(2.5)
    # the worst layer decides
    one_bad = [[[10, 10, 10, 10], [40, 0, 0, 0]] for _ in range(10)]
    assert expert_load_truth(one_bad).dead_experts == 3
    with pytest.raises(ValueError, match="no routed counts"):
        expert_load_truth([])
    with pytest.raises(ValueError, match="layer 0 routed no token"):
        expert_load_truth([[[0, 0]]])


def test_efficiency_rows_judge_maxvio_alarms_by_the_load() -> None:
    truth = {
        "collapsed": expert_load_truth(_routed(100, [10, 10, 10, 10], collapse_from=20)),
        "collapsed-unwarned": expert_load_truth(_routed(100, [10, 10, 10, 10], collapse_from=50)),
        "even-alarmed": expert_load_truth(_routed(100, [10, 10, 10, 10])),
        "even": expert_load_truth(_routed(100, [10, 11, 9, 10])),
    }
    first: dict[str, dict[str, int | None]] = {
        "collapsed": {"service": 20, "prometheus": 40},
        "collapsed-unwarned": {"service": None, "prometheus": None},
        "even-alarmed": {"service": 8, "prometheus": None},
        "even": {"service": None, "prometheus": None},
    }
    rows = score_efficiency(first, truth, dict.fromkeys(first, 100), ("service", "prometheus"))
    svc, prom = rows
    assert (svc["load_wrong"], svc["warned"], svc["missed"], svc["within_25pct"]) == (2, 1, 1, 1)
    assert (svc["load_even"], svc["false_alarms"], svc["median_lead_frac"]) == (2, 1, 0.2)
    assert (prom["warned"], prom["within_25pct"], prom["false_alarms"], prom["median_lead_frac"]) == (1, 0, 0, 0.4)
    text = format_efficiency(rows)
    assert "load wrong" in text and "expert load (MaxVio)" in text and text.count("\n") == 3
