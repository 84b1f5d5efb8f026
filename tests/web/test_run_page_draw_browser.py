"""The run page is laid out once per figure (issue 35: a 64-layer page drew each heatmap twice) and its
heatmaps still answer hover with the API's numbers, in headless Chromium against a real service.

Every figure's legend, colour bar and tick labels fit in the margins the server asked for
(web/layout.py reserve_right, fit_y_margin), so Plotly's automargin moves none and no figure is drawn a
second time; every tick label is drawn (none hidden as past the figure). Hovering a heatmap cell, on
the step axis and on an unevenly spaced tokens axis, reads that cell's value of
GET /api/v1/runs/{id}/layers.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.web.browser import console_errors, wait_for, wait_ready
from tests.web.conftest import WRITE_TOKEN, Live, _live

pytestmark = pytest.mark.slow
LAYERS, STEPS = 4, 30


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    yield from _live(tmp_path_factory.mktemp("drawn-once"))


def tokens(step: int) -> int:
    return 1000 * step + 40 * step * step  # unevenly spaced: a heatmap's cells are not one width


def value(name: str, step: int, layer: int) -> float | str:
    if (name, step, layer) == ("attention_z", 11, 2):
        return "NaN"
    scale = 1e-4 if name == "attention_outlier_ratio" else 1.0
    return scale * (3.0 + 0.5 * step + 10.0 * layer + 0.01 * step * layer)


@pytest.fixture(scope="module")
def run_id(svc: Live) -> int:
    c = httpx.Client(base_url=svc.base, headers={"Authorization": f"Bearer {WRITE_TOKEN}"}, timeout=30)
    body = {"name": "drawn-once", "total_steps": STEPS, "tokens": tokens(STEPS)}
    rid = int(c.post("/api/v1/runs", json=body).json()["id"])
    pts: list[dict[str, Any]] = []
    for step in range(STEPS):
        tok = tokens(step)
        pts.append({"name": "loss", "layer": None, "step": step, "tokens": tok, "value": 5.0 - 0.05 * step})
        pts.append({"name": "val_loss", "layer": None, "step": step, "tokens": tok, "value": 5.2 - 0.05 * step})
        for name in ("attention_z", "attention_outlier_ratio"):
            pts += [{"name": name, "layer": la, "step": step, "tokens": tok, "value": value(name, step, la)}
                    for la in range(LAYERS)]  # fmt: skip
    c.post("/api/v1/points", json={"batch_id": uuid.uuid4().hex, "run": "drawn-once", "points": pts}).raise_for_status()
    return rid


FIGURES = """return Array.from(document.querySelectorAll('.fig.js-plotly-plot')).map((d) => {
  const s = d._fullLayout._size, m = d.layout.margin;
  const hidden = Array.from(d.querySelectorAll('.xtick text, .ytick text, .cbaxis text'))
    .filter((t) => t.style.display === 'none').map((t) => t.textContent);
  return {id: d.id, asked: [m.l, m.r, m.t, m.b], got: [s.l, s.r, s.t, s.b].map(Math.round),
    legend: !!d.querySelector('.legend'), colourbar: !!d.querySelector('.colorbar'), hidden};
})"""


def open_page(browser: Any, url: str) -> list[dict[str, Any]]:
    browser.get(url)
    wait_ready(browser)
    return list(browser.execute_script(FIGURES))


@pytest.mark.parametrize("x", ["step", "tokens"])
def test_every_figure_keeps_the_margins_asked_so_plotly_lays_it_out_once(
    svc: Live, run_id: int, browser: Any, x: str
) -> None:
    console_errors(browser)
    for width in (1280, 1920):
        browser.set_window_size(width, 1000)
        figs = open_page(browser, f"{svc.base}/runs/{run_id}?live=0&x={x}")
        ids = {f["id"] for f in figs}
        assert {"fig-loss", "fig-attention_z", "heat-attention_z", "heat-attention_outlier_ratio"} <= ids
        assert any(f["legend"] for f in figs) and any(f["colourbar"] for f in figs)  # the room is tested
        for f in figs:
            assert f["got"] == f["asked"], f  # automargin pushed nothing out: no second layout pass
            assert f["hidden"] == [], f  # no tick label hidden as past the figure
    browser.set_window_size(1400, 1000)
    assert console_errors(browser) == []


HOVER_AT = """const [id, x, y] = arguments;
const d = document.getElementById(id), xa = d._fullLayout.xaxis, ya = d._fullLayout.yaxis;
const plot = d.querySelector('.nsewdrag').getBoundingClientRect(), box = d.getBoundingClientRect();
// the cell's centre, from the figure box's centre (where Selenium's offsets start)
return [plot.left + xa.l2p(x) - (box.left + box.width / 2), plot.top + ya.l2p(y) - (box.top + box.height / 2)];"""
HOVER_TEXT = """const h = document.querySelector('#' + arguments[0] + ' .hoverlayer .hovertext');
return h && Array.from(h.querySelectorAll('tspan.line')).map((t) => t.textContent).join('\\n')"""


def hover_text(browser: Any, fig: str, x: float, layer: int) -> str:
    """Move the mouse over the cell (x, layer) of heatmap ``fig``; the hover label's text."""
    from selenium.webdriver.common.action_chains import ActionChains

    browser.execute_script("Plotly.Fx.unhover(document.getElementById(arguments[0]))", fig)
    dx, dy = browser.execute_script(HOVER_AT, fig, x, layer)
    div = browser.find_element("id", fig)
    ActionChains(browser).move_to_element_with_offset(div, round(dx), round(dy)).perform()
    return str(wait_for(browser, lambda d: d.execute_script(HOVER_TEXT, fig), 10))


@pytest.mark.parametrize("x", ["step", "tokens"])
def test_heatmap_hover_reads_each_cells_value_of_the_api(svc: Live, run_id: int, browser: Any, x: str) -> None:
    api = httpx.get(f"{svc.base}/api/v1/runs/{run_id}/layers", params={"name": "attention_z"}, timeout=30).json()
    assert api["bucket_width"] == 1 and api["layers"] == list(range(LAYERS))
    open_page(browser, f"{svc.base}/runs/{run_id}?live=0&x={x}")
    heat = browser.execute_script("return document.getElementById('heat-attention_z').data[0]")
    xs = [float(tokens(int(s))) if x == "tokens" else float(s) for s in api["bucket_starts"]]
    assert heat["x"] == xs
    browser.execute_script("document.getElementById('heat-attention_z').scrollIntoView({block: 'center'})")
    for col in (0, 7, 18, STEPS - 1):
        for layer in range(LAYERS):
            want = api["values"][layer][col]
            if not isinstance(want, float):
                continue
            text = hover_text(browser, "heat-attention_z", xs[col], layer)
            m = re.fullmatch(r"layer (\d+)\n.+\nmax ([-0-9.e+]+)", text)
            assert m is not None, text
            assert int(m.group(1)) == layer and float(m.group(2)) == pytest.approx(want, rel=1e-4), (col, text)
    assert api["values"][2][11] == "NaN"  # the NaN cell: blank in the heatmap and crossed on top
    marks = browser.execute_script("return document.getElementById('heat-attention_z').data[1]")
    assert marks["x"] == [xs[11]] and marks["y"] == [2] and marks["text"] == ["NaN"]
