"""The main job end to end: `hyperwatch demo` (fast) tells the story, read back through the API and
in headless Chromium.

Two arms across depths 2 and 4 stream into the service: MuonH + HyperP with QK-Norm at its LR
tuned at depth 2 and transferred (attention Z bounded: "transferable"; the better loss at every
depth) and vanilla MuonH without QK-Norm at a too-high LR (attention Z explodes and grows with
depth: "breaks", incidents from the service's detectors and, with Prometheus and Alertmanager, the
rules delivered to the webhook), all on the default thresholds (issue 21). The loss agrees (issue
33): the baseline ends at least 0.15 nats worse than HyperP at each depth, a run gone wrong by the
benchmark's rule, so every alert is a hit.
Screenshots of every page go to test-artifacts/e2e/.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from hyperwatch.app import create_app
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.processes.children import alerting_available, free_port
from hyperwatch.monitor.processes.lifetime import die_with_parent
from hyperwatch.monitor.store import SqlStore
from tests.web.browser import chromium, console_errors, screenshot, wait_for, wait_ready
from tests.web.conftest import serve

PER_LAYER = ["attention_z", "attention_rms", "mlp_rms", "attention_outlier_ratio", "mlp_outlier_ratio"]
RUN_LEVEL = ["loss", "val_loss", "lr", "grad_norm"]
SHOTS = Path("test-artifacts") / "e2e"
README_SHOT = Path(__file__).resolve().parents[2] / "docs" / "demo-scale-baseline.png"
"""The README's picture: the baseline arm's scale page, taken from the demo's own data."""


@pytest.mark.timeout(2400)  # 78 s of CPU in all; 81 s wall measured on a shared 2-core machine (load 5)
def test_fast_demo_catches_the_instability_live_across_scales(tmp_path: Path) -> None:
    env = {**os.environ, "HYPERWATCH_DEMO_FAST": "1"}  # the demo gives each arm its share of the cores
    cmd = [sys.executable, "-m", "hyperwatch", "demo", "--no-serve", "--out", str(tmp_path), "--port", str(free_port())]
    # die_with_parent: a test session stopped midway takes the demo (and so its children) along
    proc = subprocess.run(die_with_parent(cmd), capture_output=True, text=True, timeout=2300, env=env)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert out.splitlines()[0].startswith("HyperWatch dashboard: http://127.0.0.1:")  # the URL first
    for run in ("demo-hyperp-fast-d2", "demo-hyperp-fast-d4", "demo-baseline-fast-d2", "demo-baseline-fast-d4"):
        assert f"{run} step 16/16 loss " in out and " ETA 0:00" in out, run  # a live line per run
        log = (tmp_path / "sweeps" / run.rsplit("-", 1)[0] / run / "train.log").read_text()
        assert f"progress {run} step 8/16 loss" in log and "attention_z" in log  # also in the run's log
    assert out.count("finished") >= 4

    db = f"sqlite:///{tmp_path / 'hyperwatch.db'}"
    app = create_app(Settings(database_url=db, dev_mode=True), registry=CollectorRegistry())
    with TestClient(app) as client:
        groups = {g["name"]: g["id"] for g in client.get("/api/v1/groups").json()}
        verdicts, sentences, val_loss = {}, {}, {}
        for name in ("demo-hyperp-fast", "demo-baseline-fast"):
            runs = client.get("/api/v1/runs", params={"group": name}).json()
            assert sorted(r["depth"] for r in runs) == [2, 4], runs
            for run in runs:
                assert run["status"] == "finished" and not run["stale"], run
                val_loss[run["name"]] = run["summary"]["val_loss"]
                assert run["tokens_seen"] == run["tokens"] > 0
                have = {(s["name"], s["layer"]) for s in client.get(f"/api/v1/runs/{run['id']}/series_index").json()}
                for metric in PER_LAYER:
                    assert all((metric, layer) in have for layer in range(run["depth"])), (run["name"], metric)
                assert all((metric, None) in have for metric in RUN_LEVEL), run["name"]
            stab = client.get(f"/api/v1/groups/{groups[name]}/stability").json()
            assert stab["matched"]["fraction"] == 1.0 and stab["matched"]["reason"] is None
            verdicts[name] = stab["report"]["indicators"]
            # the forecast panel's words: two depths are too few sizes for a band (the full demo has three)
            fc = client.get(f"/api/v1/groups/{groups[name]}/forecast", params={"name": "attention_z"}).json()
            sentences[name] = fc["indicators"]["attention_z"]["peak"]["sentence"]
            assert sentences[name] == (
                "peak attention Z: not enough runs: 2 sizes with a finite, positive peak (need 3)."
            )
        assert verdicts["demo-hyperp-fast"]["attention_z"]["verdict"] == "transferable", verdicts
        assert verdicts["demo-baseline-fast"]["attention_z"]["verdict"] == "breaks", verdicts
        peaks = verdicts["demo-baseline-fast"]["attention_z"]["peak"]["values"]
        assert peaks[1] > 1.05 * peaks[0] and peaks[1] > 100  # grows with depth, from 22 at step 0
        assert max(verdicts["demo-hyperp-fast"]["attention_z"]["peak"]["values"]) < 100

        alerts = client.get("/api/v1/alerts", params={"limit": 1000}).json()
        service = [a for a in alerts if a["source"] == "service"]
        print("demo alerts (source, run, rule, name, step):",
              sorted({(a["source"], a["run"], a["rule"], a["name"], a["step"]) for a in alerts}))  # fmt: skip
        assert service and all(a["run"].startswith("demo-baseline") for a in service), alerts[:3]
        assert not [a for a in alerts if a["run"].startswith("demo-hyperp")]
        # Every alert is a hit by the loss (issue 33's rule): its run ended at least 0.15 nats worse
        # than the better arm at its depth (measured: 0.27 at d=2, 0.35 at d=4); the HyperP arm, the
        # better one at each depth, is the best known setting and has no alert.
        best = {d: min(val_loss[f"demo-{arm}-fast-d{d}"] for arm in ("hyperp", "baseline")) for d in (2, 4)}
        wrong = {run for run, v in val_loss.items() if v >= best[int(run.rsplit("-d", 1)[1])] + 0.15}
        assert wrong == {"demo-baseline-fast-d2", "demo-baseline-fast-d4"}, val_loss
        assert {a["run"] for a in alerts} == wrong, (val_loss, sorted({(a["run"], a["rule"]) for a in alerts}))
        incidents = client.get("/api/v1/incidents", params={"limit": 1000}).json()
        assert incidents and len(incidents) < len(alerts)  # grouped: a few incidents, not one per event
        # Prometheus and Alertmanager ran beside the demo (scripts/system-deps.sh installs them) and
        # the production rule fired from the demo's own training: its baseline is counted in steps,
        # so a slow or loaded machine makes no difference. Only the baseline arm's runs fire.
        assert alerting_available() is None, alerting_available()
        assert "Prometheus http://127.0.0.1:" in out
        prom = [a for a in alerts if a["source"] == "prometheus"]
        assert prom, f"no Prometheus alert arrived; alerts by source: {sorted({a['source'] for a in alerts})}"
        assert all(a["run"].startswith("demo-baseline") and a["rule"].startswith("HyperWatch") for a in prom), prom
        spiky = service[-1]["run_id"]
    check_pages(db, groups, spiky, sentences)


