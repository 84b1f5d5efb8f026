"""The run page's heads x layers heatmap (issue 21): each head's attention_lse_max at the newest
logged step, in headless Chromium against a real service; a NaN head crossed in red; redrawn while
the run streams."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.web.browser import console_errors, screenshot, wait_for, wait_ready
from tests.web.conftest import WRITE_TOKEN, Live, _live

pytestmark = pytest.mark.slow
LAYERS, HEADS = 3, 4


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    yield from _live(tmp_path_factory.mktemp("heads"))


def head_value(step: int, layer: int, head: int) -> float | str:
    if (step, layer, head) == (0, 1, 2):
        return "NaN"
    return 5.0 + step + 10.0 * layer + head


def post(c: httpx.Client, name: str, step: int) -> None:
    pts: list[dict[str, Any]] = [{"name": "loss", "layer": None, "step": step, "value": 3.0}]
    for la in range(LAYERS):
        heads = [head_value(step, la, h) for h in range(HEADS)]
        pts += [{"name": f"attention_lse_max.h{h}", "layer": la, "step": step, "value": v} for h, v in enumerate(heads)]
        finite = [v for v in heads if isinstance(v, float)]
        pts.append({"name": "attention_lse_max", "layer": la, "step": step, "value": max(finite)})
    c.post("/api/v1/points", json={"batch_id": uuid.uuid4().hex, "run": name, "points": pts}).raise_for_status()


def heads_fig(driver: Any) -> Any:
    return driver.execute_script(
        "const d = document.getElementById('heads-attention_lse_max');"
        "return d && d.data ? {data: d.data, title: d.layout.title.text} : null;"
    )


def test_run_page_draws_each_head_by_layer_and_follows_the_run(svc: Live, browser: Any, artifacts: Path) -> None:
    c = httpx.Client(base_url=svc.base, headers={"Authorization": f"Bearer {WRITE_TOKEN}"}, timeout=30)
    run_id = int(c.post("/api/v1/runs", json={"name": "heads-run"}).json()["id"])
    post(c, "heads-run", 0)
    console_errors(browser)
    browser.get(f"{svc.base}/runs/{run_id}")
    wait_ready(browser)
    fig = wait_for(browser, heads_fig, 30)
    heat, crosses = fig["data"][0], fig["data"][1]
    assert heat["type"] == "heatmap" and heat["x"] == list(range(HEADS)) and heat["y"] == list(range(LAYERS))
    assert heat["z"][1][2] is None  # the NaN head: blank, and crossed in red
    assert heat["z"][2][3] == pytest.approx(5.0 + 20.0 + 3)
    assert crosses["meta"]["nonfinite"] and crosses["x"] == [2] and crosses["y"] == [1] and crosses["text"] == ["NaN"]
    assert "at step 0" in fig["title"] and "above 50" in fig["title"]
    post(c, "heads-run", 1)
    wait_for(browser, lambda d: "at step 1" in (heads_fig(d) or {}).get("title", ""), 30)
    heat = heads_fig(browser)["data"][0]
    assert heat["z"][1][2] == pytest.approx(6.0 + 10.0 + 2) and len(heads_fig(browser)["data"]) == 1
    assert console_errors(browser) == []
    browser.execute_script("document.getElementById('heads-attention_lse_max').scrollIntoView()")
    screenshot(browser, artifacts / "heads-run-page.png")
