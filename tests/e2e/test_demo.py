"""The main job end to end: `hyperwatch demo` (fast) on SQLite, then read back through the real API."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from hyperwatch.app import create_app
from hyperwatch.hooks.schema import METRICS
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.store import SqlStore
from tests.web.browser import chromium, console_errors, screenshot, wait_ready
from tests.web.conftest import serve

PER_LAYER = ["attention_z", "router_z", "attention_rms", "mlp_rms", "attention_outlier_ratio",
             "mlp_outlier_ratio", "max_vio"]  # fmt: skip
RUN_LEVEL = ["loss", "val_loss", "lr", "grad_norm"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_fast_demo_streams_every_layer_and_indicator(tmp_path: Path) -> None:
    env = {**os.environ, "HYPERWATCH_DEMO_FAST": "1"}
    cmd = [sys.executable, "-m", "hyperwatch", "demo", "--no-serve", "--out", str(tmp_path), "--port", str(free_port())]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "dashboard: http://127.0.0.1:" in proc.stdout
    assert proc.stdout.count("finished") == 3

    db = f"sqlite:///{tmp_path / 'hyperwatch.db'}"
    app = create_app(Settings(database_url=db, dev_mode=True), registry=CollectorRegistry())
    with TestClient(app) as client:
        runs = client.get("/api/v1/runs", params={"group": "demo-moe-fast"}).json()
        assert sorted(r["depth"] for r in runs) == [2, 4, 6]
        for run in runs:
            assert run["status"] == "finished", run
            assert run["optimizer"] == "hyperp_moe" and run["parameterization"] == "hyperp"
            assert run["total_params"] > run["active_params"] > 0 and run["flops"] > 0
            assert isinstance(run["summary"]["val_loss"], float)
            index = client.get(f"/api/v1/runs/{run['id']}/series_index").json()
            have = {(s["name"], s["layer"]) for s in index}
            for name in PER_LAYER:
                assert METRICS[name].per_layer
                for layer in range(run["depth"]):
                    assert (name, layer) in have, (run["name"], name, layer)
            for name in RUN_LEVEL:
                assert (name, None) in have, (run["name"], name)
        group_id = runs[0]["group_id"]
        params = {"group_id": group_id, "name": "attention_z", "layer": 0, "x": "tokens"}
        compare = client.get("/api/v1/compare", params=params)
        assert compare.status_code == 200, compare.text
        series = compare.json()["series"]
        assert len(series) == 3 and all(len(s["points"]) >= 2 for s in series)
    check_comparison_page(db, group_id)


def check_comparison_page(db: str, group_id: int) -> None:
    """The scale-comparison page of the demo's group, in headless Chromium: one line per depth."""
    store = SqlStore(db)
    server, thread, url = serve(store)
    try:
        with chromium() as driver:
            driver.get(f"{url}/groups/{group_id}")
            wait_ready(driver)
            figure = driver.execute_script(
                "const d = document.getElementById('fig-attention_z'); return d && d.data ? d.data.length : -1;"
            )
            legend = driver.execute_script(
                "return Array.from(document.querySelectorAll('#legend .legend-item')).map(t => t.textContent)"
            )
            screenshot(driver, Path("test-artifacts") / "e2e" / "demo-scale-comparison.png")
            assert console_errors(driver) == []
        assert figure >= 3, figure
        assert sorted(x.split(" ")[0] for x in legend) == ["d=2", "d=4", "d=6"], legend  # "d=2 · 165k"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        store.close()
