"""The scale page's size axis says what it plots, and runs of different lengths at one size get no
verdict (through the page data on SQLite, as the scale page reads it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store import SqlStore, migrate
from hyperwatch.web.scale import size_axis
from tests.web.test_figures import run
from tests.web.test_pages import client


def test_parameters_when_every_run_has_them_else_depth_labelled_so() -> None:
    sized = [run(1, depth=2, total_params=10**6, last_step=9), run(2, depth=4, total_params=4 * 10**6, last_step=9)]
    axis = size_axis(sized)
    assert axis.label == "model size (parameters)" and axis.of(sized[1]) == 4e6
    hooks_runs = [run(1, depth=2, last_step=9), run(2, depth=4, last_step=9)]  # no parameter count
    axis = size_axis(hooks_runs)
    assert axis.label.startswith("depth") and "parameter" not in axis.label.split(";")[0]
    assert axis.of(hooks_runs[1]) == 4.0 and axis.blocker is None


def test_runs_of_different_lengths_at_one_size_block_the_verdict() -> None:
    runs = [
        run(1, depth=2, status="finished", last_step=99),
        run(2, depth=3, status="finished", last_step=99),
        run(3, depth=3, status="finished", last_step=399),
    ]
    blocker = size_axis(runs).blocker
    assert blocker is not None and "different lengths at depth 3" in blocker and "r3: 400 steps" in blocker
    running = [run(1, depth=3, status="running", last_step=40), run(2, depth=3, status="running", last_step=55)]
    assert size_axis(running).blocker is None  # not finished, no total_steps: lengths unknown yet


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    s = SqlStore(f"sqlite:///{tmp_path / 'scale.db'}")
    migrate.upgrade(s.engine)
    for name, depth, steps, peak in (("short-d2", 2, 100, 10.0), ("short-d3", 3, 100, 10.0), ("long-d3", 3, 400, 30.0)):
        r, _ = s.upsert_run("p", name, {"group": "g", "depth": depth})
        s.ingest(
            r.id, f"b-{name}", [Point("attention_z", i, peak if i == steps - 1 else 1.0, layer=0) for i in range(steps)]
        )
        s.update_run(r.id, {"status": "finished"})
    yield s
    s.close()


def test_the_scale_page_gives_no_breaks_at_3_for_a_longer_run_at_depth_3(store: SqlStore) -> None:
    c: TestClient = client(store)
    body = c.get("/ui/data/groups/1/compare", params={"name": "attention_z"}).json()
    stability = body["stability"]
    assert stability["meta"]["verdict"] is None  # before: "breaks at 3" (the longer run's peak)
    assert "different lengths at depth 3" in stability["meta"]["reason"]
    assert stability["layout"]["xaxis"]["title"]["text"].startswith("depth")  # it plots depth, says depth
