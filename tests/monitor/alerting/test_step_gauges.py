"""The statistics /metrics exports for the Prometheus rules, counted in logged steps with the run's group
thresholds (the rules used to take windows of scraped samples): the loss and grad-norm rules' (the
detectors' own), and each growth metric's rise over its max over layers."""

from __future__ import annotations

import math
import uuid

import numpy as np
import pytest
from fastapi.testclient import TestClient

from hyperwatch.hooks.columns import PointColumns
from hyperwatch.monitor.alerting.prometheus import step_gauges
from hyperwatch.monitor.alerting.trends import growth_stats
from hyperwatch.monitor.store import SqlStore
from hyperwatch.monitor.store.trailing import per_step_max
from hyperwatch.monitor.thresholds.defaults import thresholds_for
from tests.monitor.alerting.test_prometheus import _samples
from tests.monitor.conftest import AUTH, create_run, post_points

GAUGES = (
    "loss_spike_streak", "loss_spike_mean", "loss_spike_sigma", "loss_shift_recent", "loss_shift_mean",
    "loss_shift_error", "grad_norm_spike_streak", "grad_norm_spike_mean", "grad_norm_spike_sigma",
)  # fmt: skip
SPIKE_AT, NAN_AT, N = 24, 30, 40


def _series() -> tuple[list[float], list[float]]:
    """A noisy falling loss with a spike and a NaN, and a noisy grad norm held high for two points."""
    rng = np.random.default_rng(7)
    loss = (3.0 - 0.005 * np.arange(N) + rng.normal(0, 0.03, N)).tolist()
    loss[SPIKE_AT] += 2.0
    loss[NAN_AT] = math.nan
    grad = (1.0 + rng.normal(0, 0.05, N)).tolist()
    grad[SPIKE_AT] = grad[SPIKE_AT + 1] = 9.0
    return loss, grad


def _wire(v: float) -> float | str:
    return "NaN" if math.isnan(v) else v


