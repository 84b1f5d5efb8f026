"""``bench/early_warning/ew_arms.py``: the benchmark's arms across seed sets, split from consistent ones, on
synthetic outputs written as ``bench/early_warning/run.py --out`` writes them."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "early_warning"
sys.path.insert(0, str(BENCH))

from ew_arms import arm_of, arms, errors, first_level, kind, peak  # noqa: E402

STEPS = 40


def _run(excess: float, wrong: bool, svc: dict[str, int] | None = None, prom: dict[str, int] | None = None) -> dict:
    return {
        "spec": {"steps": STEPS},
        "truth": {"excess": excess, "wrong": wrong},
        "first_by_rule": {"service": svc or {}, "prometheus": prom or {}},
    }


def _output(seed: int, split_wrong: bool, split_warned: bool) -> dict[str, Any]:
    """One seed set: a consistent wrong arm (warned), a consistent healthy arm, a split arm."""
    warn = {"z_growth": 8} if split_warned else {}
    return {
        "runs": {
            f"attn-gpt-lr0.1-s{seed}": _run(0.4, True, {"z_growth": 8}, {"HyperWatchAttentionZGrowth": 8}),
            f"attn-gpt-safe-s{seed}": _run(0.01, False, {"max_vio_collapse": 4}),  # MaxVio guards load, not loss
            f"moe-lr0.1-s{seed}": _run(0.12 if split_wrong else 0.06, split_wrong, warn, {}),
        }
    }


def test_arm_of_strips_the_seed_and_refuses_other_names() -> None:
    assert arm_of("moe_collapse-trainer-lr0.1-nogates-s200") == "moe_collapse-trainer-lr0.1-nogates"
    with pytest.raises(ValueError, match="-s<seed>"):
        arm_of("no-seed-here")


def test_errors_fall_on_split_arms_apart_from_consistent_ones() -> None:
    by_arm = arms([_output(0, True, False), _output(100, False, True), _output(200, True, True)])
    assert [kind(by_arm[a]) for a in ("attn-gpt-lr0.1", "attn-gpt-safe", "moe-lr0.1")] == [
        "consistent",
        "consistent",
        "split",
    ]
    svc = errors(by_arm, "service")
    assert svc["consistent"] == {"missed": [], "false_alarms": []}  # the MaxVio alarm on the safe arm does not count
    assert svc["split"] == {"missed": ["moe-lr0.1-s0"], "false_alarms": ["moe-lr0.1-s100"]}
    prom = errors(by_arm, "prometheus")
    assert prom["split"]["missed"] == ["moe-lr0.1-s0", "moe-lr0.1-s200"] and prom["split"]["false_alarms"] == []


def test_another_margin_judges_the_seeds_again() -> None:
    outputs = [_output(0, True, False), _output(100, False, True)]
    loose = arms(outputs, margin=0.05)  # 0.12 and 0.06 both past 0.05: the split arm is consistent, wrong
    assert kind(loose["moe-lr0.1"]) == "consistent" and all(s["wrong"] for s in loose["moe-lr0.1"])
    assert errors(loose, "service")["consistent"]["missed"] == ["moe-lr0.1-s0"]
    strict = arms(outputs, margin=0.5)  # the LR-0.1 arm (0.4) is no longer wrong: its warnings are false alarms
    assert errors(strict, "prometheus")["consistent"]["false_alarms"] == ["attn-gpt-lr0.1-s0", "attn-gpt-lr0.1-s100"]
    nonfinite = {"runs": {"nan-gpt-lr3-s0": _run(math.nan, True)}}
    assert arms([nonfinite], margin=10.0)["nan-gpt-lr3"][0]["wrong"]  # non-finite stays wrong at any margin


def test_older_outputs_without_the_excess_give_it_from_the_final_losses() -> None:
    twin = {"truth": {"final": 2.0, "wrong": False, "twin": "a-safe-s0"}, "first_by_rule": {"service": {}}}
    run = {"truth": {"final": 2.25, "wrong": True, "twin": "a-safe-s0"}, "first_by_rule": {"service": {}}}
    run["first_by_rule"]["prometheus"] = twin["first_by_rule"]["prometheus"] = {}
    by_arm = arms([{"runs": {"a-safe-s0": twin, "a-lr-s0": run}}])
    assert by_arm["a-lr"][0]["excess"] == pytest.approx(0.25) and by_arm["a-safe"][0]["excess"] == 0.0
    with pytest.raises(ValueError, match="twin 'a-safe-s0' is not in the output"):
        arms([{"runs": {"a-lr-s0": run}}])


def test_level_and_peak_read_the_logged_points() -> None:
    steps = [0, 4, 8, 12, 16]
    assert first_level([1.0, 6.0, 2.0, 6.0, 7.0], steps, 5.0) == 16  # two in a row, not the lone 6 at step 4
    assert first_level([1.0, None, 9.0, 9.0, 1.0], steps, 5.0) == 12
    assert first_level([1.0, 2.0, 3.0, 4.0, 4.9], steps, 5.0) is None
    assert peak([1.0, 3.0, None, 9.0, 2.0], steps, 8) == 3.0 and peak([None, None], [0, 4], 8) is None
    assert math.isnan(peak([math.nan], [0], 4))  # type: ignore[arg-type]


def _series(path: Path, run: str, values: list[float]) -> None:
    logged = list(range(0, STEPS, 4))
    key = f'hyperwatch_run_attention_rms_max{{project="default",run="{run}"}}'
    path.write_text(json.dumps({"run": run, "steps": STEPS, "logged_steps": logged, "series": {key: values}}))


def test_the_command_prints_arms_peaks_and_a_candidate_rules_new_warnings(tmp_path: Path) -> None:
    files = []
    for seed, (wrong, warned) in {0: (True, False), 100: (False, False)}.items():
        out = _output(seed, wrong, warned)
        path = tmp_path / f"s{seed}.json"
        path.write_text(json.dumps(out))
        folder = tmp_path / f"s{seed}_series"
        folder.mkdir()
        for run in out["runs"]:
            high = run.startswith("moe") and seed == 0
            _series(folder / f"{run}.json", run, [1.0] * 4 + ([8.0] * 6 if high else [1.0] * 6))
        files.append(str(path))
    cmd = [sys.executable, str(BENCH / "ew_arms.py"), *files, "--peak", "attention_rms_max"]
    text = subprocess.run([*cmd, "--level", "attention_rms_max=5"], capture_output=True, text=True, check=True).stdout
    assert "split      moe-lr0.1" in text and "consistent attn-gpt-lr0.1" in text
    assert "service    on split      arms: missed 1 ['moe-lr0.1-s0']" in text
    # the 8s come after step 12, past the first quarter of 40 steps
    assert "peak attention_rms_max over the first 25%, moe-lr0.1: W +0.120: 1,   +0.060: 1" in text
    assert "would newly warn: hits 1 ['moe-lr0.1-s0 (+0.120) @20'], false alarms 0" in text
    bad = subprocess.run([*cmd, "--level", "attention_rms_max"], capture_output=True, text=True)
    assert bad.returncode == 2 and "is not METRIC=NUMBER" in bad.stderr
    missing = subprocess.run([*cmd[:2], str(tmp_path / "nope.json")], capture_output=True, text=True)
    assert missing.returncode == 2 and "is not a file" in missing.stderr
