"""Live pages in headless Chromium against a real service: a run page, a scale (group) page and a
comparison page draw new points while a run streams them over HTTP (the wire format the hooks'
HTTP sink posts), without fetching a figure again; the comparison spans two groups and projects.
Screenshots go to test-artifacts/web/ (and /work/notes/shots/ when that folder exists)."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.web.browser import console_errors, screenshot, wait_for, wait_ready
from tests.web.conftest import WRITE_TOKEN, Live, _live

pytestmark = pytest.mark.slow
LAYERS = 4
SHOTS = Path("/work/notes/shots")


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    yield from _live(tmp_path_factory.mktemp("live"))


class Streamer:
    """A run being written: create it, then post steps as the hooks' HTTP sink would."""

    def __init__(self, base: str, name: str, project: str, group: str, depth: int) -> None:
        self.c = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {WRITE_TOKEN}"}, timeout=30)
        self.name, self.project, self.depth = name, project, depth
        r = self.c.post("/api/v1/runs", json={"name": name, "project": project, "group": group, "depth": depth,
                                              "total_steps": 100, "tokens": 100 * 4096})  # fmt: skip
        r.raise_for_status()
        self.id = int(r.json()["id"])

    def z(self, step: int, layer: int) -> float:
        return 20.0 + self.depth * 2 + step * 0.5 + layer

    def steps(self, steps: range, nan_loss_at: int | None = None) -> None:
        pts: list[dict[str, Any]] = []
        for s in steps:
            tok = 4096 * (s + 1)
            pts += [{"name": "attention_z", "layer": la, "step": s, "tokens": tok, "value": self.z(s, la)}
                    for la in range(LAYERS)]  # fmt: skip
            loss: float | str = "NaN" if s == nan_loss_at else 5.0 - 0.01 * s
            pts.append({"name": "loss", "layer": None, "step": s, "tokens": tok, "value": loss})
        body = {"batch_id": uuid.uuid4().hex, "run": self.name, "points": pts}
        self.c.post("/api/v1/points", params={"project": self.project}, json=body).raise_for_status()

    def finish(self) -> None:
        self.c.patch(f"/api/v1/runs/{self.id}", json={"status": "finished"}).raise_for_status()


def last_x(driver: Any, div_id: str, trace: int = 0) -> Any:
    return driver.execute_script(
        "const d = document.getElementById(arguments[0]); if (!d || !d.data || !d.data[arguments[1]]) return null;"
        "const x = d.data[arguments[1]].x; return x.length ? x[x.length - 1] : null;",
        div_id,
        trace,
    )


def figure_fetches(driver: Any) -> int:
    """How many figure reads (/ui/data/...) the page has made: a live page makes none after its first draw."""
    return int(
        driver.execute_script(
            "return performance.getEntriesByType('resource').filter(e => e.name.includes('/ui/data/')).length"
        )
    )


def trace_of(driver: Any, div_id: str, run_id: int) -> dict[str, Any]:
    out: dict[str, Any] = driver.execute_script(
        "const d = document.getElementById(arguments[0]);"
        "const t = d.data.find(t => t.meta && t.meta.smooth && t.meta.run_id === arguments[1]);"
        "return t ? {x: t.x, y: t.y, name: t.name} : null;",
        div_id,
        run_id,
    )
    return out


def shot(driver: Any, artifacts: Path, name: str) -> None:
    path = screenshot(driver, artifacts / name)
    if SHOTS.is_dir():
        shutil.copy(path, SHOTS / name)


