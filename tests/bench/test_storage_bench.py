"""bench/storage.py --quick runs end to end on both databases and reads every point back (issue 36)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _storage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / "storage.py"), *args], capture_output=True, text=True, timeout=600
    )


def test_storage_bench_quick_is_lossless() -> None:
    done = _storage("--quick", "--repeats", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    table = [line for line in done.stdout.splitlines() if line.startswith(("| workload", "| fixture", "| hooks-long"))]
    assert len(table) == 6 and all(line.endswith("| True |") for line in table), done.stdout
    # ingest: one pair (--quick) per database, its ratio the HTTP rate over the floor's, and their median
    speed = [
        line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith(("| sqlite", "| postgresql"))
    ]
    speed = [[c.strip() for c in row] for row in speed if len(row) == 6]
    assert [row[0] for row in speed] == ["sqlite", "postgresql"], done.stdout
    for _db, ours, raw, ratio, median, _target in speed:
        got = float(ours.replace(",", "")) / float(raw.replace(",", ""))
        assert ratio == median and abs(float(ratio.removesuffix("x")) - got) <= 0.006, done.stdout  # printed rounded


def test_storage_bench_names_a_bad_flag() -> None:
    done = _storage("--quick", "--pairs", "0")
    assert done.returncode == 2 and "--pairs: at least 1, got 0" in done.stderr, done.stderr


def test_storage_parts_quick_names_where_the_bytes_go() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "storage_parts.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split("|")[1].strip() for line in done.stdout.splitlines() if line.startswith("| ")}
    assert {"metric_chunks", "metric_chunks index pk_metric_chunks", "<free pages>", "**all**"} <= rows, done.stdout


def test_the_long_hooks_run_sends_every_series_at_every_step() -> None:
    sys.path.insert(0, str(REPO))
    from bench.storage_hooks import long_run

    series = long_run(12, every=2)
    assert {s["labels"]["run"] for s in series} == {"neox-best-s0-long"}
    assert all(s["steps"].tolist() == list(range(0, 12, 2)) for s in series)  # logged steps 0, 2, .., 10
    names = {s["metric"] for s in series}
    assert {"hw_loss", "hw_attention_z", "hw_attention_lse_max_h0", "hw_mlp_rms"} <= names
    for bad in ({"steps": 1}, {"steps": 10, "every": 0}):
        try:
            long_run(**bad)
        except ValueError as exc:
            assert "at least" in str(exc)
        else:
            raise AssertionError(f"{bad} was accepted")
