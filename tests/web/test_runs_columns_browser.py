"""The runs table's extra columns (issue 35), in headless Chromium against a real service: pick a config
key as a column, sort by it and by min loss (numbers as numbers; NaN/Inf shown as such and after the
numbers; missing as "—" and last), filter with an expression that says what is wrong when it is,
show archived runs with their badge; the choice kept in the URL and in localStorage."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hyperwatch.hooks.schema import Point
from tests.web.browser import console_errors, screenshot, wait_for, wait_ready
from tests.web.conftest import Live, _live

pytestmark = pytest.mark.slow

RUNS: dict[str, tuple[dict[str, Any], list[float]]] = {
    # name: (config, loss per step)
    "alpha": ({"lr": 1e-3, "batch_size": 32, "optim": {"arm": "hyperp"}, "model": {"depth": 4}}, [3.0, 1.5, 1.7]),
    "beta": ({"lr": 3e-4, "batch_size": 64, "optim": {"arm": "adamw"}, "model": {"depth": 8}}, [2.5, 1.9, 1.2, 1.3]),
    "gamma": ({"lr": 3e-3, "optim": {"arm": "hyperp"}}, [2.8, 2.0, math.nan]),
    "delta": ({"lr": math.inf, "optim": {"arm": "sgd"}}, []),
    "epsilon": ({"batch_size": 16}, []),
    "zeta": ({"lr": 1e-2, "optim": {"arm": "hyperp"}}, [1.0, 0.5, 0.6]),  # archived
}


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    for lv in _live(tmp_path_factory.mktemp("runs-columns")):
        for name, (config, losses) in RUNS.items():
            run, _ = lv.store.upsert_run("cols", name, {"config": config, "status": "finished"})
            pts = [Point("loss", s, v) for s, v in enumerate(losses)]
            if name == "beta":
                pts.append(Point("val_loss", 3, 1.4))
            if pts:
                lv.store.ingest(run.id, uuid.uuid4().hex, pts)
            lv.ids[name] = run.id
        lv.store.update_run(lv.ids["zeta"], {"archived": True})
        yield lv


ROWS = """return Array.from(document.querySelectorAll('#runs-table tbody tr')).map((tr) => ({
  name: tr.querySelector('a.run-name').textContent,
  archived: !!tr.querySelector('.badge.archived'),
  cells: Object.fromEntries(
    Array.from(tr.querySelectorAll('td[data-col]')).map((td) => [td.dataset.col, td.textContent])),
}));"""


def _rows(driver: Any) -> list[dict[str, Any]]:
    return list(driver.execute_script(ROWS))


def _names(driver: Any) -> list[str]:
    return [r["name"] for r in _rows(driver)]


def _column(driver: Any, col: str) -> list[str]:
    return [r["cells"].get(col) for r in _rows(driver)]


def _sort(driver: Any, col: str) -> None:
    driver.execute_script(f"document.querySelector('#runs-table th[data-key=\"{col}\"]').click()")


def _filter(driver: Any, text: str) -> None:
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element("id", "run-filter")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.BACKSPACE)  # typed, as a user does (clear() sends no input event)
    if text:
        box.send_keys(text)
    wait_for(driver, lambda d: d.execute_script("return document.getElementById('run-filter').value") == text, 10)


def _error(driver: Any) -> str:
    return str(driver.find_element("id", "filter-error").text)


def test_config_and_summary_columns_sort_filter_and_archived(svc: Live, browser: Any, artifacts: Path) -> None:
    browser.set_window_size(1600, 1000)
    browser.get("about:blank")
    console_errors(browser)
    browser.get(f"{svc.base}/runs")
    wait_ready(browser)
    wait_for(browser, lambda d: len(_names(d)) == 5, 30)
    headers = browser.execute_script(
        "return Array.from(document.querySelectorAll('#runs-table th.extra')).map((th) => th.dataset.key)"
    )
    # by default the loss summaries, and val_loss because one run logged it
    assert headers == ["summary.loss.last", "summary.loss.min", "summary.loss.min_step", "summary.val_loss.last"]
    assert "zeta" not in _names(browser)  # archived: hidden

    # the picker lists the config keys of the listed runs, flattened with dots
    browser.execute_script("document.getElementById('columns-picker').open = true")
    keys = browser.execute_script(
        "return Array.from(document.querySelectorAll('#columns-config input')).map((i) => i.dataset.col)"
    )
    assert keys == ["config.batch_size", "config.lr", "config.model.depth", "config.optim.arm"]
    browser.find_element("css selector", "#columns-config input[data-col='config.lr']").click()
    browser.find_element("css selector", "#columns-config input[data-col='config.optim.arm']").click()
    wait_for(browser, lambda d: d.find_elements("css selector", "#runs-table th[data-key='config.lr']"), 10)
    assert "col=config.lr" in browser.current_url and "col=config.optim.arm" in browser.current_url

    # sort by lr: numbers as numbers both ways, +Inf after them, missing last
    _sort(browser, "config.lr")
    assert _names(browser) == ["beta", "alpha", "gamma", "delta", "epsilon"]
    assert _column(browser, "config.lr") == ["0.0003", "0.001", "0.003", "+Inf", "—"]
    _sort(browser, "config.lr")
    assert _names(browser) == ["gamma", "alpha", "beta", "delta", "epsilon"]

    # sort by min loss; its step beside it; a NaN last loss shown as NaN
    _sort(browser, "summary.loss.min")
    assert _names(browser) == ["beta", "alpha", "gamma", "delta", "epsilon"]
    assert _column(browser, "summary.loss.min") == ["1.2", "1.5", "2", "—", "—"]
    assert _column(browser, "summary.loss.min_step") == ["2", "1", "1", "—", "—"]
    assert _column(browser, "summary.loss.last") == ["1.3", "1.7", "NaN", "—", "—"]
    assert _column(browser, "summary.val_loss.last") == ["1.4", "—", "—", "—", "—"]

    # filters: numbers compare as numbers (+Inf is above 1e-3), text by equality
    _filter(browser, "lr>1e-3")
    wait_for(browser, lambda d: _names(d) == ["gamma", "delta"], 10)
    _filter(browser, "optim.arm=hyperp")
    wait_for(browser, lambda d: _names(d) == ["alpha", "gamma"], 10)
    _filter(browser, "optim.arm=hyperp, loss.min<1.8")
    wait_for(browser, lambda d: _names(d) == ["alpha"], 10)
    assert _error(browser) == ""
    assert "q=optim.arm" in browser.current_url
    # a wrong filter filters nothing and says what is wrong
    _filter(browser, "lrr>1")
    wait_for(browser, lambda d: 'no column "lrr"' in _error(d), 10)
    assert "config keys here: batch_size, lr, model.depth, optim.arm" in _error(browser)
    assert len(_names(browser)) == 5
    _filter(browser, "optim.arm>adamw")
    wait_for(browser, lambda d: "compares numbers" in _error(d), 10)
    _filter(browser, "lr")
    wait_for(browser, lambda d: "write KEY OP VALUE" in _error(d), 10)
    _filter(browser, "optim.arm=hyperp")
    wait_for(browser, lambda d: _error(d) == "" and _names(d) == ["alpha", "gamma"], 10)

    # show archived: the archived run comes with its badge
    browser.find_element("name", "archived").click()
    wait_for(browser, lambda d: "zeta" in _names(d), 15)
    rows = _rows(browser)
    assert [(r["name"], r["archived"]) for r in rows] == [("zeta", True), ("alpha", False), ("gamma", False)]
    assert rows[0]["cells"]["summary.loss.min"] == "0.5" and rows[0]["cells"]["config.lr"] == "0.01"
    assert "archived=1" in browser.current_url
    _filter(browser, "")
    wait_for(browser, lambda d: len(_names(d)) == 6, 10)
    screenshot(browser, artifacts / "runs_columns.png")

    # the state comes back from the URL; the column choice alone from localStorage
    browser.get(browser.current_url)
    wait_ready(browser)
    wait_for(browser, lambda d: len(_names(d)) == 6, 30)
    assert _names(browser)[0] == "zeta" and _column(browser, "config.optim.arm")[0] == "hyperp"
    browser.get(f"{svc.base}/runs")
    wait_ready(browser)
    wait_for(browser, lambda d: len(_names(d)) == 5, 30)
    cols = browser.execute_script(
        "return Array.from(document.querySelectorAll('#runs-table th.extra')).map((th) => th.dataset.key)"
    )
    assert "config.lr" in cols and "config.optim.arm" in cols
    assert console_errors(browser) == []
