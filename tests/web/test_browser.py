"""Every page in headless Chromium: loads without console errors, the figures hold the expected
traces, the controls change them, user strings stay text. Screenshots go to test-artifacts/web/."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.web.browser import console_errors, screenshot, wait_for, wait_ready
from tests.web.conftest import READ_TOKEN, Live
from tests.web.seed import DEPTHS, NAN_STEP, SWEEP_DEPTHS, XSS_NAME, XSS_TAG

DOCS_SHOT = Path(__file__).resolve().parents[2] / "docs" / "scale-comparison.png"
pytestmark = pytest.mark.slow


def load(driver: Any, url: str) -> None:
    console_errors(driver)  # drop what earlier pages logged
    driver.get(url)
    wait_ready(driver)
    assert driver.execute_script("return window.__xss") == 0  # no payload ever called alert()
    errors = console_errors(driver)
    assert errors == [], f"console errors on {url}: {errors}"


def fig(driver: Any, div_id: str) -> dict[str, Any]:
    """The drawn figure's traces and layout, read from the page (data/layout as plotly holds them)."""
    out: dict[str, Any] | None = driver.execute_script(
        "const d = document.getElementById(arguments[0]);return d && d.data ? {data: d.data, layout: d.layout} : null;",
        div_id,
    )
    assert out is not None, f"figure #{div_id} is not drawn"
    return out


def lines(f: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in f["data"] if t.get("mode") == "lines"]


def no_injected_nodes(driver: Any) -> None:
    """The payloads never became elements: no <img src=x>, no script but the page's own files."""
    assert driver.execute_script("return document.querySelectorAll('img[src=\"x\"]').length") == 0
    inline = driver.execute_script("return Array.from(document.scripts).filter(s => !s.src).length")
    assert inline == 0


def test_runs_page(live: Live, browser: Any, artifacts: Path) -> None:
    load(browser, f"{live.base}/runs")
    names = browser.execute_script("return Array.from(document.querySelectorAll('a.run-name')).map(a => a.textContent)")
    assert set(names) == {f"hyperp-d{d}" for d in DEPTHS} | {XSS_NAME, "plain-d4"} | set(_sweep_names())
    # the XSS run's name and tag are text, and its failed status and alert badge show
    row = browser.execute_script(
        "const a = Array.from(document.querySelectorAll('a.run-name')).find(a => a.textContent === arguments[0]);"
        "const tr = a.closest('tr'); return {tag: tr.querySelector('.tag').textContent,"
        " badge: tr.querySelector('.badge.alert').textContent,"
        " status: tr.querySelector('.status-failed').textContent};",
        XSS_NAME,
    )
    assert row == {"tag": XSS_TAG, "badge": "1", "status": "failed"}
    no_injected_nodes(browser)
    # sort by depth, ascending then descending
    browser.find_element("css selector", "th[data-key=depth]").click()
    depths = browser.execute_script(
        "return Array.from(document.querySelectorAll('#runs-table tbody tr td:nth-child(5)')).map(t => t.textContent)"
    )
    known = [int(d) for d in depths if d]
    assert known == sorted(known) and known[0] == 4
    browser.find_element("css selector", "th[data-key=depth]").click()
    depths = browser.execute_script(
        "return Array.from(document.querySelectorAll('#runs-table tbody tr td:nth-child(5)')).map(t => t.textContent)"
    )
    assert next(int(d) for d in depths if d) == 20
    # filters: group (server side) and depth (client side)
    browser.find_element("name", "group").send_keys("ladder")
    browser.find_element("name", "min_depth").send_keys("16")
    browser.find_element("css selector", "#filters button").click()
    wait_for(browser, lambda d: d.execute_script("return document.querySelectorAll('a.run-name').length") == 2)
    shown = browser.execute_script("return Array.from(document.querySelectorAll('a.run-name')).map(a => a.textContent)")
    assert sorted(shown) == ["hyperp-d16", "hyperp-d20"]
    screenshot(browser, artifacts / "runs.png")


def _sweep_names() -> list[str]:
    from tests.web.seed import SWEEP_LRS

    return [f"{m}-d{d}-lr{lr:g}" for m in ("hyperp", "muon") for d in SWEEP_DEPTHS for lr in SWEEP_LRS]


