"""The /alerts page lists incidents, one row each, expandable to layers, heads, steps and remedies."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hyperwatch.monitor.thresholds.defaults import DEFAULT_THRESHOLDS
from tests.web.browser import console_errors, screenshot, wait_for, wait_ready
from tests.web.conftest import WRITE_TOKEN, Live, _live

pytestmark = pytest.mark.slow
LIMIT = DEFAULT_THRESHOLDS["attention_lse_max_limit"]


@pytest.fixture(scope="module")
def blown(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A run whose heads 2 of layer 1 and 0 of layer 3 pass the logit ceiling at step 1 and climb on."""
    for lv in _live(tmp_path_factory.mktemp("incidents")):
        with httpx.Client(base_url=lv.base, headers={"Authorization": f"Bearer {WRITE_TOKEN}"}, timeout=60) as c:
            c.post("/api/v1/runs", json={"name": "blowup"}).raise_for_status()
            for step in range(1, 31):
                pts: list[dict[str, object]] = [{"name": "loss", "step": step, "value": 3.0}]
                for layer in range(4):
                    for head in range(4):
                        hot = (layer, head) in ((1, 2), (3, 0))
                        v = 1.2 * LIMIT * math.exp(0.05 * step) if hot else 8.0
                        pts.append({"name": f"attention_lse_max.h{head}", "layer": layer, "step": step, "value": v})
                    top = max(p["value"] for p in pts[-4:])  # type: ignore[type-var]
                    pts.append({"name": "attention_lse_max", "layer": layer, "step": step, "value": top})
                body = {"batch_id": uuid.uuid4().hex, "run": "blowup", "points": pts}
                c.post("/api/v1/points", json=body).raise_for_status()
            lv.ids["incidents"] = c.get("/api/v1/incidents").json()
            lv.ids["events"] = c.get("/api/v1/alerts", params={"limit": 1000}).json()
        yield lv


def test_one_row_per_incident_expands_to_heads_steps_and_remedies(blown: Live, browser: Any, artifacts: Path) -> None:
    incidents = blown.ids["incidents"]
    assert len(incidents) < len(blown.ids["events"])  # grouped: fewer rows than events
    console_errors(browser)
    browser.get(f"{blown.base}/alerts")
    wait_ready(browser)
    rows = browser.find_elements("css selector", "#alerts-table tbody tr.incident")
    assert len(rows) == len(incidents)
    kinds = [r.find_elements("css selector", "td")[2].text for r in rows]
    i = kinds.index("logit_ceiling")
    assert not browser.find_elements("css selector", "tr.incident-detail")  # collapsed at first
    rows[i].find_element("css selector", "button.expand").click()
    detail = wait_for(browser, lambda d: d.find_elements("css selector", "tr.incident-detail"))[0]
    text = detail.text
    assert "Heads (layer.head): 1.2, 3.0" in text and "Layers: 1, 3" in text
    assert "QK-norm" in text and f"above the ceiling {LIMIT:.4g}" in text
    steps = [a.get_attribute("href") for a in detail.find_elements("css selector", "a.step-link")]
    run_id = incidents[0]["run_id"]
    assert steps and steps[0].endswith(f"/runs/{run_id}?name=attention_lse_max&step=1")
    screenshot(browser, artifacts / "alerts-incident.png")
    rows[i].find_element("css selector", "button.expand").click()  # and it folds again
    wait_for(browser, lambda d: not d.find_elements("css selector", "tr.incident-detail"))
    assert console_errors(browser) == []
    # the step link opens the run page, where the heads are drawn as their layer's max, not one chart each
    browser.get(steps[0])
    wait_ready(browser)
    ids = browser.execute_script("return Array.from(document.querySelectorAll('[id^=fig-]')).map(e => e.id)")
    assert "fig-attention_lse_max" in ids and not [i for i in ids if i.startswith("fig-attention_lse_max.h")]
    assert console_errors(browser) == []
