"""``ew_truth.py`` and ``ew_lofo.py`` (``bench/early_warning/``) on synthetic recordings: the families' ground truth
(the 0.15 / 0.05 cut-offs, the median over seeds, the lowest reference arm), what counts as a miss, a
false alarm or a pre-fault false alarm, a left-out family never used to choose its thresholds, and the
CLI (its table, its exit 2 on bad input)."""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench" / "early_warning"))

import ew_lofo  # noqa: E402
from ew_learn import family_peaks, learned_over, learning_scorer, run_peaks  # noqa: E402
from ew_lofo import Evaluator, load_run, lofo, prom_rows, search, service_scorer  # noqa: E402
from ew_replay import to_columns  # noqa: E402
from ew_truth import baselines, ground_truth, run_row, summarize, verdict  # noqa: E402

STEPS = 100
LOGGED = list(range(0, STEPS, 4))


@dataclass
class TR:
    name: str
    family: str
    arm: str
    seed: int
    losses: list[float]
    onset: int | None = None
    reference: bool = False
    steps: int = STEPS
    fault: str | None = None


def flat(end: float, n: int = STEPS) -> list[float]:
    return [end] * n


def test_verdict_cut_offs() -> None:
    assert [verdict(x) for x in (0.2, 0.15, 0.1, 0.06, 0.05, 0.0, -0.3, math.nan, math.inf)] == [
        "wrong", "wrong", "grey", "grey", "healthy", "healthy", "healthy", "wrong", "wrong"]  # fmt: skip


def test_the_baseline_is_the_lowest_reference_arm_median_over_seeds() -> None:
    runs = [
        TR("b0", "f", "best", 0, flat(2.0), reference=True),
        TR("b1", "f", "best", 1, flat(2.02), reference=True),
        TR("b2", "f", "best", 2, [*flat(2.0, 50), *flat(math.nan, 50)], reference=True),  # diverged: ranks last
        TR("h0", "f", "lr_x0.5", 0, flat(1.9), reference=True),
        TR("h1", "f", "lr_x0.5", 1, flat(1.95), reference=True),
        TR("h2", "f", "lr_x0.5", 2, flat(3.0), reference=True),  # an outlier the median ignores
        TR("x", "f", "lr_x16", 0, flat(1.0)),  # not a reference arm: never the baseline
        TR("wrong", "f", "lr_x4", 0, flat(2.15), reference=True),
        TR("grey", "f", "bad_data", 0, flat(2.05)),
        TR("ok", "f", "no_warmup", 0, flat(1.99)),
        TR("nan", "f", "lr_x64", 0, [*flat(1.95, 60), math.inf, *flat(1.95, 39)]),
    ]
    b = baselines(runs)["f"]
    assert b.arm == "lr_x0.5" and b.final == pytest.approx(1.95) and b.arm_medians["best"] == pytest.approx(2.02)
    t = ground_truth(runs)
    assert {n: t[n].verdict for n in ("wrong", "grey", "ok", "nan", "x", "b1", "h2")} == {
        "wrong": "wrong", "grey": "grey", "ok": "healthy", "nan": "wrong", "x": "healthy", "b1": "grey",
        "h2": "wrong"}  # fmt: skip
    assert t["wrong"].excess == pytest.approx(0.2) and math.isnan(t["nan"].final)
    assert t["nan"].departure == 60 and t["wrong"].departure == 0 and t["h1"].departure is None
    with pytest.raises(ValueError, match="family g: no reference arm"):
        ground_truth([TR("y", "g", "lr_x16", 0, flat(2.0))])


def test_departure_is_against_the_baseline_arms_median_curve() -> None:
    base = [2.0 + 2.0 * math.exp(-s / 20) for s in range(STEPS)]
    runs = [TR(f"b{i}", "f", "best", i, [v + d for v in base], reference=True) for i, d in enumerate((0, 0.01, 0.5))]
    runs.append(TR("bent", "f", "lr_x16", 0, [v + (0.02 * (s - 50) if s >= 50 else 0.0) for s, v in enumerate(base)]))
    t = ground_truth(runs)["bent"]
    # 0.01 above the median curve before 50, then 0.02 more per step: the 10-step mean passes 0.05 at 58
    assert t.verdict == "wrong" and t.departure == 58


