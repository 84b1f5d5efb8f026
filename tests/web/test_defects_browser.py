"""Issue 24's page defects in headless Chromium: what the drawn charts show, not only their JSON.

A service of its own (the shared ``live`` one has runs other tests count): a group of two dense
hooks-style runs (no router) with a constant LR, all-zero MLP outlier ratios and an alert.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store.entities import NewAlert
from tests.web.browser import screenshot, wait_for, wait_ready
from tests.web.conftest import Live, _live
from tests.web.seed import XSS_NAME
from tests.web.test_browser import fig, lines, load

pytestmark = pytest.mark.slow
STEPS = 60


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    for lv in _live(tmp_path_factory.mktemp("defects")):
        ids = []
        for depth in (2, 4):
            run, _ = lv.store.upsert_run(
                "defects",
                f"dense-d{depth}",
                {"group": "dense", "depth": depth, "total_params": 10**6 * depth, "total_steps": STEPS,
                 "tokens": 4096 * STEPS, "flops": 6.0 * 10**6 * depth * 4096 * STEPS, "status": "finished"},
            )  # fmt: skip
            pts = [Point("lr", s, 3e-3, tokens=4096 * (s + 1)) for s in range(STEPS)]
            pts += [Point("loss", s, 4.0 - s / STEPS, tokens=4096 * (s + 1)) for s in range(STEPS)]
            for layer in range(2):
                pts += [Point("attention_z", s, 30.0 + (50.0 if s == 40 else s % 5), layer=layer,
                              tokens=4096 * (s + 1)) for s in range(STEPS)]  # fmt: skip
                pts += [Point("mlp_outlier_ratio", s, 0.0, layer=layer, tokens=4096 * (s + 1)) for s in range(STEPS)]
            lv.store.ingest(run.id, uuid.uuid4().hex, pts)
            ids.append(run.id)
        lv.store.add_alerts(ids[0], [NewAlert("z_spike", "warning", "attention_z", 1, 40, 80.0, 32.0, "spike")])
        lv.ids = {"runs": ids, "group": lv.store.get_run(ids[0]).group_id}
        yield lv


def tick_texts(driver: Any, div_id: str, axis: str) -> list[str]:
    texts: list[str] = driver.execute_script(
        f"return Array.from(document.querySelectorAll('#{div_id} .{axis}tick text')).map(t => t.textContent)"
    )
    return texts


def number(text: str) -> float:
    """A plotly tick label as a number ("0.2", "−1", "3m")."""
    scale = {"m": 1e-3, "µ": 1e-6, "k": 1e3, "M": 1e6, "B": 1e9}
    text = text.replace("−", "-")
    if text and text[-1] in scale:
        return float(text[:-1]) * scale[text[-1]]
    return float(text)


def test_run_page_constant_lr_zero_heatmap_and_alert_strip(dense: Live, browser: Any, artifacts: Path) -> None:
    rid = dense.ids["runs"][0]
    load(browser, f"{dense.base}/runs/{rid}?name=attention_z")
    ticks = [number(t) for t in tick_texts(browser, "fig-lr", "y")]
    assert ticks and all(2e-3 < t < 4e-3 for t in ticks), ticks  # the axis reads 3m, not -1..1 around 0
    line = fig(browser, "fig-attention_z")
    assert line["layout"]["yaxis"]["domain"][1] < line["layout"]["yaxis3"]["domain"][0]
    alerts = next(t for t in line["data"] if t.get("meta", {}).get("alerts"))
    assert alerts["yaxis"] == "y3" and alerts["customdata"] == [40]
    # the alert diamond is drawn above the highest point of the lines, not on it
    top = browser.execute_script(
        "const d = document.getElementById('fig-attention_z');"
        "const pts = Array.from(d.querySelectorAll('.scatterlayer .trace')).map(t => t.getBoundingClientRect());"
        "const dia = d.querySelector('.scatterlayer .trace:last-child .point').getBoundingClientRect();"
        "return {diamond: dia.bottom, lines: Math.min(...pts.slice(0, 2).map(b => b.top))};"
    )
    assert top["diamond"] <= top["lines"], top
    heat = browser.execute_script(
        "const d = document.getElementById('heat-mlp_outlier_ratio');return [d._fullData[0].zmin, d._fullData[0].zmax];"
    )
    assert heat == [0, 1]  # an all-zero heatmap's colour bar reads 0..1, not -0.4..0.4
    screenshot(browser, artifacts / "defects-run.png")


def test_scale_page_dense_router_panels_rule_and_fresh_ticks(dense: Live, browser: Any, artifacts: Path) -> None:
    load(browser, f"{dense.base}/groups/{dense.ids['group']}")
    side = fig(browser, "stab-attention_z")
    # the rule, on the page: the HTML caption under the figure (an annotation never wrapped, issue 35)
    caption = browser.find_element("id", "rule-attention_z").text
    assert "transferable: the peak and final value never rises" in caption
    assert side["layout"]["legend"]["x"] > 1
    routers = browser.execute_script(
        "return ['router_z', 'max_vio'].map(n => document.getElementById('fig-' + n))"
        ".filter(d => d && d.offsetParent !== null).map(d => d.textContent)"
    )
    for text in routers:  # a dense group's router panels are hidden, or say why they are empty
        assert "MoE" in text, routers
    assert len(routers) == 2 and "router" in routers[0] and "experts" in routers[1]  # shown here, with why
    browser.find_element("css selector", "#x-axis option[value=fraction]").click()
    wait_for(browser, lambda d: fig(d, "fig-loss")["layout"]["xaxis"]["title"]["text"] == "fraction of training")
    wait_for(browser, lambda d: lines(fig(d, "fig-loss")) and max(lines(fig(d, "fig-loss"))[0]["x"]) <= 1.0)
    ticks = [number(t) for t in tick_texts(browser, "fig-loss", "x") if re.search(r"\d", t)]
    assert ticks and max(ticks) <= 1.0, ticks  # the step axis's labels (0..60) do not stay
    screenshot(browser, artifacts / "defects-scale.png")


def test_runs_missing_a_field_get_one_note_per_page(live: Live, browser: Any) -> None:
    load(browser, f"{live.base}/groups/{live.ids['xss_group_id']}")
    browser.find_element("css selector", "#x-axis option[value=fraction]").click()
    wait_for(browser, lambda d: XSS_NAME in d.find_element("id", "missing-attention_z").text)
    wait_ready(browser)
    notes = browser.execute_script(
        "return Array.from(document.querySelectorAll('p.missing')).map(p => p.textContent).filter(t => t)"
    )
    assert len(notes) == 1, notes  # once for the page, not under every indicator
    assert "hooks.attach(..., total_steps=N)" in notes[0] and XSS_NAME in notes[0]
