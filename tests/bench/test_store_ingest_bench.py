"""``bench/store_ingest.py`` on a small load: each kind of batch timed, two trees side by side."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench import store_ingest

REPO = Path(__file__).resolve().parents[2]


def test_each_kind_of_batch_is_timed() -> None:
    got = store_ingest.measure("sqlite", 260)  # 16 seals, one pack
    assert set(got) == {"mean", "plain", "seal", "pack"}
    assert all(got[k] > 0 and math.isfinite(got[k]) for k in got)
    assert got["pack"] > got["plain"]  # a pack rewrites 512 series' open ranges: real work timed apart


def test_two_trees_alternate_and_the_ratio_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    # this checkout against itself: both rows, and their ratio
    assert store_ingest.main(["--db", "sqlite", "--batches", "40", "--against", str(REPO), "--pairs", "2"]) == 0
    out = capsys.readouterr().out
    assert "| sqlite | this tree |" in out and "| sqlite | against |" in out
    assert "| sqlite | this tree / against |" in out


def test_bad_flags_are_refused_naming_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        store_ingest.main(["--batches", "0"])
    with pytest.raises(SystemExit):
        store_ingest.main(["--against", str(tmp_path)])
    assert "--against" in capsys.readouterr().err