def _rows(t: dict[str, Any], runs: list[TR], warns: dict[str, tuple[int | None, int | None]]) -> dict[str, Any]:
    return summarize([run_row(r, t[r.name], warns[r.name]) for r in runs])


def test_misses_false_alarms_grey_and_pre_fault() -> None:
    runs = [
        TR("b0", "f", "best", 0, flat(2.0), reference=True),
        TR("b1", "f", "best", 1, flat(2.1), reference=True),  # grey: the prefix of seed 1 is not healthy
        TR("hit", "f", "lr_x16", 0, flat(3.0)),
        TR("late", "f", "lr_x64", 0, flat(3.0)),
        TR("miss", "f", "no_warmup", 0, flat(3.0)),
        TR("grey", "f", "lr_x4", 0, flat(2.1)),
        TR("bump", "f", "lr_bump", 0, flat(2.5), onset=50, fault="lr_bump"),
        TR("bump1", "f", "lr_bump", 1, flat(2.5), onset=50, fault="lr_bump"),
    ]
    t = ground_truth(runs)
    warns = {"b0": (30, None), "b1": (None, None), "hit": (10, None), "late": (40, None), "miss": (None, None),
             "grey": (5, None), "bump": (20, 60), "bump1": (20, 90)}  # fmt: skip
    s = _rows(t, runs, warns)
    keys = ("wrong", "warned", "within_25pct", "late", "missed", "healthy", "false_alarms")
    assert [s[k] for k in keys] == [5, 4, 2, 2, 1, 1, 1]
    assert (s["pre_fault"], s["grey"]) == (1, 2)  # bump warned at 20 < onset 50 on a healthy prefix; bump1's is grey
    bump = run_row(runs[6], t["bump"], warns["bump"])
    assert bump["lead_frac"] == pytest.approx(0.2) and bump["warning"] == 60 and bump["pre_fault"]
    assert s["mean_lead_frac"] == pytest.approx((0.1 + 0.4 + 0.2 + 0.8) / 4)


# --- recordings on disk: three families whose flat max attention LSE only the ceiling can judge ---

FAMILIES = {  # family -> [(arm, seed, max LSE, final loss)]
    "hot": [("best", 0, 60.0, 2.0), ("best", 1, 60.0, 2.0), ("lr_x0.5", 0, 60.0, 2.01)],
    "cold": [("best", 0, 10.0, 2.0), ("best", 1, 10.0, 2.0), ("lr_x16", 0, 40.0, 2.3)],
    "mid": [("best", 0, 10.0, 2.0), ("lr_x0.5", 0, 10.0, 2.0), ("lr_x16", 0, 100.0, 2.4)],
}


def run_doc(family: str, arm: str, seed: int, lse: float, loss: float) -> dict[str, Any]:
    name = f"{family}-{arm}-s{seed}"
    batches = [
        [["loss", None, s, loss] for s in range(at, at + 4)] + [["attention_lse_max", 0, at, lse]] for at in LOGGED
    ]
    labels = f'{{project="default",run="{name}"}}'
    scrapes = {
        f"hyperwatch_run_attention_lse_max_max{labels}": [lse] * len(LOGGED),
        f"hyperwatch_run_logit_ceiling{labels}": [50.0] * len(LOGGED),
    }
    alerts = [{"rule": "logit_ceiling", "severity": "critical", "step": 0, "name": "attention_lse_max", "layer": 0}]
    return {
        "name": name, "family": family, "arm": arm, "seed": seed, "steps": STEPS, "onset": None,
        "reference": arm in ("best", "lr_x0.5"), "fault": None if arm in ("best", "lr_x0.5") else arm, "spec": {},
        "losses": [loss] * STEPS, "logged_steps": LOGGED, "batches": batches, "scrapes": scrapes,
        "service_alerts": alerts if lse > 50 else [], "seconds": 0.1,
    }  # fmt: skip


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    (tmp_path / "runs").mkdir()
    for family, arms in FAMILIES.items():
        for arm, seed, lse, loss in arms:
            doc = run_doc(family, arm, seed, lse, loss)
            (tmp_path / "runs" / f"{doc['name']}.json").write_text(json.dumps(doc))
    return tmp_path