def test_statistics_are_the_detectors_over_the_logged_values_with_the_groups_thresholds(client: TestClient) -> None:
    over = {"loss_shift_points": 4, "loss_spike_window": 12, "sigma_spike_min_points": 10}
    r = client.post("/api/v1/groups", json={"name": "g", "thresholds": over}, headers=AUTH)
    assert r.status_code == 201, r.text
    create_run(client, "grouped", group="g")
    create_run(client, "plain")
    loss, grad = _series()
    th = {"grouped": thresholds_for(over), "plain": thresholds_for({})}
    seen: dict[str, list[dict[str, float]]] = {"grouped": [], "plain": []}
    for i in range(N):
        for run in th:
            pts = [
                {"name": "loss", "step": 4 * i, "value": _wire(loss[i])},
                {"name": "grad_norm", "step": 4 * i, "value": grad[i]},
            ]
            post_points(client, run, pts)
        s = _samples(client)
        for run in th:
            labels = (("project", "default"), ("run", run))
            seen[run].append(
                {g: s[(f"hyperwatch_run_{g}", labels)] for g in GAUGES if (f"hyperwatch_run_{g}", labels) in s}
            )
    for run, rows in seen.items():
        for i, got in enumerate(rows):
            want = {
                **step_gauges("loss", list(enumerate(loss[: i + 1])), th[run]),
                **step_gauges("grad_norm", list(enumerate(grad[: i + 1])), th[run]),
            }
            assert got == pytest.approx(want, rel=1e-12, abs=1e-15), (run, i)
    plain, grouped = seen["plain"], seen["grouped"]
    # no verdict before 16 values of history (sigma_spike_min_points): nothing exported
    assert "loss_spike_mean" not in plain[15] and "loss_spike_mean" in plain[16]
    # at the spike: the 16 losses before it, counted in logged values whatever the scrape pace
    spike = plain[SPIKE_AT]
    assert spike["loss_spike_streak"] == loss[SPIKE_AT]
    assert spike["loss_spike_mean"] == pytest.approx(np.mean(loss[SPIKE_AT - 16 : SPIKE_AT]))
    assert spike["loss_spike_sigma"] == pytest.approx(np.std(loss[SPIKE_AT - 16 : SPIKE_AT]))
    assert spike["loss_spike_streak"] - spike["loss_spike_mean"] > 4 * spike["loss_spike_sigma"]
    # the group's window (12 values, 10 needed): its mean is over other losses
    assert grouped[SPIKE_AT]["loss_spike_mean"] == pytest.approx(np.mean(loss[SPIKE_AT - 12 : SPIKE_AT]))
    # the grad norm's streak is its 2 latest values: their lowest
    assert plain[SPIKE_AT]["grad_norm_spike_streak"] == min(grad[SPIKE_AT - 1], grad[SPIKE_AT])
    assert plain[SPIKE_AT + 1]["grad_norm_spike_streak"] == 9.0
    # the shift: the group's 4 latest losses without their largest; sigma / sqrt(3)
    recent = sorted(loss[SPIKE_AT - 3 : SPIKE_AT + 1])[:-1]
    assert grouped[SPIKE_AT]["loss_shift_recent"] == pytest.approx(np.mean(recent))
    before = loss[SPIKE_AT - 3 - 16 : SPIKE_AT - 3]
    assert grouped[SPIKE_AT]["loss_shift_error"] == pytest.approx(np.std(before) / math.sqrt(3))
    # a NaN loss: no spike verdict while it is the latest, no shift while it is in the window (its own rule fires)
    assert not any(g.startswith("loss_spike") for g in plain[NAN_AT])
    assert not any(g.startswith("loss_shift") for g in plain[NAN_AT + 5])
    # after it, the NaN is left out of the history: 15 finite values of 16 are too few for the defaults,
    # 11 of 12 enough for the group's 10
    assert "loss_spike_mean" not in plain[NAN_AT + 1]
    assert grouped[NAN_AT + 1]["loss_spike_mean"] == pytest.approx(np.nanmean(loss[NAN_AT + 1 - 12 : NAN_AT + 1]))


def test_the_services_alerts_fire_where_the_exported_statistics_say(client: TestClient) -> None:
    """The detector's loss_spike and grad_norm_spike, and the rules' comparisons on the gauges, agree."""
    create_run(client, "r")
    loss, grad = _series()
    fires: dict[str, list[int]] = {"loss_spike": [], "grad_norm_spike": []}
    th = thresholds_for({})
    for i in range(N):
        pts = [
            {"name": "loss", "step": 4 * i, "value": _wire(loss[i])},
            {"name": "grad_norm", "step": 4 * i, "value": grad[i]},
        ]
        post_points(client, "r", pts)
        s = {k[0]: v for k, v in _samples(client).items() if ("run", "r") in k[1]}
        for metric in ("loss", "grad_norm"):
            p = f"hyperwatch_run_{metric}_spike_"
            if p + "mean" in s:
                jump = s[p + "streak"] - s[p + "mean"]
                if jump > th["sigma_spike_multiple"] * s[p + "sigma"] and jump > th["sigma_spike_min_relative"] * abs(
                    s[p + "mean"]
                ):
                    fires[f"{metric}_spike"].append(4 * i)
    alerts = client.get("/api/v1/alerts", params={"limit": "1000"}).json()
    stored = {rule: sorted(a["step"] for a in alerts if a["rule"] == rule) for rule in fires}
    assert fires == stored == {"loss_spike": [4 * SPIKE_AT], "grad_norm_spike": [4 * (SPIKE_AT + 1)]}


