"""The forecast in headless Chromium: the scale page's panel on the seeded ladder (four sizes, the
largest with a NaN peak) says what the API says, word for word, and draws the points, the fit and
its band, the threshold, the target; the run page of the ladder's largest run shows it against the
band. Screenshots go to test-artifacts/web/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.web.browser import wait_for, wait_ready
from tests.web.conftest import Live
from tests.web.seed import DEPTHS, params_of
from tests.web.test_browser import fig, load, no_injected_nodes

pytestmark = pytest.mark.slow


def api(live: Live, path: str, **params: Any) -> Any:
    r = httpx.get(f"{live.base}{path}", params=params, timeout=60)
    r.raise_for_status()
    return r.json()


def sentence(driver: Any) -> str:
    return str(driver.execute_script("return document.getElementById('fc-sentence').textContent"))


def test_the_scale_pages_forecast_panel(live: Live, browser: Any, artifacts: Path) -> None:
    gid = live.ids["group_id"]
    load(browser, f"{live.base}/groups/{gid}")
    # the default target is 10x the group's largest run (d=20, whose NaN peak is left out of the fit)
    target = 10 * params_of(20)
    body = api(live, f"/api/v1/groups/{gid}/forecast", params=target, name="attention_z")
    peak = body["indicators"]["attention_z"]["peak"]
    assert sentence(browser) == peak["sentence"]
    assert "does not cross 1,000 within 1,000x the largest size fitted" in peak["sentence"]
    assert "left out: hyperp-d20 (peak is NaN)" in peak["sentence"]
    f = fig(browser, "fc-figure")
    names = [t.get("name") for t in f["data"]]
    assert names[:5] == [None, "90% band", "power-law fit", "runs (peak)", "left out · non-finite"]
    runs = f["data"][3]
    assert runs["x"] == [params_of(d) for d in DEPTHS[:3]] and len(runs["y"]) == 3
    star = f["data"][-1]
    assert star["name"] == "forecast" and star["x"] == [target] and star["y"] == [pytest.approx(peak["predicted"])]
    assert [s["y0"] for s in f["layout"]["shapes"] if s.get("xref") == "paper"] == [1000]  # the threshold line
    assert f["layout"]["xaxis"]["type"] == f["layout"]["yaxis"]["type"] == "log"
    browser.execute_script("document.getElementById('forecast-panel').scrollIntoView()")
    browser.save_screenshot(str(artifacts / "forecast-panel.png"))

    # a target typed in ("1.3B"), then another indicator: the API's sentences again
    box = browser.find_element("id", "fc-target")
    box.send_keys("1.3B")
    browser.find_element("css selector", "#fc-form button").click()
    want = api(live, f"/api/v1/groups/{gid}/forecast", params=1.3e9, name="attention_z")
    wait_for(browser, lambda d: sentence(d) == want["indicators"]["attention_z"]["peak"]["sentence"])
    assert "predicted at 1.3B params" in sentence(browser)
    browser.execute_script(
        "const s = document.getElementById('fc-name'); s.value = 'attention_rms'; s.dispatchEvent(new Event('change'));"
    )
    rms = api(live, f"/api/v1/groups/{gid}/forecast", params=1.3e9, name="attention_rms")
    wait_for(browser, lambda d: sentence(d) == rms["indicators"]["attention_rms"]["peak"]["sentence"])
    assert "no threshold to cross (set attention_rms_limit on the group)" in sentence(browser)
    wait_ready(browser)
    browser.save_screenshot(str(artifacts / "forecast-panel-rms.png"))
    # a size that is not one says so
    box.clear()
    box.send_keys("lots")
    browser.find_element("css selector", "#fc-form button").click()
    wait_for(browser, lambda d: "is not a size" in d.find_element("id", "status").text)


def test_a_group_with_too_few_sizes_says_so(live: Live, browser: Any) -> None:
    load(browser, f"{live.base}/groups/{live.ids['xss_group_id']}")
    assert sentence(browser).startswith("attention_z: no run of this group can be compared yet") or (
        "not enough runs" in sentence(browser)
    )
    no_injected_nodes(browser)


def test_the_largest_run_against_its_band_on_the_run_page(live: Live, browser: Any, artifacts: Path) -> None:
    big = live.ids["runs"]["hyperp-d20"]
    load(browser, f"{live.base}/runs/{big}")
    assert browser.execute_script("return document.getElementById('forecast-watch').hidden") is False
    items = browser.execute_script(
        "return Array.from(document.querySelectorAll('#fw-sentences li')).map(li => li.textContent)"
    )
    body = api(live, f"/api/v1/runs/{big}/forecast")
    assert items == [ind["sentence"] for ind in body["indicators"].values()]
    az = body["indicators"]["attention_z"]
    assert az["now"]["standing"] == "nonfinite" and az["sentence"].endswith("(the run diverged).")
    rms = body["indicators"]["attention_rms"]["now"]
    assert rms["standing"] == "inside" and rms["fraction"] == 1.0  # falls with depth as forecast
    f = fig(browser, "fw-figure")
    assert [t.get("name") for t in f["data"]] == [None, "90% band of the peak", "forecast peak", "value", "peak so far"]
    browser.execute_script("document.getElementById('forecast-watch').scrollIntoView()")
    browser.save_screenshot(str(artifacts / "forecast-run.png"))
    # a smaller run is not watched: the section stays hidden
    load(browser, f"{live.base}/runs/{live.ids['runs']['hyperp-d8']}")
    assert browser.execute_script("return document.getElementById('forecast-watch').hidden") is True