def test_scale_comparison_page(live: Live, browser: Any, artifacts: Path) -> None:
    gid = live.ids["group_id"]
    load(browser, f"{live.base}/groups/{gid}")
    az = fig(browser, "fig-attention_z")
    # one line per run, smallest first, legends "d=8 · 166M" in the page's legend
    assert [t["name"] for t in lines(az)] == ["d=8 · 166M", "d=12 · 438M", "d=16 · 936M", "d=20 · 1.74B"]
    legend = browser.execute_script(
        "return Array.from(document.querySelectorAll('#legend .legend-item')).map(t => t.textContent)"
    )
    assert legend == ["d=8 · 166M", "d=12 · 438M", "d=16 · 936M", "d=20 · 1.74B"]
    # sequential colours: distinct per scale
    assert len({t["line"]["color"] for t in lines(az)[:4]}) == 4
    # the NaN of d=20 at step 90 is a red marker, not dropped, and its line has a gap there
    marks = [t for t in az["data"] if t.get("meta", {}).get("nonfinite")]
    d20 = next(t for t in marks if t["name"].startswith("d=20"))
    assert d20["x"] == [NAN_STEP] and d20["text"] == ["NaN"]
    d20_line = lines(az)[3]
    assert d20_line["y"][d20_line["x"].index(NAN_STEP)] is None
    # every indicator row is drawn; loss too; stability panel with the verdict
    for name in (
        "router_z",
        "attention_rms",
        "mlp_rms",
        "attention_outlier_ratio",
        "mlp_outlier_ratio",
        "max_vio",
        "loss",
    ):
        assert len(lines(fig(browser, f"fig-{name}"))) >= 4, name
    # a ratio's axis is autoranged inside 0..1: the seeded ~0.01-0.03 fractions fill the plot
    for name in ("attention_outlier_ratio", "mlp_outlier_ratio"):
        lo, hi = browser.execute_script(f"return document.getElementById('fig-{name}')._fullLayout.yaxis.range")
        assert lo == 0 and 0.01 < hi < 0.1, (name, lo, hi)
    side = fig(browser, "stab-router_z")
    assert "transferable" in side["layout"]["title"]["text"]
    assert "breaks" in fig(browser, "stab-attention_z")["layout"]["title"]["text"]  # the NaN breaks it
    screenshot(browser, artifacts / "scale-comparison.png")
    if not DOCS_SHOT.exists() or os.environ.get("HYPERWATCH_UPDATE_DOCS") == "1":  # the README's picture
        DOCS_SHOT.parent.mkdir(exist_ok=True)
        shutil.copyfile(artifacts / "scale-comparison.png", DOCS_SHOT)
    assert (artifacts / "scale-comparison.png").stat().st_size < 300_000

    # the page legend hides a run in every figure, and shows it again
    browser.find_element(
        "css selector", f"#legend .legend-item[data-run-id='{live.ids['runs']['hyperp-d12']}']"
    ).click()
    wait_for(browser, lambda d: lines(fig(d, "fig-loss"))[1].get("visible") is False)
    assert lines(fig(browser, "fig-attention_z"))[1]["visible"] is False
    browser.find_element(
        "css selector", f"#legend .legend-item[data-run-id='{live.ids['runs']['hyperp-d12']}']"
    ).click()
    wait_for(browser, lambda d: lines(fig(d, "fig-loss"))[1].get("visible") is True)
    # controls: log y
    browser.find_element("id", "log-y").click()
    wait_for(browser, lambda d: fig(d, "fig-mlp_rms")["layout"]["yaxis"]["type"] == "log")
    browser.find_element("id", "log-y").click()
    wait_for(browser, lambda d: fig(d, "fig-mlp_rms")["layout"]["yaxis"]["type"] == "linear")
    # EMA smoothing changes y and switching it off restores the raw values exactly
    raw = lines(fig(browser, "fig-loss"))[0]["y"]
    browser.find_element("id", "ema").click()
    wait_for(browser, lambda d: lines(fig(d, "fig-loss"))[0]["y"] != raw)
    smooth = lines(fig(browser, "fig-loss"))[0]["y"]
    assert smooth[0] == pytest.approx(raw[0]) and not math.isclose(smooth[-1], raw[-1])
    browser.find_element("id", "ema").click()
    wait_for(browser, lambda d: lines(fig(d, "fig-loss"))[0]["y"] == raw)
    # x-axis: tokens, then fraction of training
    x_step = lines(az)[0]["x"][:3]
    browser.find_element("css selector", "#x-axis option[value=tokens]").click()
    wait_for(browser, lambda d: lines(fig(d, "fig-attention_z"))[0]["x"][:3] != x_step)
    wait_ready(browser)
    assert lines(fig(browser, "fig-attention_z"))[0]["x"][:3] == [4096 * 8 * k for k in (1, 2, 3)]
    assert fig(browser, "fig-attention_z")["layout"]["xaxis"]["title"]["text"] == "training tokens"
    browser.find_element("css selector", "#x-axis option[value=fraction]").click()
    wait_for(browser, lambda d: fig(d, "fig-attention_z")["layout"]["xaxis"]["title"]["text"] == "fraction of training")
    wait_ready(browser)
    assert max(lines(fig(browser, "fig-loss"))[0]["x"]) == pytest.approx(1.0)
    # layers: max over layers
    browser.find_element("css selector", "#agg option[value=max]").click()
    wait_for(browser, lambda d: "max over layers" in fig(d, "fig-attention_z")["layout"]["title"]["text"])
    wait_ready(browser)
    assert console_errors(browser) == []
    screenshot(browser, artifacts / "scale-comparison-controls.png")