def test_growth_rises_are_fitted_over_the_max_over_layers_in_logged_steps(client: TestClient) -> None:
    """Layer 1 climbs x1.2 per logged step from step 40, layer 0 stays near 30: the rise follows the max
    over layers (the fit of ln(max) over the last 16 logged steps), whatever the wall clock."""
    over = {"growth_window": 12, "growth_min_points": 6}
    r = client.post("/api/v1/groups", json={"name": "gw", "thresholds": over}, headers=AUTH)
    assert r.status_code == 201, r.text
    create_run(client, "grouped", group="gw")
    create_run(client, "plain")
    rng = np.random.default_rng(3)
    flat = (30 + rng.normal(0, 1, N)).tolist()
    climb = [20.0 if i < 10 else 20.0 * 1.2 ** (i - 10) for i in range(N)]
    th = {"grouped": thresholds_for(over), "plain": thresholds_for({})}
    seen: dict[str, list[tuple[float, float] | None]] = {"grouped": [], "plain": []}
    layers: list[list[tuple[int, float]]] = [[], []]
    for i in range(N):
        layers[0].append((4 * i, flat[i]))
        layers[1].append((4 * i, climb[i]))
        for run in th:
            pts = [{"name": "attention_z", "layer": la, "step": 4 * i, "value": layers[la][-1][1]} for la in (0, 1)]
            post_points(client, run, pts)
        s = _samples(client)
        for run in th:
            labels = (("project", "default"), ("run", run))
            rise = s.get(("hyperwatch_run_attention_z_growth_rise", labels))
            late = s.get(("hyperwatch_run_attention_z_growth_late", labels))
            assert (rise is None) == (late is None)
            seen[run].append(None if rise is None or late is None else (rise, late))
            want = growth_stats(per_step_max(layers), th[run])
            assert seen[run][-1] == (None if want is None else pytest.approx((want.rise, want.late), rel=1e-12))
    plain, grouped = seen["plain"], seen["grouped"]
    assert plain[6] is None and plain[7] is not None  # growth_min_points 8 logged steps
    assert grouped[4] is None and grouped[5] is not None  # the group's 6
    # the window is logged steps: 16 of them (the group's 12), ln(1.2) a step once layer 1 leads
    assert plain[30] == pytest.approx((15 * math.log(1.2), 15 * math.log(1.2)))
    assert grouped[30] == pytest.approx((11 * math.log(1.2), 11 * math.log(1.2)))
    assert plain[9] is not None and abs(plain[9][0]) < 0.2  # before the climb: the flat layer leads, no rise


def test_step_maxima_are_the_newest_steps_of_every_layers_points(store: SqlStore) -> None:
    """Layers that log at other steps, one of them young: the max over layers at each of the name's newest
    steps, as every layer's own trailing window gives it (both read paths: a long reference layer, and the
    young one that bounds nothing)."""
    run, _ = store.upsert_run("default", "maxima", {})
    rng = np.random.default_rng(11)
    layers = {0: range(40, 77, 4), 1: range(0, 79, 2), 2: range(1, 78, 4)}  # layer 0 joins late
    pts = [(la, s, float(rng.uniform(1, 100))) for la, steps in layers.items() for s in steps]
    pts.append((1, 50, math.nan))  # layer 1's step 50 sent again as NaN, the only value there: no maximum
    for i in range(0, len(pts), 7):  # small batches: chunks seal and pack along the way
        part = pts[i : i + 7]
        cols = PointColumns.build(["attention_z"] * len(part), [s for _, s, _ in part], [v for *_, v in part],
                                  [la for la, _, _ in part], [None] * len(part))  # fmt: skip
        store.ingest(run.id, uuid.uuid4().hex, cols)
    stored = {(la, s): v for la, s, v in pts}  # a key sent again: the last value stands (the NaN at step 50)
    every = {la: sorted((s, v) for (l2, s), v in stored.items() if l2 == la) for la in layers}
    for top in (78, 77, 76, 60):
        for limit in (1, 5, 16, 30, 200):
            want = per_step_max([[p for p in w if p[0] <= top] for w in every.values()])[-limit:]
            got = store.step_maxima(run.id, [("attention_z", top)], limit)[0]
            assert got == want, (top, limit, sorted(set(got) ^ set(want)))
    assert store.step_maxima(run.id, [("nothing", 10), ("attention_z", -1)], 5) == [[], []]
