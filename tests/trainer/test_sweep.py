"""`hyperwatch sweep`: grid expansion, a crashing run marked failed, re-runs skip finished runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hyperwatch.cli import main
from hyperwatch.trainer.config import ConfigError
from hyperwatch.trainer.sweep import command, load_sweep, threads_per_run

SWEEP = """
[sweep]
name = "t"
out_dir = "{out}"

[base]
preset = "tiny"

[base.optim]
arm = "hyperp_moe"

[base.model]
seq_len = 32

[base.train]
tokens = 1024
micro_batch = 2
eval_every = 2
eval_batches = 2

[base.data]
max_bytes = 200000
cache_dir = "{cache}"

[base.log]
every = 1

[grid]
depth = [2]
batch_tokens = [512, 500]   # 500 is not a multiple of 2 x 32: that run fails at start-up
"""


def write_sweep(tmp_path: Path, cache: Path, text: str = SWEEP) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(text.format(out=tmp_path / "out", cache=cache))
    return path


def test_grid_expands_to_named_runs(tmp_path: Path, corpus_cache: Path) -> None:
    text = SWEEP.replace("depth = [2]", "depth = [2, 4]\nlr = [0.01, 0.02]")
    sweep = load_sweep(write_sweep(tmp_path, corpus_cache, text))
    names = [r.name for r in sweep.runs]
    assert len(names) == 8 and len(set(names)) == 8
    assert "t-d4-lr0.02-b512" in names  # grid order: depth, lr, batch_tokens
    cmd = command(sweep, sweep.runs[0])
    assert cmd[1:4] == ["-m", "hyperwatch", "train"]
    assert "--log.group" in cmd and cmd[cmd.index("--log.group") + 1] == "t"
    assert cmd[cmd.index("--optim.arm") + 1] == "hyperp_moe"
    assert "--train.threads" not in cmd  # one run at a time: PyTorch's own default
    sweep.workers = 2  # runs side by side share the cores
    cmd = command(sweep, sweep.runs[0])
    assert cmd[cmd.index("--train.threads") + 1] == str(threads_per_run(2))
    sweep.base["train"]["threads"] = 3  # the sweep's own setting wins
    cmd = command(sweep, sweep.runs[0])
    assert cmd[cmd.index("--train.threads") + 1] == "3"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("depth = [2]", "depth = []"), "non-empty list"),
        (("depth = [2]", "depht = [2]"), "section.key"),
        (("depth = [2]", "depth = [3]"), "n_kv_heads"),  # every run's config is validated up front
        (("[sweep]", "[sweep]\nworkers = 0"), "workers"),
        (("[grid]", "[other]\n[grid]"), "unknown tables"),
    ],
)
def test_bad_sweep_files_name_the_problem(
    tmp_path: Path, corpus_cache: Path, edit: tuple[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_sweep(write_sweep(tmp_path, corpus_cache, SWEEP.replace(*edit)))


def test_crash_is_marked_failed_and_rerun_skips_finished(
    tmp_path: Path, corpus_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_sweep(tmp_path, corpus_cache)
    assert main(["sweep", str(path)]) == 1  # one run failed, the sweep went on
    out = capsys.readouterr().out
    assert "finished  t-d2-b512" in out and "failed  t-d2-b500" in out
    state = {r["name"]: r for r in json.loads((tmp_path / "out" / "t" / "sweep.json").read_text())}
    assert state["t-d2-b512"]["status"] == "finished" and isinstance(state["t-d2-b512"]["val_loss"], float)
    assert state["t-d2-b500"]["status"] == "failed" and state["t-d2-b500"]["returncode"] == 2
    assert "multiple of micro_batch" in (tmp_path / "out" / "t" / "t-d2-b500" / "train.log").read_text()
    # The finished run streamed its indicators (JSONL sink when no server is given).
    assert list((tmp_path / "out" / "t" / "indicators").rglob("*.jsonl"))
    assert main(["sweep", str(path)]) == 1
    assert "skipped  t-d2-b512" in capsys.readouterr().out


def test_dry_run_prints_commands(tmp_path: Path, corpus_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sweep", str(write_sweep(tmp_path, corpus_cache)), "--dry-run", "--server", "http://127.0.0.1:1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all("--log.sink http://127.0.0.1:1" in line for line in lines)
    assert main(["sweep", str(tmp_path / "missing.toml")]) == 2
