"""``bench/stop_cost.py``: it times a stop and the batches after it, prints a row per tree, and its command
line refuses bad flags by name."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

from bench import stop_cost

REPO = Path(__file__).resolve().parents[2]


def test_measure_times_the_stop_and_the_batches_after_it(tmp_path: Path) -> None:
    got = stop_cost.measure(f"sqlite:///{tmp_path / 'stop.db'}", steps=20, after=3)
    assert set(got) == {"stop", "first", "next"} and all(v > 0 and math.isfinite(v) for v in got.values())


def test_the_command_line_names_a_bad_flag() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "stop_cost.py"), "--after", "0"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "--after: at least 1, got 0" in done.stderr
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "stop_cost.py"), "--against", "/nonexistent"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "--against: /nonexistent is not a checkout" in done.stderr


def test_one_round_prints_a_row_per_tree(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "stop_cost.py"),
            "--db",
            "sqlite",
            "--steps",
            "20",
            "--after",
            "2",
            "--pairs",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    assert "| sqlite | this tree |" in done.stdout
