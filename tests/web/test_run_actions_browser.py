"""The run page's Archive / Unarchive and Delete (issue 35): a confirmation dialog that asks for the write
token (the pages read with the read token only) and, to delete, the run's name typed; in headless
Chromium against a real service."""

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


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    yield from _live(tmp_path_factory.mktemp("run-actions"))


def _run(c: httpx.Client, name: str) -> int:
    run_id = int(c.post("/api/v1/runs", json={"name": name, "group": "g"}).json()["id"])
    pts = [{"name": "loss", "step": s, "value": 3.0 - 0.1 * s} for s in range(3)]
    c.post("/api/v1/points", json={"batch_id": uuid.uuid4().hex, "run": name, "points": pts}).raise_for_status()
    return run_id


def _visible(selector: str) -> Any:
    return lambda d: d.execute_script(
        f"const e = document.querySelector('{selector}'); return !!e && !e.hidden && e.offsetParent !== null;"
    )


def _confirm(driver: Any, button: str, name: str | None = None, token: str | None = None) -> None:
    driver.execute_script(f"document.getElementById('{button}').click()")
    wait_for(driver, lambda d: d.execute_script("return document.getElementById('run-action-dialog').open"), 10)
    for field, value in (("run-action-name", name), ("run-action-token", token)):
        if value is not None:
            driver.find_element("id", field).send_keys(value)
    driver.execute_script("document.getElementById('run-action-confirm').click()")


def _closed(d: Any) -> bool:
    # the service commits before the page hears back: wait for the dialog the page closes on its answer
    return bool(d.execute_script("return !document.getElementById('run-action-dialog').open"))


def test_archive_unarchive_and_delete_from_the_run_page(svc: Live, browser: Any, artifacts: Path) -> None:
    c = httpx.Client(base_url=svc.base, headers={"Authorization": f"Bearer {WRITE_TOKEN}"}, timeout=30)
    keep, scratch = _run(c, "keep"), _run(c, "scratch")
    # leave the page an earlier test left open (its live stream may fail once its service stops), then
    # forget what it logged: the errors counted below are this page's
    browser.get("about:blank")
    console_errors(browser)
    browser.get(f"{svc.base}/runs/{scratch}")
    wait_ready(browser)
    wait_for(browser, _visible("#run-actions"), 30)

    _confirm(browser, "run-archive", token=WRITE_TOKEN)
    wait_for(browser, lambda _d: c.get(f"/api/v1/runs/{scratch}").json()["archived"], 10)
    wait_for(browser, _visible("#run-archived-note"), 10)
    wait_for(browser, _closed, 10)
    assert browser.find_element("id", "run-archive").text == "Unarchive"
    assert [r["name"] for r in c.get("/api/v1/runs").json()] == ["keep"]
    screenshot(browser, artifacts / "run_archived.png")

    # the write token is asked once per page; unarchive needs no other input
    _confirm(browser, "run-archive")
    wait_for(browser, lambda _d: not c.get(f"/api/v1/runs/{scratch}").json()["archived"], 10)
    wait_for(browser, _closed, 10)
    wait_for(browser, lambda d: d.find_element("id", "run-archive").text == "Archive", 10)
    assert [r["name"] for r in c.get("/api/v1/runs").json()] == ["keep", "scratch"]

    # delete: the dialog stays open until the run's name is typed
    _confirm(browser, "run-delete", name="keep")
    error = wait_for(browser, lambda d: d.find_element("id", "run-action-error").text, 10)
    assert "scratch" in error
    assert browser.execute_script("return document.getElementById('run-action-dialog').open")
    assert c.get(f"/api/v1/runs/{scratch}").status_code == 200
    browser.find_element("id", "run-action-name").clear()
    browser.find_element("id", "run-action-name").send_keys("scratch")
    browser.execute_script("document.getElementById('run-action-confirm').click()")
    wait_for(browser, lambda d: d.current_url.rstrip("/").endswith("/runs"), 15)
    assert c.get(f"/api/v1/runs/{scratch}").status_code == 404
    assert [r["id"] for r in c.get("/api/v1/runs", params={"include_archived": "true"}).json()] == [keep]
    assert console_errors(browser) == []