def test_run_page_updates_while_the_run_streams(svc: Live, browser: Any, artifacts: Path) -> None:
    run = Streamer(svc.base, "live-run", "p-live", "g-live", 4)
    run.steps(range(0, 10))
    console_errors(browser)
    browser.get(f"{svc.base}/runs/{run.id}")
    wait_ready(browser)
    assert last_x(browser, "fig-loss") == 9 and last_x(browser, "fig-attention_z", 1) == 9
    fetched = figure_fetches(browser)
    run.steps(range(10, 20), nan_loss_at=15)
    wait_for(browser, lambda d: last_x(d, "fig-loss") == 19 and last_x(d, "fig-attention_z", 1) == 19, 20)
    wait_for(browser, lambda d: last_x(d, "heat-attention_z") == 19, 20)
    # mean and max over layers of the new steps, as the API gives them
    z = browser.execute_script("return document.getElementById('fig-attention_z').data.slice(0, 2).map(t => t.y)")
    assert z[0][-1] == pytest.approx(sum(run.z(19, la) for la in range(LAYERS)) / LAYERS)
    assert z[1][-1] == pytest.approx(run.z(19, LAYERS - 1))
    # the NaN loss: a gap in the line, a red marker, and the nan_loss alert's diamond
    loss = browser.execute_script("return document.getElementById('fig-loss').data")
    line = loss[0]
    assert line["y"][line["x"].index(15)] is None
    assert any(t.get("meta", {}).get("nonfinite") and 15 in t["x"] and "NaN" in t["text"] for t in loss)
    wait_for(
        browser,
        lambda d: d.execute_script(
            "return document.getElementById('fig-loss').data"
            ".some(t => t.meta && t.meta.alerts && t.customdata.includes(15))"
        ),
        20,
    )
    # one request streams the answers (GET /api/v1/live/stream): a step at a time, each drawn
    counts = "return [document.body.dataset.livePolls, document.body.dataset.liveStreams].map(Number)"
    answers, streams = browser.execute_script(counts)
    for step in range(20, 24):
        run.steps(range(step, step + 1))
        wait_for(browser, lambda d, s=step: last_x(d, "fig-loss") == s, 20)
    more, opened = browser.execute_script(counts)
    assert more - answers >= 4 and opened - streams <= 1, (answers, more, streams, opened)
    # status and last step follow the run
    wait_for(browser, lambda d: "last step 23" in d.find_element("id", "run-meta").text, 20)
    run.finish()
    wait_for(browser, lambda d: "status finished" in d.find_element("id", "run-meta").text, 20)
    assert figure_fetches(browser) == fetched  # only the live deltas travelled, never a figure again
    assert console_errors(browser) == []
    shot(browser, artifacts, "live-run-page.png")
    # a reload draws the same line the live page built
    live_loss = browser.execute_script("return document.getElementById('fig-loss').data[0].y")
    browser.get(f"{svc.base}/runs/{run.id}?live=0")
    wait_ready(browser)
    reloaded = browser.execute_script("return document.getElementById('fig-loss').data[0].y")
    assert reloaded == live_loss


def test_group_page_updates_while_a_run_streams(svc: Live, browser: Any) -> None:
    a = Streamer(svc.base, "ga-d2", "p-group", "ladder-live", 2)
    b = Streamer(svc.base, "ga-d4", "p-group", "ladder-live", 4)
    a.steps(range(0, 8))
    b.steps(range(0, 8))
    gid = httpx.get(f"{svc.base}/api/v1/runs/{a.id}").json()["group_id"]
    browser.get(f"{svc.base}/groups/{gid}")
    wait_ready(browser)
    assert trace_of(browser, "fig-attention_z", b.id)["x"][-1] == 7
    fetched = figure_fetches(browser)
    b.steps(range(8, 16))
    wait_for(browser, lambda d: trace_of(d, "fig-attention_z", b.id)["x"][-1] == 15, 20)
    wait_for(browser, lambda d: trace_of(d, "fig-loss", b.id)["x"][-1] == 15, 20)
    assert trace_of(browser, "fig-attention_z", a.id)["x"][-1] == 7  # the other run did not move
    assert figure_fetches(browser) == fetched
    assert console_errors(browser) == []


