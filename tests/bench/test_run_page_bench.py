"""The short version of ``bench/run_page.py`` (a 4-layer run of 40 steps): the benchmark seeds through the
API, opens the run page in Chromium cold and warm, and prints its requests and its table. No timing is
asserted (``make bench`` runs the whole of it against the targets)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.web.browser import missing_browser

REPO = Path(__file__).resolve().parents[2]


def test_the_run_page_benchmark_runs_and_prints_its_table() -> None:
    why = missing_browser()
    if why:
        pytest.skip(why)
    args = [sys.executable, str(REPO / "bench" / "run_page.py"), "--quick"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=REPO)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "seeded run 1: 1,920 points through the API" in out  # 40 steps x (4 layers x (7 + 4 heads) + 4)
    for label in ("cold open", "warm open 2", "first visit"):
        head = re.search(rf"^{label}: [0-9.]+ s, (\d+) figures, (\d+) data requests$", out, re.M)
        assert head is not None, out
        assert int(head.group(1)) == 18  # 7 per-layer lines and heatmaps, 3 run-level lines, the heads heatmap
    assert re.search(r"^  /ui/data/runs/1/indicator\?name=attention_z&x=step", out, re.M), out
    assert re.search(r"^  /ui/data/runs/1/heads ", out, re.M), out
    for row in ("cold", "warm"):
        assert re.search(rf"^  {row} +[0-9.]+ +[0-9.]+  (yes|NO) ", out, re.M), out
