"""FSDP2 (``--train.parallel fsdp``) on gloo/CPU: 2 and 4 ranks train as one process does, and resume."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.test_distributed import free_port

WORKER = Path(__file__).with_name("fsdp_worker.py")
ROOT = Path(__file__).parents[2]


def _run(world: int, tmp: Path, cache: Path, name: str, parallel: str, max_steps: int, resume: bool) -> dict[str, Any]:
    out = tmp / f"{name}.json"
    args = [str(out), str(cache), str(tmp / name.split("@")[0]), parallel, str(max_steps), str(resume).lower()]
    if world == 1:
        cmd = [sys.executable, str(WORKER), *args]
    else:
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world),
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(WORKER), *args,
        ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, env=env)
    # No retry (issue 25): a rank that aborts at exit fails the test; runs end through Trainer.close().
    assert proc.returncode == 0, proc.stderr[-4000:]
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def _assert_same_training(got: dict[str, Any], ref: dict[str, Any]) -> None:
    assert [s for s, _ in got["losses"]] == [s for s, _ in ref["losses"]]
    for (_, a), (_, b) in zip(got["losses"], ref["losses"], strict=True):
        assert a == pytest.approx(b, rel=2e-5), (got["losses"], ref["losses"])
    assert got["counts"] == ref["counts"]  # routing of the fixed global batch, all ranks together
    assert got["max_vio"] == pytest.approx(ref["max_vio"], rel=1e-6)
    assert got["aux_loss"] == pytest.approx(ref["aux_loss"], rel=1e-4)
    for name, value in ref["params"].items():
        assert got["params"][name] == pytest.approx(value, rel=1e-4, abs=1e-4), name


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory, corpus_cache: Path) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("single")
    report = _run(1, tmp, corpus_cache, "single", "ddp", 4, False)
    assert report["sharded"] is False and len(report["losses"]) == 4
    return report


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp_ranks_train_as_one_process(
    world: int, single: dict[str, Any], tmp_path: Path, corpus_cache: Path
) -> None:
    got = _run(world, tmp_path, corpus_cache, f"fsdp{world}", "fsdp", 4, False)
    assert got["sharded"] is True and got["world"] == world
    _assert_same_training(got, single)


@pytest.fixture(scope="module")
def half_run(tmp_path_factory: pytest.TempPathFactory, corpus_cache: Path) -> Path:
    """The first 2 of 4 steps under 2 FSDP ranks; its out_dir holds the checkpoint."""
    tmp = tmp_path_factory.mktemp("half")
    first = _run(2, tmp, corpus_cache, "run", "fsdp", 2, False)
    assert len(first["losses"]) == 2
    return tmp / "run"


@pytest.mark.parametrize("parallel", ["fsdp", "ddp"])
def test_fsdp_checkpoint_resumes_to_the_same_run(
    parallel: str, half_run: Path, single: dict[str, Any], tmp_path: Path, corpus_cache: Path
) -> None:
    """2 FSDP ranks continue the checkpoint; so do 2 DDP ranks (the file holds whole tensors)."""
    shutil.copytree(half_run, tmp_path / "run")
    resumed = _run(2, tmp_path, corpus_cache, "run@2", parallel, 4, True)
    assert resumed["resumed_from"] == 2 and resumed["sharded"] is (parallel == "fsdp")
    _assert_same_training(resumed, single)


def test_parallel_option_is_checked_by_name() -> None:
    from hyperwatch.trainer.config import ConfigError, load_config

    assert load_config(None, ["--preset", "tiny", "--train.parallel", "fsdp"]).train.parallel == "fsdp"
    assert load_config(None, ["--preset", "tiny"]).train.compile is True  # on by default (CUDA only)
    with pytest.raises(ConfigError, match=r"TrainConfig\.parallel.*fsdp"):
        load_config(None, ["--preset", "tiny", "--train.parallel", "zero3"])