def _figure(driver: Any, div: str) -> Any:
    return driver.execute_script(
        f"const d = document.getElementById('{div}'); "
        "return d && d.layout ? {n: d.data.length, title: (d.layout.title || {}).text || ''} : null;"
    )


def check_pages(db: str, groups: dict[str, int], spiky: int, sentences: dict[str, str]) -> None:
    """Every page of the demo's data in headless Chromium: verdicts, the alert marker, screenshots."""
    store = SqlStore(db)
    server, thread, url = serve(store)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        with chromium() as driver:
            titles = {}
            for name, gid in groups.items():
                driver.get(f"{url}/groups/{gid}")
                wait_ready(driver)
                wait_for(driver, lambda d: _figure(d, "stab-attention_z") is not None)
                titles[name] = _figure(driver, "stab-attention_z")["title"]
                shown = driver.execute_script("return document.getElementById('fc-sentence').textContent")
                assert shown == sentences[name], (name, shown)  # the forecast panel says what the API says
                screenshot(driver, SHOTS / f"scale-{name}.png")
                assert console_errors(driver) == []
            if not README_SHOT.exists() or os.environ.get("HYPERWATCH_UPDATE_DOCS") == "1":
                shutil.copyfile(SHOTS / "scale-demo-baseline-fast.png", README_SHOT)
            assert "transferable" in titles["demo-hyperp-fast"], titles
            assert "breaks" in titles["demo-baseline-fast"], titles
            for page, shot in (
                ("/runs", "runs.png"),
                (f"/runs/{spiky}", "run-with-alerts.png"),
                ("/alerts", "alerts.png"),
                (f"/groups/{groups['demo-baseline-fast']}/sweeps", "sweeps.png"),
            ):
                driver.get(url + page)
                wait_ready(driver)
                screenshot(driver, SHOTS / shot)
                assert console_errors(driver) == [], page
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        store.close()
