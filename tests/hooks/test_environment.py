"""What the run ran on (issue 35): git commit and dirty flag, host, versions and devices in the
stored config, and the system metrics (CUDA peak memory, host RSS) on logged steps only."""

from __future__ import annotations

import os
import platform
import socket
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from hyperwatch import hooks
from hyperwatch.hooks import environment
from hyperwatch.hooks.schema import validate_name


def _model(device: str = "cpu") -> nn.Module:
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).to(device)


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@x"
    out = subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True)
    return out.stdout.strip()


def committed_repo(root: Path) -> Path:
    """``root`` made a git repository with one commit of ``train.py`` (the browser test uses it too)."""
    root.mkdir()
    _git(root, "init", "-q")
    (root / "train.py").write_text("print('train')\n")
    _git(root, "add", "train.py")
    _git(root, "commit", "-q", "-m", "first")
    return root


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A real git repository with one commit, as the working directory of the training process."""
    root = committed_repo(tmp_path / "repo")
    monkeypatch.chdir(root)
    return root


def _stored(run: str) -> dict[str, Any]:
    sink = hooks.MemorySink()
    mon = hooks.attach(_model(), run=run, sink=sink, every=1, config={"lr": 1e-3})
    mon.close()
    meta = sink.runs[0].config["_hyperwatch"]
    assert isinstance(meta, dict)
    return meta


def test_a_clean_checkout_is_stored_with_its_commit_host_and_versions(repo: Path) -> None:
    meta = _stored("clean")
    assert meta["git_commit"] == _git(repo, "rev-parse", "HEAD") and len(meta["git_commit"]) == 40
    assert meta["git_dirty"] is False
    assert "git_unavailable" not in meta
    assert meta["host"] == socket.gethostname()
    assert meta["python"] == platform.python_version()
    assert meta["torch"] == torch.__version__
    assert meta.get("cuda") == torch.version.cuda  # omitted on a CPU build of torch
    assert meta["device"] == "cpu" and meta["world_size"] == 1
    assert meta["hooks_adapter"] == "torch" and meta["every"] == 1  # the hooks' settings stay


def test_untracked_files_leave_it_clean_and_a_changed_tracked_file_makes_it_dirty(repo: Path) -> None:
    (repo / "run.log").write_text("a log the run wrote\n")  # untracked: still the commit's code
    assert _stored("untracked")["git_dirty"] is False
    (repo / "train.py").write_text("print('edited')\n")
    meta = _stored("dirty")
    assert meta["git_dirty"] is True and meta["git_commit"] == _git(repo, "rev-parse", "HEAD")
    _git(repo, "add", "train.py")  # staged but not committed: dirty too
    assert _stored("staged")["git_dirty"] is True


def test_no_repository_or_no_git_is_a_reason_not_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outside = tmp_path / "plain"
    outside.mkdir()
    monkeypatch.chdir(outside)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))  # never find a repository above tmp_path
    meta = _stored("no-repo")
    assert "git_commit" not in meta and "not a git repository" in meta["git_unavailable"]
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    meta = _stored("no-git")
    assert "git_commit" not in meta and "git is not installed" in meta["git_unavailable"]
    assert meta["host"] == socket.gethostname()  # the rest is still there


def test_a_hanging_git_costs_attach_at_most_the_timeout(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "slow-bin"
    bin_dir.mkdir()
    fake = bin_dir / "git"
    fake.write_text("#!/bin/sh\nsleep 30\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(environment, "GIT_TIMEOUT", 0.3)
    meta = _stored("slow-git")  # a 30 s git: the reason below says the 0.3 s timeout cut it
    assert "took more than 0.3 s" in meta["git_unavailable"]


def test_the_system_metric_names_are_registered() -> None:
    for name in (environment.CUDA_MAX_MEMORY, environment.HOST_RSS):
        assert validate_name(name) == name


def _train(device: str, every: int, steps: int) -> hooks.MemorySink:
    torch.manual_seed(0)
    model = _model(device)
    sink = hooks.MemorySink()
    mon = hooks.attach(model, run=f"sys-{device}", sink=sink, every=every)
    for step in range(steps):
        x = torch.randn(2, 5, 16, device=device)
        loss = model(x).square().mean()
        loss.backward()
        mon.step(step, loss=loss)
    mon.close()
    return sink


def test_system_metrics_arrive_on_logged_steps_only() -> None:
    sink = _train("cpu", every=3, steps=8)
    logged = set(sink.values("loss"))
    assert logged == {0, 3, 6}  # the first step, then every 3rd
    rss = sink.values(environment.HOST_RSS)
    assert set(rss) == logged
    assert all(10e6 < v < 1e12 for v in rss.values())  # bytes of a real Python process with torch
    assert environment.CUDA_MAX_MEMORY not in {p.name for p in sink.points}  # a CPU model has no CUDA peak


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_peak_memory_is_the_running_peak_and_is_never_reset() -> None:
    big = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")  # a 64 MiB peak before attach
    del big
    sink = _train("cuda", every=2, steps=6)
    peaks = sink.values(environment.CUDA_MAX_MEMORY)
    assert set(peaks) == set(sink.values("loss")) == set(sink.values(environment.HOST_RSS)) == {0, 2, 4}
    values = [peaks[s] for s in sorted(peaks)]
    assert values == sorted(values) and values[0] >= 64 * 2**20  # a running max: never reset by the hooks
    assert torch.cuda.max_memory_allocated() >= 64 * 2**20  # the user's own reading is undisturbed
    meta = sink.runs[0].config["_hyperwatch"]
    assert meta["device_name"] == torch.cuda.get_device_name(0)
    assert meta["device_count"] == torch.cuda.device_count() and meta["cuda"] == torch.version.cuda
