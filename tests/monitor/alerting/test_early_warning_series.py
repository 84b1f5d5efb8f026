"""The loss and grad-norm spike rules and the loss shift on series the benchmark recorded, through both alert sources.

Each case takes the run-level loss and grad norm of a run ``bench/early_warning/run.py`` recorded (one
``/metrics`` scrape per logged step, ``tests/monitor/alerting/data/ew_series/``), edited where the case needs
it (a NaN put in, a blip held for a second logged point, a steady climb added), and replays it
(a) through the service, one batch per logged step as the hooks send them, and (b) through
``promtool test rules`` over the same scrapes, with the statistics the service exports for them (in logged
steps; ``tests/monitor/alerting/test_prometheus.py`` checks the service's against the same function). Both
must name the same first step of each rule.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hyperwatch.monitor.thresholds.defaults import DEFAULT_THRESHOLDS
from tests.monitor.conftest import create_run, post_points, promtool

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench" / "early_warning"))

from ew_gauges import with_step_statistics  # noqa: E402
from ew_prom import add_threshold, column_key, from_columns, replay  # noqa: E402

SERIES = Path(__file__).parent / "data" / "ew_series"
LOSS, GRAD = "hyperwatch_run_loss_nats", "hyperwatch_run_grad_norm"
SHIFT = "hyperwatch_run_loss_shift_multiple"
KEEP = (LOSS, GRAD, "hyperwatch_run_sigma_spike_", SHIFT)  # the series these rules read (their gauges included)
RULES = {
    "loss_spike": "HyperWatchLossSpike",
    "loss_shift": "HyperWatchLossShift",
    "grad_norm_spike": "HyperWatchGradNormSpike",
    "nan_loss": "HyperWatchNaNLoss",
}

Columns = dict[str, list[Any]]


def _recorded(name: str) -> tuple[list[int], Columns]:
    rec = json.loads((SERIES / f"{name}.json").read_text())
    cols = {k: list(v) for k, v in rec["series"].items() if k.startswith(KEEP)}
    add_threshold(cols, LOSS, SHIFT, DEFAULT_THRESHOLDS["loss_shift_multiple"])
    return rec["logged_steps"], cols


def _column(cols: Columns, metric: str) -> list[Any]:
    return cols[column_key(cols, metric)]


def _hold_blip(cols: Columns) -> None:
    """The grad norm's tallest point repeated on the next logged point: a blip made persistent."""
    g = _column(cols, GRAD)
    top = max(range(len(g) - 1), key=lambda i: g[i])
    g[top + 1] = g[top]


def _nan_at(index: int) -> Callable[[Columns], None]:
    def edit(cols: Columns) -> None:
        _column(cols, LOSS)[index] = math.nan

    return edit


def _climb(cols: Columns) -> None:
    """A steady climb added to the loss: +0.02 nats per logged point (1 nat over the run)."""
    loss = _column(cols, LOSS)
    for i, v in enumerate(loss):
        loss[i] = v + 0.02 * i


# case -> (recorded run, edit, first step of each rule); rules not named must stay silent
CASES: dict[str, tuple[str, Callable[[Columns], None] | None, dict[str, int]]] = {
    # the bundled trainer's LR x 30 at step 100: the loss jumps at 104 (7.3 sigma of its previous 16
    # points); its grad norm blips at 104 (4.3 sigma of 128) and is back at 108: no grad-norm spike;
    # the loss stays up: the mean of its 6 logged points to 116, their largest left out, is a loss shift
    "lr-bump": ("lr_bump", None, {"loss_spike": 104, "loss_shift": 116}),
    # the same trainer at seed 100: its loss rises ~0.45 nats at the bump (about 2 sigma of its 16
    # previous points, no spike) and stays up: the mean of 6 logged points, their largest left out, is
    # 3.6 standard errors up
    "lr-bump-small": ("lr_bump_small", None, {"loss_shift": 124}),
    # a healthy HF run: a one-point grad-norm blip at 164 (7.4 sigma of 128), the loss unmoved
    "grad-blip": ("grad_blip", None, {}),
    # the same blip held for the next logged point: a grad-norm spike at the second
    "grad-held": ("grad_blip", _hold_blip, {"grad_norm_spike": 168}),
    # a NaN loss at the 30th logged step: NaN alerts, and the NaN never enters a spike's window
    "nan": ("healthy", _nan_at(30), {"nan_loss": 120}),
    # a steady climb of 0.02 nats per logged point (the batch noise is ~0.3) is neither a spike nor,
    # against a loss that still falls, a shift (the growth rules and the loss's departure are another matter)
    "climb": ("healthy", _climb, {}),
    "healthy": ("healthy", None, {}),
}


def _case(name: str) -> tuple[list[int], Columns]:
    run, edit, _ = CASES[name]
    steps, cols = _recorded(run)
    if edit is not None:
        edit(cols)
    # the loss and grad-norm statistics the service exports, in logged steps (the recordings predate them)
    return steps, with_step_statistics(cols, {}, steps)


@pytest.fixture(scope="module")
def prometheus_first(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, int]]:
    """Per case, the first logged step each Prometheus alert fired at (one promtool run for all)."""
    tool = promtool()
    runs: dict[str, tuple[list[int], Any]] = {}
    for name in CASES:
        steps, cols = _case(name)
        renamed = {k.replace(f'run="{_run_label(k)}"', f'run="{name}"'): v for k, v in cols.items()}
        runs[name] = (steps, from_columns(renamed))
    fired = replay(
        {n: s for n, (_, s) in runs.items()}, REPO / "prometheus" / "rules.yml", tmp_path_factory.mktemp("ew"), tool
    )
    return {n: {alert: runs[n][0][at[0]] for alert, at in fired[n].items()} for n in CASES}


def _run_label(key: str) -> str:
    return key.split('run="', 1)[1].split('"', 1)[0]


def _service_first(client: TestClient, name: str) -> dict[str, int]:
    steps, cols = _case(name)
    run = create_run(client, name)
    loss, grad = _column(cols, LOSS), _column(cols, GRAD)
    for i, step in enumerate(steps):
        pts: list[dict[str, object]] = []
        for metric, values in (("loss", loss), ("grad_norm", grad)):
            v = values[i]
            if v is not None:
                pts.append({"name": metric, "step": step, "value": "NaN" if math.isnan(v) else v})
        post_points(client, name, pts)
    alerts = client.get("/api/v1/alerts", params={"run_id": str(run["id"]), "limit": "1000"}).json()
    first: dict[str, int] = {}
    for a in alerts:
        first[a["rule"]] = min(a["step"], first.get(a["rule"], a["step"]))
    return first


@pytest.mark.parametrize("name", list(CASES))
def test_both_sources_warn_the_recorded_series_at_the_same_step(
    name: str, client: TestClient, prometheus_first: dict[str, dict[str, int]]
) -> None:
    expected = CASES[name][2]
    assert _service_first(client, name) == expected
    assert prometheus_first[name] == {RULES[rule]: step for rule, step in expected.items()}