GRID = {"attention_lse_max_limit": [30.0, 50.0, 80.0, 120.0]}
WEIGHTS = ew_lofo.OBJECTIVE


def test_lofo_never_chooses_with_the_left_out_family(recorded: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = ew_lofo.load_dir(recorded)
    truth = ground_truth(runs)
    score = service_scorer(Evaluator(runs), truth)
    calls: list[tuple[frozenset[str], dict[str, float]]] = []

    def logged(rs: Any, over: dict[str, float]) -> list[dict[str, Any]]:
        calls.append((frozenset(r.family for r in rs), dict(over)))
        return score(rs, over)

    def searched(rs: Any, *args: Any) -> Any:
        calls.append((frozenset(r.family for r in rs), {"search": 1.0}))  # marks the start of a fold's search
        return real_search(rs, *args)

    real_search = ew_lofo.search
    monkeypatch.setattr(ew_lofo, "search", searched)
    folds = lofo(runs, logged, GRID, WEIGHTS)
    monkeypatch.undo()
    # with "hot" (healthy runs at LSE 60) the ceiling must stay above 60: 80 (cold's LSE-40 run missed);
    # without it, 30 warns every run that went wrong and no healthy one
    assert search(runs, score, GRID, WEIGHTS)[0] == {"attention_lse_max_limit": 80.0}
    assert folds["hot"]["thresholds"] == {"attention_lse_max_limit": 30.0}
    assert folds["hot"]["thresholds"] == search([r for r in runs if r.family != "hot"], score, GRID, WEIGHTS)[0]
    starts = [i for i, (_f, over) in enumerate(calls) if over == {"search": 1.0}] + [len(calls)]
    assert len(starts) == 4
    for (family, fold), a, b in zip(folds.items(), starts, starts[1:]):
        assert calls[a][0] == {"hot", "cold", "mid"} - {family}  # the search's runs: every other family's
        chose, held = calls[a + 1 : b - 1], calls[b - 1]  # then the left-out family scored with the choice
        assert chose and all(family not in fams for fams, _over in chose), family
        assert held == (frozenset({family}), fold["thresholds"])
    assert {f: (fold["row"]["false_alarms"], fold["row"]["missed"]) for f, fold in folds.items()} == {
        "hot": (3, 0), "cold": (0, 1), "mid": (0, 0)}  # fmt: skip


def _counted(missed: int, lead: float) -> list[dict[str, Any]]:
    """Rows that summarize to ``missed`` missed runs and one warned run at ``lead`` of its training."""
    warned = {"verdict": "wrong", "warned": True, "lead_frac": lead, "late": False, "missed": False,
              "false_alarm": False, "pre_fault": False, "lead_steps": None}  # fmt: skip
    return [warned] + [{**warned, "warned": False, "lead_frac": None, "missed": True}] * missed


def test_a_threshold_moves_only_for_a_count_and_then_as_little_as_it_can() -> None:
    counts = {30.0: (1, 0.05), 50.0: (2, 0.3), 80.0: (1, 0.2), 120.0: (1, 0.1), 200.0: (3, 0.4)}
    grid = {"attention_lse_max_limit": sorted(counts)}

    def score(_runs: Any, over: dict[str, float]) -> list[dict[str, Any]]:
        return _counted(*counts[over.get("attention_lse_max_limit", 50.0)])

    # 30, 80 and 120 all miss one run fewer than 50; 30 warns earliest, but 80 is the nearest to 50
    chosen, row, _tried = search([object()], score, grid, WEIGHTS)  # type: ignore[list-item]
    assert chosen == {"attention_lse_max_limit": 80.0} and row["missed"] == 1
    counts.update({30.0: (2, 0.01), 80.0: (2, 0.01), 120.0: (2, 0.01)})  # earlier warnings, no fewer misses
    assert search([object()], score, grid, WEIGHTS)[0] == {}  # type: ignore[list-item]


def test_info_alerts_are_no_false_alarm(recorded: Path) -> None:
    run = load_run(recorded / "runs" / "cold-best-s0.json")
    run.batches = [to_columns([["attention_lse_max", 0, s, 3.0 * 1.1 ** (s / 4)]]) for s in LOGGED]  # 3 -> 29.5
    truth = ground_truth(ew_lofo.load_dir(recorded))
    score = service_scorer(Evaluator([run]), truth)
    info = {"growth_info_fraction": 0.1, "attention_lse_max_growth_floor": 100, "attention_lse_max_limit": 1e6}
    info["growth_factor"] = 4
    assert score([run], {"attention_lse_max_limit": 1e6, "growth_factor": 4})[0]["false_alarm"]  # the growth warns
    row = score([run], info)[0]
    assert (row["first_warning"], row["false_alarm"]) == (None, False)
    assert Evaluator([run]).trace(run).alerts(info)[0][:2] == ("z_growth", "info")


def test_the_cli_prints_the_tables(recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps(GRID))
    out = tmp_path / "out.json"
    assert ew_lofo.main([str(recorded), "--no-prom", "--no-learn", "--grid", str(grid), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "reproduces the service's stored alerts on 9/9 runs" in text
    for label in ("hot (left out)", "cold (left out)", "ALL (left out)", "in-sample", "defaults"):
        assert label in text
    assert "hot          attention_lse_max_limit 30" in text
    doc = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"{c}: not strict JSON"))
    assert doc["summaries"]["service"]["lofo_rows"]["false_alarms"] == 3
    assert len(doc["sources"]["service"]["lofo_rows"]) == 9
    assert ew_lofo.main([str(recorded), "--no-prom", "--thresholds", '{"attention_lse_max_limit": 80}']) == 0
    assert "thresholds attention_lse_max_limit 80 (no search)" in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is missing: bash scripts/system-deps.sh")
def test_the_prometheus_source_reads_the_rewritten_ceiling(recorded: Path, tmp_path: Path) -> None:
    runs = ew_lofo.load_dir(recorded)
    truth = ground_truth(runs)
    keys = ["attention_lse_max_limit", "mlp_rms_growth_floor"]
    for limit, fa, missed in ((30.0, 3, 0), (50.0, 3, 1), (80.0, 0, 1), (120.0, 0, 2)):
        rows, missing = prom_rows(runs, {r.name: {keys[0]: limit} for r in runs}, keys, truth, tmp_path / str(limit))
        s = summarize(rows)
        assert (s["false_alarms"], s["missed"], missing) == (fa, missed, ["mlp_rms_growth_floor"]), limit


def _fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert ew_lofo.main(list(argv)) == 2
    return capsys.readouterr().err


def test_bad_input_exits_2_naming_the_fix(recorded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "no runs/ folder" in _fails(capsys, str(tmp_path / "nope"))
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"logit_limit": [1, 2]}))
    assert "unknown threshold 'logit_limit'" in _fails(capsys, str(recorded), "--grid", str(grid))
    assert "unknown threshold 'x'" in _fails(capsys, str(recorded), "--thresholds", '{"x": 1}')
    assert "not JSON" in _fails(capsys, str(recorded), "--thresholds", "{")
    assert "--pace: pace 0.3: a whole number" in _fails(capsys, str(recorded), "--pace", "0.3")
    assert "no such file" in _fails(capsys, str(recorded), "--rules", str(tmp_path / "none.yml"))
    bad = recorded / "runs" / "mid-best-s0.json"
    doc = json.loads(bad.read_text())
    del doc["batches"]
    bad.write_text(json.dumps(doc))
    err = _fails(capsys, str(recorded), "--no-prom")
    assert "mid-best-s0.json: missing field(s) batches" in err and "bench/early_warning/ew_record.py" in err


