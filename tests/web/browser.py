"""Headless Debian Chromium through Selenium and /usr/bin/chromedriver (nothing is downloaded)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = os.environ.get("HYPERWATCH_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("HYPERWATCH_CHROMEDRIVER", "/usr/bin/chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-dev-shm-usage",
)


def missing_browser() -> str | None:
    """Why the browser cannot run here (None when it can)."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return f"{path} is missing: run `bash scripts/system-deps.sh` (Debian chromium, chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is missing: .venv/bin/pip install selenium"
    return None


@contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A Selenium driver on a fresh profile; the browser log (console) is readable with get_log."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="hw-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile}")
    opts.add_argument(f"--window-size={width},{height}")
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    # Count alert() calls on every page, before its scripts run: an XSS payload would call it.
    driver.execute_cdp_cmd(
        "Page.addScriptToEvaluateOnNewDocument",
        {"source": "window.__xss = 0; window.alert = () => { window.__xss++; };"},
    )
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_ready(driver: Any, timeout: float = 60.0) -> None:
    """Wait until the page says every figure it started is drawn (body[data-ready="1"])."""
    wait_for(driver, lambda d: d.execute_script("return document.body && document.body.dataset.ready") == "1", timeout)


def wait_for(driver: Any, cond: Callable[[Any], Any], timeout: float = 60.0) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(cond)


def console_errors(driver: Any) -> list[str]:
    """SEVERE entries of the browser console since the last call (failed requests included)."""
    return [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def screenshot(driver: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
    return path


def reload_ready(driver: Any, url: str, timeout: float = 60.0) -> float:
    """Navigate, wait for every figure; returns seconds from navigation start to all figures drawn."""
    driver.get(url)
    wait_ready(driver, timeout)
    time.sleep(0)  # let the last restyle settle before measuring
    return float(driver.execute_script("return window.hwReadyAt / 1000"))
