"""The group page's Thresholds table (issue 33): every threshold with its value, its source (default,
override, learned from the group's finished healthy runs: each drawn its own way) and where it came
from, the same rows as GET /api/v1/groups/{id}/thresholds; in headless Chromium against a real service."""

from __future__ import annotations

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


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    yield from _live(tmp_path_factory.mktemp("thresholds"))


def _healthy_run(c: httpx.Client, name: str, head_peak: float) -> None:
    c.post("/api/v1/runs", json={"name": name, "group": "family"}).raise_for_status()
    for step in range(3):
        pts = [
            {"name": "loss", "step": step, "value": 3.0 - 0.1 * step},
            {"name": "attention_lse_max.h0", "layer": 0, "step": step, "value": head_peak if step == 1 else 5.0},
        ]
        c.post("/api/v1/points", json={"batch_id": uuid.uuid4().hex, "run": name, "points": pts}).raise_for_status()
    c.post("/api/v1/runs", json={"name": name, "status": "finished"}).raise_for_status()


def table(driver: Any) -> Any:
    return driver.execute_script(
        "const rows = document.querySelectorAll('#thresholds-table tbody tr');"
        "return rows.length ? Array.from(rows, (r) => { const b = r.querySelector('.badge');"
        " return {key: r.dataset.key, cells: Array.from(r.cells, (td) => td.textContent),"
        " colour: getComputedStyle(b).backgroundColor}; }) : null;"
    )


def test_group_page_shows_each_threshold_with_its_source(svc: Live, browser: Any, artifacts: Path) -> None:
    c = httpx.Client(base_url=svc.base, headers={"Authorization": f"Bearer {WRITE_TOKEN}"}, timeout=30)
    body = {"name": "family", "learn_thresholds": True, "thresholds": {"growth_factor": 3, "learn_multiple": 3}}
    gid = int(c.post("/api/v1/groups", json=body).json()["id"])
    _healthy_run(c, "small", 18.0)
    _healthy_run(c, "large", 20.0)
    api = {row["key"]: row for row in c.get(f"/api/v1/groups/{gid}/thresholds").json()}
    console_errors(browser)
    browser.get(f"{svc.base}/groups/{gid}")
    wait_ready(browser)
    rows = {r["key"]: r for r in wait_for(browser, table, 30)}
    assert set(rows) == set(DEFAULT_THRESHOLDS) == set(api)
    for key, row in rows.items():
        assert row["cells"][2] == api[key]["source"] and row["cells"][4] == api[key]["detail"]
    ceiling = rows["attention_lse_max_limit"]["cells"]
    assert ceiling[1:4] == ["60", "learned", "50"]  # 3 x the peak 20 of run "large"
    assert "run large" in ceiling[4] and "2 finished healthy runs: small, large" in ceiling[4]
    assert rows["growth_factor"]["cells"][1:3] == ["3", "override"]
    assert rows["spike_window"]["cells"][2] == "default"
    colours: dict[str, set[str]] = {}
    for row in rows.values():
        colours.setdefault(row["cells"][2], set()).add(row["colour"])
    assert set(colours) == {"default", "override", "learned"} and all(len(c) == 1 for c in colours.values())
    assert len(set.union(*colours.values())) == 3  # each source drawn its own way
    note = browser.find_element("id", "thresholds-note").text
    assert note.startswith("Learning on") and "2 overridden, 1 learned" in note
    assert console_errors(browser) == []
    browser.execute_script("document.getElementById('thresholds-table').scrollIntoView()")
    screenshot(browser, artifacts / "group-thresholds.png")