# --- learning (bench/early_warning/ew_learn.py): each family a group that learns from its healthy best runs ---


def test_run_peaks_read_the_layers_and_heads_finite_values() -> None:
    batches = [
        to_columns(
            [["attention_lse_max", 0, 0, 5.0], ["attention_lse_max.h1", 1, 0, 9.0], ["attention_z", 0, 0, 40.0]]
        ),
        to_columns([["attention_lse_max.h0", 0, 4, "Infinity"], ["attention_z", 1, 4, "NaN"], ["loss", None, 4, 9.0]]),
    ]
    peaks = run_peaks(batches)
    assert peaks["attention_lse_max_limit"] == 9.0  # the head counts for the ceiling, the Inf does not
    assert peaks["attention_lse_max_growth_floor"] == 5.0  # the floor reads the layer's own series only
    assert peaks["attention_z_growth_floor"] == 40.0 and "mlp_rms_growth_floor" not in peaks
    assert learned_over({"attention_lse_max_limit": 80.0}, peaks, 3.0) == {
        "attention_lse_max_limit": 80.0,  # 3 x 9 = 27: below the 80 in force, kept
        "attention_lse_max_growth_floor": 15.0,  # 3 x 5 above the default 10
        "attention_z_growth_floor": 120.0,
    }
    raised = learned_over({}, {"attention_lse_max_limit": 20.0, "attention_z_growth_floor": 10.0}, 3.0)
    assert raised == {"attention_lse_max_limit": 60.0}  # 3 x 10 = 30 is below the default floor (50): kept