def test_comparison_across_two_groups_is_live_and_shareable(svc: Live, browser: Any, artifacts: Path) -> None:
    a = Streamer(svc.base, "cmp-a", "proj-one", "arm-a", 2)
    b = Streamer(svc.base, "cmp-b", "proj-two", "arm-b", 4)
    a.steps(range(0, 12))
    b.steps(range(0, 6))
    # picked on /runs by checkbox
    browser.get(f"{svc.base}/runs")
    wait_ready(browser)
    for rid in (a.id, b.id):
        browser.find_element("css selector", f"tr[data-run-id='{rid}'] input.pick").click()
    link = browser.find_element("id", "compare-selected")
    assert link.text == "Compare selected (2)"
    link.click()
    wait_ready(browser)
    wait_for(browser, lambda d: d.execute_script("return !!document.getElementById('fig-compare').data"), 20)
    ta, tb = trace_of(browser, "fig-compare", a.id), trace_of(browser, "fig-compare", b.id)
    assert ta["name"] == "proj-one/arm-a/cmp-a" and tb["name"] == "proj-two/arm-b/cmp-b"
    assert tb["x"][-1] == 5
    # layer 3 by tokens: the URL holds the state
    browser.find_element("css selector", "#layer option[value='3']").click()
    wait_for(browser, lambda d: "layer=3" in d.current_url, 10)
    browser.find_element("css selector", "#x-axis option[value='tokens']").click()
    wait_for(browser, lambda d: "x=tokens" in d.current_url, 10)
    wait_ready(browser)
    wait_for(browser, lambda d: trace_of(d, "fig-compare", b.id)["x"][-1] == 4096 * 6, 20)
    assert trace_of(browser, "fig-compare", b.id)["y"][-1] == pytest.approx(b.z(5, 3))
    fetched = figure_fetches(browser)
    b.steps(range(6, 12))
    wait_for(browser, lambda d: trace_of(d, "fig-compare", b.id)["x"][-1] == 4096 * 12, 20)
    assert trace_of(browser, "fig-compare", b.id)["y"][-1] == pytest.approx(b.z(11, 3))
    assert figure_fetches(browser) == fetched
    shot(browser, artifacts, "live-compare-two-groups.png")
    # the shared URL opens the same view
    url = browser.current_url
    browser.get(url)
    wait_ready(browser)
    wait_for(browser, lambda d: d.execute_script("return !!document.getElementById('fig-compare').data"), 20)
    assert browser.find_element("id", "layer").get_attribute("value") == "3"
    assert browser.find_element("id", "x-axis").get_attribute("value") == "tokens"
    assert trace_of(browser, "fig-compare", b.id)["x"][-1] == 4096 * 12
    assert console_errors(browser) == []


def test_comparison_by_filter_and_from_the_runs_page_filter(svc: Live, browser: Any) -> None:
    a = Streamer(svc.base, "f-a", "proj-filter", "arm-x", 2)
    b = Streamer(svc.base, "f-b", "proj-filter", "arm-y", 3)
    a.steps(range(0, 4))
    b.steps(range(0, 4))
    browser.get(f"{svc.base}/compare?project=proj-filter&name=loss")
    wait_ready(browser)
    wait_for(browser, lambda d: d.execute_script("return !!document.getElementById('fig-compare').data"), 20)
    assert trace_of(browser, "fig-compare", a.id) and trace_of(browser, "fig-compare", b.id)
    assert browser.find_element("id", "name").get_attribute("value") == "loss"
    # the URL now names the runs, so it opens the same view once more runs match the filter
    assert f"run_id={a.id}" in browser.current_url and f"run_id={b.id}" in browser.current_url
    # /runs filtered by project: "Compare all shown" links to exactly those runs
    browser.get(f"{svc.base}/runs?project=proj-filter")
    wait_ready(browser)
    href = browser.find_element("id", "compare-shown").get_attribute("href")
    assert sorted(href.split("?", 1)[1].split("&")) == sorted([f"run_id={a.id}", f"run_id={b.id}"])
    assert console_errors(browser) == []


def test_a_page_left_open_stays_bounded_and_keeps_spikes(svc: Live, browser: Any) -> None:
    run = Streamer(svc.base, "long-open", "p-long", "g-long", 2)
    run.steps(range(0, 10))
    browser.get(f"{svc.base}/runs/{run.id}?live=0")
    wait_ready(browser)
    # 20,000 more steps as live deltas, a spike and a NaN among them: the line is thinned by the
    # server's rule (min and max per bucket), so both survive and the trace stays bounded
    out = browser.execute_script(
        """
        const line = document.getElementById('fig-loss'), heat = document.getElementById('heat-attention_z');
        for (let k = 0; k < 20; k++) {
          const x = [], y = [], z = [[], []];
          for (let s = 10 + 1000 * k; s < 10 + 1000 * (k + 1); s++) {
            x.push(s); y.push(s === 12345 ? 99 : (s === 15000 ? 'NaN' : 4 - s * 1e-5)); z[0].push(1); z[1].push(s);
          }
          HW.extendLine(line, 0, {x, y, step: x}, 0.97);
          HW.extendHeat(heat, {x, layers: [0, 1], z});
        }
        const t = line.data[0];
        const h = heat.data[0];
        return {n: t.x.length, limit: line._limit, last: t.x[t.x.length - 1], spike: t.y.includes(99),
                gap: t.y[t.x.indexOf(15000)] === null, heat: h.x.length, top: Math.max(...h.z[1])};
        """
    )
    assert out["n"] <= out["limit"] and out["last"] == 20009
    assert out["spike"] and out["gap"]
    assert out["heat"] <= 600 and out["top"] == 20009  # merged columns keep each layer's max