def test_scale_comparison_escapes_names(live: Live, browser: Any, artifacts: Path) -> None:
    load(browser, f"{live.base}/groups/{live.ids['xss_group_id']}")
    az = fig(browser, "fig-attention_z")
    assert [t["name"] for t in lines(az)] == ["d=4 · 45.4M", "&lt;img src=x onerror=alert(1)&gt;"]
    legend = browser.execute_script(
        "return Array.from(document.querySelectorAll('#legend .legend-item')).map(t => t.textContent)"
    )
    assert legend == ["d=4 · 45.4M", XSS_NAME]  # the name shows as written, as text
    hover = browser.execute_script(
        "const d = document.getElementById('fig-attention_z');"
        "Plotly.Fx.hover(d, [{curveNumber: 1, pointNumber: 3}]);"
        "return Array.from(d.querySelectorAll('.hovertext')).map(t => t.textContent).join(' ');"
    )
    assert XSS_NAME in hover  # plotly decodes the escaped name into text in its hover label
    no_injected_nodes(browser)
    # the XSS run has neither tokens nor total_steps: on x=fraction it is named, as text, among the
    # runs not drawn
    browser.find_element("css selector", "#x-axis option[value=fraction]").click()
    wait_for(browser, lambda d: XSS_NAME in d.find_element("id", "missing-attention_z").text)
    no_injected_nodes(browser)
    assert browser.execute_script("return window.__xss") == 0
    screenshot(browser, artifacts / "scale-comparison-xss.png")


def test_run_page(live: Live, browser: Any, artifacts: Path) -> None:
    rid = live.ids["runs"]["hyperp-d20"]
    load(browser, f"{live.base}/runs/{rid}?name=attention_z&step={NAN_STEP}")
    assert browser.find_element("id", "run-title").text == "web/hyperp-d20"
    line = fig(browser, "fig-attention_z")
    assert [t["name"] for t in lines(line)] == ["mean over layers", "max over layers"]
    assert line["layout"]["shapes"][0]["x0"] == NAN_STEP  # the linked point is marked
    alerts = next(t for t in line["data"] if t.get("meta", {}).get("alerts"))
    assert alerts["customdata"] == [NAN_STEP]
    heat = fig(browser, "heat-attention_z")
    assert heat["data"][0]["type"] == "heatmap" and heat["data"][0]["y"] == [0, 1, 2, 3]
    nan_cells = heat["data"][1]
    assert nan_cells["y"] == [1] and nan_cells["text"] == ["NaN"]
    loss = fig(browser, "fig-loss")
    assert lines(loss)[0]["name"] == "loss" and len(lines(loss)[0]["x"]) == 120
    assert browser.execute_script("return document.getElementById('heat-loss').hidden") is True
    assert len(lines(fig(browser, "fig-lr"))) == 1
    # x-axis tokens and log y
    browser.find_element("css selector", "#x-axis option[value=tokens]").click()
    wait_for(browser, lambda d: fig(d, "fig-loss")["layout"]["xaxis"]["title"]["text"] == "training tokens")
    wait_ready(browser)
    assert lines(fig(browser, "fig-loss"))[0]["x"][0] == 4096 * 20
    browser.find_element("id", "log-y").click()
    wait_for(browser, lambda d: fig(d, "fig-loss")["layout"]["yaxis"]["type"] == "log")
    screenshot(browser, artifacts / "run.png")


