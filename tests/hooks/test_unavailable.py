"""Indicators the hooks cannot measure are stored with the run and listed on its page.

Through the real service (uvicorn on a free localhost port, SQLite file, real HTTP) and headless
Chromium: they are learned on the first logged forward, when the residual stream is traced (an
attention that calls neither SDPA nor a softmax has no Z; a branch the residual receives through
a tanh is no module's output), and reach the service as a run update; an offline folder replayed
with ``hyperwatch upload`` carries them too.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from hyperwatch import hooks
from hyperwatch.hooks.upload import Uploader

uvicorn = pytest.importorskip("uvicorn")
WRITE_TOKEN = "unavailable-test-write-token-0123456789"


class LinearAttention(nn.Module):
    """No softmax, no SDPA: its attention Z cannot be intercepted (reported on the first forward)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).relu().chunk(3, dim=-1)
        return q @ (k.transpose(-1, -2) @ v) / x.shape[1]


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.attn = LinearAttention(d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + torch.tanh(self.proj(x))  # the residual receives no module's output: no MLP values


class Model(nn.Module):
    def __init__(self, d: int = 16, depth: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(d) for _ in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def train(mon: hooks.Monitor, model: nn.Module, steps: int = 2) -> None:
    for step in range(steps):
        model(torch.randn(2, 5, 16)).square().mean().backward()
        mon.step(step, loss=1.0)
        model.zero_grad(set_to_none=True)


@pytest.fixture
def live(tmp_path: Path) -> Iterator[str]:
    from prometheus_client import CollectorRegistry

    from hyperwatch.app import create_app
    from hyperwatch.monitor.core.config import Settings
    from hyperwatch.monitor.store import SqlStore, migrate

    url = f"sqlite:///{tmp_path}/hyperwatch.db"
    store = SqlStore(url)
    migrate.upgrade(store.engine)
    app = create_app(Settings(database_url=url, write_token=WRITE_TOKEN), store=store, registry=CollectorRegistry())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        store.close()


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def run_by_name(base: str, name: str) -> dict[str, Any]:
    runs = [r for r in get(f"{base}/api/v1/runs") if r["name"] == name]
    assert len(runs) == 1, runs
    return runs[0]  # type: ignore[no-any-return]


EXPECTED = {"mlp_rms", "mlp_outlier_ratio", "attention_z"}  # the same in every layer: one key each


def test_unavailable_indicators_are_stored_with_the_run_and_shown_on_its_page(live: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Model()
    mon = hooks.attach(
        model, run="no-mlp", sink=live, token=WRITE_TOKEN, spool=tmp_path / "spool", every=1, close_timeout=30
    )
    assert mon.unavailable == {}  # nothing is guessed before the first forward is traced
    train(mon, model)
    mon.close()
    assert set(mon.unavailable) == EXPECTED
    run = run_by_name(live, "no-mlp")
    assert set(run["unavailable"]) == EXPECTED
    assert "result of tanh" in run["unavailable"]["mlp_rms"]
    assert "scaled_dot_product_attention" in run["unavailable"]["attention_z"]
    assert "attention = <block>.attn" in run["config"]["_hyperwatch"]["branches"]
    assert run["status"] == "finished"
    left = {p.name for p in (tmp_path / "spool" / "no-mlp").glob("*.json")}
    assert left == set(), "update.json/status.json not delivered"  # a delivered run's spool folder is removed

    # An offline folder replayed later carries them as well.
    model = Model()
    with hooks.attach(model, run="offline-no-mlp", sink=tmp_path / "offline", every=1) as mon:
        train(mon, model)
    assert (
        set(json.loads((tmp_path / "offline" / "offline-no-mlp" / "run.json").read_text())["unavailable"]) == EXPECTED
    )
    Uploader(live, WRITE_TOKEN, 20_000, 3, 10.0).upload(tmp_path / "offline" / "offline-no-mlp")
    assert set(run_by_name(live, "offline-no-mlp")["unavailable"]) == EXPECTED

    # The run page lists them, in a real browser.
    from tests.web.browser import chromium, missing_browser, wait_for, wait_ready

    why = missing_browser()
    if why is not None:
        if __import__("os").environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(why)
        pytest.skip(why)
    with chromium() as driver:
        driver.get(f"{live}/runs/{run['id']}")
        wait_ready(driver)
        wait_for(driver, lambda d: d.execute_script("return !document.getElementById('unavailable').hidden"))
        summary = driver.find_element("css selector", "#unavailable summary").text
        assert summary.startswith("3 indicators not measured by the hooks")
        items = driver.execute_script(
            "return Array.from(document.querySelectorAll('#unavailable li b')).map(b => b.textContent)"
        )
        assert sorted(items) == sorted(EXPECTED)
        # A run with nothing unavailable shows no notice.
        with hooks.attach(Model(), run="clean", sink=hooks.MemorySink(), every=1, mlp="*.proj") as mon:
            pass
        req = urllib.request.Request(
            f"{live}/api/v1/runs",
            data=json.dumps({"name": "clean"}).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {WRITE_TOKEN}"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            clean = json.loads(resp.read())
        assert clean["unavailable"] == {}
        driver.get(f"{live}/runs/{clean['id']}")
        wait_ready(driver)
        assert driver.execute_script("return document.getElementById('unavailable').hidden") is True
