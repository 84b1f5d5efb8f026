"""The run's ``lr`` field from ``config={"lr": ...}`` when ``lr=`` is not given (issue 35: the runs
table's lr column was empty), through a real service on SQLite."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from torch import nn

from hyperwatch import hooks
from hyperwatch.monitor.store import SqlStore, migrate
from tests.server_thread import start

# hooks.attach is the function; importing the submodule by name would shadow it with the module
lr_from_config = sys.modules[hooks.attach.__module__].lr_from_config
TOKEN = "attach-lr-write-token-0123456789"


@pytest.fixture
def base(tmp_path: Path) -> Iterator[str]:
    store = SqlStore(f"sqlite:///{tmp_path / 'lr.db'}")
    migrate.upgrade(store.engine)
    server, thread, url = start(store, TOKEN)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(10)
        store.close()


def _run(base: str, name: str, config: dict[str, Any], **fields: Any) -> dict[str, Any]:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    with hooks.attach(model, run=name, sink=base, token=TOKEN, every=1, config=config, **fields) as mon:
        loss = model(torch.randn(2, 4)).pow(2).mean()
        loss.backward()
        mon.step(0, loss=loss)
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as c:
        (found,) = [r for r in c.get("/api/v1/runs", params={"limit": 100}).json() if r["name"] == name]
        return found  # type: ignore[no-any-return]


def test_the_config_lr_fills_the_runs_lr_and_an_explicit_lr_wins(base: str) -> None:
    assert _run(base, "from-config", {"lr": 3e-3, "batch": 8})["lr"] == 3e-3
    assert _run(base, "hf-style", {"learning_rate": 5e-5})["lr"] == 5e-5
    explicit = _run(base, "explicit", {"lr": 3e-3}, lr=1e-3)
    assert explicit["lr"] == 1e-3 and explicit["config"]["lr"] == 3e-3  # the config itself is untouched


def test_only_a_positive_finite_number_is_taken_as_the_lr() -> None:
    for bad in ("cosine", [1e-3, 1e-4], True, 0.0, -1e-3, float("nan"), None):
        assert lr_from_config({"lr": bad}, {}) == {}
    assert lr_from_config(None, {"depth": 2}) == {"depth": 2}
    assert lr_from_config({"lr": 2}, {}) == {"lr": 2.0}