def test_run_page_escapes_names_and_config(live: Live, browser: Any, artifacts: Path) -> None:
    load(browser, f"{live.base}/runs/{live.ids['xss_run_id']}")
    assert browser.find_element("id", "run-title").text == f"web/{XSS_NAME}"
    cells = browser.execute_script("return Array.from(document.querySelectorAll('#config td')).map(t => t.textContent)")
    assert "evil" in cells and f'"{XSS_NAME}"' in cells and XSS_TAG in cells
    no_injected_nodes(browser)
    title = browser.execute_script("return document.title")
    assert title.startswith(XSS_NAME)
    screenshot(browser, artifacts / "run-xss.png")


def test_sweeps_page(live: Live, browser: Any, artifacts: Path) -> None:
    gid = live.ids["sweep_group_id"]
    load(browser, f"{live.base}/groups/{gid}/sweeps")
    lr = fig(browser, "fig-lr")
    stars = [t for t in lr["data"] if t.get("meta", {}).get("optimum")]
    assert len(stars) == 2 * len(SWEEP_DEPTHS)  # one fitted optimum per (method, depth) sweep
    d8 = next(s for s in stars if s["name"].startswith("d=8") and "hyperp" in s["name"])
    assert d8["x"][0] == pytest.approx(0.02, rel=0.02)
    depth_law = fig(browser, "fig-transfer_depth")
    fits = [t for t in depth_law["data"] if t.get("meta", {}).get("exponent") is not None]
    assert len(fits) == 2 and all(t["meta"]["exponent"] == pytest.approx(-0.5, abs=0.02) for t in fits)
    assert len(fig(browser, "fig-scaling")["data"]) == 4  # two methods: points and law each
    assert browser.execute_script("return document.getElementById('fig-leverage')") is None
    # choose a baseline: the leverage curve of hyperp over muon appears, above 1
    browser.find_element("css selector", "#baseline option[value=muon]").click()
    wait_for(browser, lambda d: d.execute_script("return !!(document.getElementById('fig-leverage') || {}).data"))
    wait_ready(browser)
    lev = fig(browser, "fig-leverage")
    curve = lines(lev)[0]
    assert "hyperp" in curve["name"] and all(v is None or v > 1 for v in curve["y"])
    assert console_errors(browser) == []
    screenshot(browser, artifacts / "sweeps.png")


def test_alerts_page(live: Live, browser: Any, artifacts: Path) -> None:
    load(browser, f"{live.base}/alerts")
    timeline = fig(browser, "timeline")
    ys = [y for t in timeline["data"] for y in t["y"]]
    assert "web/hyperp-d20" in ys and f"web/{XSS_NAME}".replace("<", "&lt;").replace(">", "&gt;") in ys
    links = browser.execute_script("return Array.from(document.querySelectorAll('a.point-link')).map(a => a.href)")
    rid = live.ids["runs"]["hyperp-d20"]
    assert f"{live.base}/runs/{rid}?name=attention_z&step={NAN_STEP}" in links
    messages = browser.execute_script(
        "return Array.from(document.querySelectorAll('#alerts-table td:last-child')).map(t => t.textContent)"
    )
    assert XSS_NAME in messages
    no_injected_nodes(browser)
    # filter by run
    browser.find_element("name", "run_id").send_keys(str(rid))
    browser.find_element("css selector", "#filters button").click()
    wait_for(browser, lambda d: len(d.find_elements("css selector", "#alerts-table tbody tr")) == 1)
    wait_ready(browser)
    assert [y for t in fig(browser, "timeline")["data"] for y in t["y"]] == ["web/hyperp-d20"]
    screenshot(browser, artifacts / "alerts.png")
    # following the link opens the point on the run page
    browser.find_element("css selector", "a.point-link").click()
    wait_ready(browser)
    assert fig(browser, "fig-attention_z")["layout"]["shapes"][0]["x0"] == NAN_STEP


def test_pages_ask_for_the_read_token(live_with_read_token: Live, browser: Any, artifacts: Path) -> None:
    base = live_with_read_token.base
    browser.get(f"{base}/runs")
    wait_for(browser, lambda d: d.find_element("id", "token-form").is_displayed())
    assert "read token" in browser.find_element("id", "status").text
    browser.find_element("id", "token-input").send_keys(READ_TOKEN)
    browser.find_element("css selector", "#token-form button").click()
    wait_ready(browser)
    names = browser.execute_script("return Array.from(document.querySelectorAll('a.run-name')).map(a => a.textContent)")
    assert names == ["private-run"]
    screenshot(browser, artifacts / "runs-read-token.png")
    browser.execute_script("sessionStorage.clear()")
    console_errors(browser)  # the first 401s are expected in the log; drop them