def test_learning_silences_a_hot_familys_later_runs_not_its_first(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = ew_lofo.load_dir(recorded)
    truth = ground_truth(runs)
    peaks = family_peaks(runs, truth, {})
    # hot's two healthy best runs peak at 60: it learns; mid has one best run (learn_min_runs 2): nothing
    assert peaks["hot"]["attention_lse_max_limit"] == 60.0 and peaks["mid"] == {}
    assert family_peaks(runs, truth, {"hot-best-s0": True})["hot"] == {}  # a loss rule warned one of them
    score = learning_scorer(Evaluator(runs), truth, peaks, 3.0)
    rows = {r["name"]: r for r in score(runs, {})}
    assert rows["hot-best-s0"]["false_alarm"] and rows["hot-best-s1"]["false_alarm"]  # the group's first runs
    assert not rows["hot-lr_x0.5-s0"]["false_alarm"]  # under the learned ceiling of 180
    assert rows["mid-lr_x16-s0"]["warned"]  # nothing learned: the default ceiling of 50 warns its LSE of 100
    argv = [str(recorded), "--no-prom", "--thresholds", '{"attention_lse_max_limit": 50}']
    assert ew_lofo.main([*argv, "--learn", "3"]) == 0
    out = capsys.readouterr().out
    assert "learning: x3" in out and re.search(r"; hot [^;]*attention_lse_max_limit 180", out)
    assert ew_lofo.main([*argv, "--base", '{"attention_lse_max_limit": 80, "growth_factor": 5}']) == 0
    assert "thresholds growth_factor 5 (no search)" in capsys.readouterr().out  # the given 50 wins over the base 80
    assert "a multiple above 0" in _fails(capsys, str(recorded), "--learn", "0")
    assert "not JSON" in _fails(capsys, str(recorded), "--base", "{")


def test_explain_names_the_rule_of_each_false_alarm_and_miss(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import ew_explain

    assert ew_explain.main([str(recorded), "--no-learn", "--thresholds", '{"attention_lse_max_limit": 50}']) == 0
    text = capsys.readouterr().out
    lines = {line.split()[0]: line for line in text.splitlines() if line and not line.startswith(" ")}
    assert "FALSE ALARM" in lines["hot-best-s0"] and "FALSE ALARM" in lines["hot-lr_x0.5-s0"]
    assert "MISSED" in lines["cold-lr_x16-s0"] and "MISSED" not in lines["mid-lr_x16-s0"]
    assert re.search(r"\n +0 logit_ceiling +critical +attention_lse_max\[0\] = 60\n", text)
    assert text.rstrip().endswith("false alarms 3, pre-fault 0, missed 1")
    # learning: hot's lr_x0.5 run is judged at 2 x its best runs' peak (120), the best runs as first runs
    assert ew_explain.main([str(recorded), "--thresholds", '{"attention_lse_max_limit": 50}']) == 0
    assert capsys.readouterr().out.rstrip().endswith("false alarms 2, pre-fault 0, missed 1")
