"""The run page's Environment (issue 35): a run recorded by the real hooks, from a dirty git
checkout, through the real service, shows its commit, host, versions, device and system metrics."""

from __future__ import annotations

import platform
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from torch import nn

from hyperwatch import hooks
from tests.hooks.test_environment import _git, committed_repo
from tests.web.browser import console_errors, screenshot, wait_for, wait_ready
from tests.web.conftest import WRITE_TOKEN, Live, _live

pytestmark = pytest.mark.slow
PROJECT = "envp"


@pytest.fixture(scope="module")
def env_live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A service of its own (the session's seeded one lists an exact set of runs)."""
    yield from _live(tmp_path_factory.mktemp("web-env"))


def _record(live: Live, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """Train a tiny model for 6 steps from a dirty checkout, sending to the service; (run id, commit)."""
    repo = committed_repo(tmp / "repo")
    (repo / "train.py").write_text("print('edited')\n")
    monkeypatch.chdir(repo)
    torch.manual_seed(0)
    model = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True), 2)
    mon = hooks.attach(
        model, run="env-run", sink=live.base, token=WRITE_TOKEN, spool=tmp / "spool", every=2, project=PROJECT
    )
    for step in range(6):
        loss = model(torch.randn(2, 5, 16)).square().mean()
        loss.backward()
        mon.step(step, loss=loss)
    mon.close()
    runs = httpx.get(f"{live.base}/api/v1/runs", params={"project": PROJECT}, timeout=30).json()
    return next(r["id"] for r in runs if r["name"] == "env-run"), _git(repo, "rev-parse", "HEAD")


def test_run_page_shows_the_environment(
    env_live: Live, browser: Any, artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id, commit = _record(env_live, tmp_path, monkeypatch)
    console_errors(browser)
    browser.get(f"{env_live.base}/runs/{run_id}")
    wait_ready(browser)
    wait_for(browser, lambda d: d.execute_script("return !document.getElementById('environment').hidden"))
    rows: dict[str, str] = browser.execute_script(
        "return Object.fromEntries(Array.from(document.querySelectorAll('#env-table tr'))"
        ".map(tr => [tr.querySelector('th').textContent, tr.querySelector('td').textContent]));"
    )
    assert rows["git commit"] == f"{commit} (dirty: uncommitted changes)"
    assert rows["host"] == socket.gethostname()
    assert rows["python"] == platform.python_version()
    assert rows["torch"] == torch.__version__
    assert rows["device"] == "cpu" and rows["world size"] == "1"
    if torch.version.cuda:
        assert rows["CUDA"] == torch.version.cuda
    rss = rows["host RSS (rank 0)"]
    assert rss.endswith(" at step 4") and rss.split()[1] in ("MiB", "GiB"), rss  # the newest logged step
    summary = browser.execute_script("return document.querySelector('#environment summary').textContent")
    assert summary == f"Environment · {commit[:10]} dirty · {socket.gethostname()} · cpu"
    assert browser.execute_script("return document.getElementById('environment').open") is True
    # the system metric is a run-level chart like loss
    drawn = browser.execute_script("const d = document.getElementById('fig-host_rss'); return d && d.data.length")
    assert drawn, "host_rss has no chart"
    assert console_errors(browser) == []
    screenshot(browser, artifacts / "run-environment.png")
