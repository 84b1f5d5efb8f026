"""Screenshots of every page of a running HyperWatch (a demo, typically), in headless Chromium.

    .venv/bin/python scripts/screenshots.py --url http://127.0.0.1:8000 --out /tmp/screens

Finds what to show through the API: /runs, the run with the most alerts (its charts carry the
alert markers), /alerts, each group's scale page and the sweeps page of the group with alerts,
and /docs. Each page is captured whole (the window grows to the page's height), once its figures
say they are drawn (``body[data-ready="1"]``). Uses the tests' browser helper (Debian chromium and
chromedriver, nothing downloaded: ``bash scripts/system-deps.sh``).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.web.browser import chromium, missing_browser, wait_for

WIDTH = 1400


def api(url: str, path: str) -> Any:
    with urllib.request.urlopen(f"{url}{path}", timeout=30) as resp:
        return json.loads(resp.read())


def pages(url: str) -> list[tuple[str, str]]:
    """(file name, path) of each page worth a picture, discovered through the API."""
    groups = api(url, "/api/v1/groups")
    alerts = api(url, "/api/v1/alerts?limit=1000")
    out = [("runs", "/runs")]
    by_run = Counter(a["run_id"] for a in alerts)
    if by_run:
        run_id = by_run.most_common(1)[0][0]
        out.append((f"run-{run_id}-with-alerts", f"/runs/{run_id}"))
    out.append(("alerts", "/alerts"))
    alerted = {a["run"] for a in alerts}
    for g in groups:
        out.append((f"scale-{g['name']}", f"/groups/{g['id']}"))
    runs = api(url, "/api/v1/runs")
    noisy = [g for g in groups if any(r["name"] in alerted and r.get("group") == g["name"] for r in runs)]
    for g in noisy or groups[:1]:
        out.append((f"sweeps-{g['name']}", f"/groups/{g['id']}/sweeps"))
    out.append(("docs", "/docs"))
    return out


def capture(driver: Any, url: str, path: Path, timeout: float) -> str:
    """Load, wait for the figures (or the Swagger UI), grow the window to the page, save a PNG."""
    from selenium.common.exceptions import TimeoutException

    driver.set_window_size(WIDTH, 1000)
    driver.get(url)
    ready = "return document.body && document.body.dataset.ready === '1' || !!document.querySelector('.opblock')"
    note = ""
    try:
        wait_for(driver, lambda d: d.execute_script(ready), timeout)
    except TimeoutException:
        note = f" (not ready after {timeout:.0f} s; captured as it was)"
    height = int(driver.execute_script("return Math.max(document.body.scrollHeight, 600)"))
    driver.set_window_size(WIDTH, min(height + 140, 12000))
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
    return note


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the running service (pages and API)")
    p.add_argument("--out", default="screens", help="folder for the PNG files")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for a page's figures")
    args = p.parse_args(argv)
    missing = missing_browser()
    if missing:
        print(f"screenshots: {missing}", file=sys.stderr)
        return 2
    url = args.url.rstrip("/")
    try:
        todo = pages(url)
    except OSError as exc:
        print(f"screenshots: cannot read {url}/api/v1 ({exc}); is the service (make demo) running?", file=sys.stderr)
        return 2
    out = Path(args.out)
    with chromium(width=WIDTH) as driver:
        for name, path in todo:
            note = capture(driver, url + path, out / f"{name}.png", args.timeout)
            print(f"{out / f'{name}.png'}  <- {path}{note}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
