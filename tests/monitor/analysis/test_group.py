"""fit_group: what a dashboard needs from a group of stored runs (scale fields + final val loss)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from hyperwatch.monitor.analysis import AnalysisError, fit_group

LRS = [0.0025, 0.005, 0.01, 0.02, 0.04, 0.08]
T0, D0, ETA0 = 1.04e10, 8, 0.02


def optimal_lr(depth: int, tokens: float) -> float:
    """The HyperP transfer rule: eta0 * sqrt(d0 / d) * (T0 / T)^0.32."""
    return ETA0 * math.sqrt(D0 / depth) * (T0 / tokens) ** 0.32


def sweep(depth: int, tokens: float, method: str = "muonh_hyperp") -> list[dict[str, Any]]:
    opt = optimal_lr(depth, tokens)
    return [
        {
            "run": f"{method}-d{depth}-t{tokens:.3g}-lr{lr}",
            "method": method,
            "depth": depth,
            "tokens": tokens,
            "lr": lr,
            "val_loss": 0.04 * (math.log(lr) - math.log(opt)) ** 2 + 3.0 - 0.05 * depth / 8,
            "config": {"ignored": True},
        }
        for lr in LRS
    ]


def test_sweeps_and_transfer_laws_recover_the_hyperp_exponents() -> None:
    records = [r for d in (8, 12, 16) for r in sweep(d, T0)] + [r for t in (2 * T0, 4 * T0) for r in sweep(8, t)]
    result = fit_group(records)
    assert result.n_runs == len(records)
    assert len(result.sweeps) == 5
    for s in result.sweeps:
        assert not isinstance(s.fit, str) and s.fit.method == "quadratic"
        _, depth, tokens, _ = s.key
        assert s.fit.optimal_lr == pytest.approx(optimal_lr(int(depth or 0), tokens or 0), rel=1e-8)
    laws = {law.axis: law for law in result.transfer_laws}
    assert set(laws) == {"depth", "tokens"}
    assert not isinstance(laws["depth"].fit, str) and laws["depth"].fit.b == pytest.approx(-0.5, rel=1e-6)
    assert laws["depth"].fixed == {"method": "muonh_hyperp", "tokens": T0, "batch_size": None}
    assert not isinstance(laws["tokens"].fit, str) and laws["tokens"].fit.b == pytest.approx(-0.32, rel=1e-6)
    assert laws["tokens"].x == (T0, 2 * T0, 4 * T0)
    assert result.scaling is None
    out = result.to_json()
    assert out["transfer_laws"][0]["axis"] == "depth"
    assert out["transfer_laws"][0]["fit"]["b"] == pytest.approx(-0.5, rel=1e-6)


def test_a_short_sweep_reports_its_error_and_keeps_the_others() -> None:
    records = sweep(8, T0) + sweep(12, T0)[:2]
    result = fit_group(records)
    fits = {s.key[1]: s.fit for s in result.sweeps}
    assert isinstance(fits[12.0], str) and "2 distinct learning rates" in fits[12.0]
    assert not isinstance(fits[8.0], str)
    assert result.transfer_laws == ()  # one good sweep: no law
    assert result.to_json()["sweeps"][1]["fit"]["error"] == fits[12.0]


def test_scaling_laws_and_leverage_over_the_baseline() -> None:
    flops = np.logspace(17, 21, 5)
    records = []
    for method, a in (("muon", 400.0), ("muonh_hyperp", 300.0)):
        for i, c in enumerate(flops):
            records.append({"run": f"{method}-{i}", "arm": method, "flops": c, "val_loss": a * c**-0.15 + 1.8})
            # a worse LR at the same budget: the budget's point is its best run
            records.append({"run": f"{method}-{i}-hi", "arm": method, "flops": c, "val_loss": a * c**-0.15 + 2.0})
    result = fit_group(records, baseline="muon")
    assert result.scaling is not None and not isinstance(result.scaling, str)
    assert result.scaling.n_reduced == 10
    assert result.sweeps == ()  # runs without lr are not sweeps
    lev = result.scaling.leverage["muonh_hyperp"]
    assert not isinstance(lev, str)
    assert [p.rho for p in lev] == pytest.approx([(4 / 3) ** (1 / 0.15)] * 5, rel=1e-4)
    assert result.to_json()["scaling"]["baseline"] == "muon"


def test_diverged_runs_travel_as_nan_and_are_excluded() -> None:
    diverged = {"run": "diverged", "method": "muonh_hyperp", "depth": 8, "tokens": T0, "lr": 0.5, "val_loss": "NaN"}
    records = [*sweep(8, T0), diverged]
    (s,) = fit_group(records).sweeps
    assert not isinstance(s.fit, str) and s.fit.excluded_lrs == (0.5,)
    assert "diverged" in s.runs


@pytest.mark.parametrize(
    ("record", "field", "text"),
    [
        ({"val_loss": 3.0}, "records[0].run", "non-empty string"),
        ({"run": "a"}, "records[0].val_loss", "no final validation loss"),
        ({"run": "a", "val_loss": "low"}, "records[0].val_loss", "NaN"),
        ({"run": "a", "val_loss": 3.0, "lr": -1}, "records[0].lr", "positive finite"),
        ({"run": "a", "val_loss": 3.0, "depth": True}, "records[0].depth", "positive finite"),
        ({"run": "a", "val_loss": 3.0, "method": 7}, "records[0].method", "string"),
    ],
)
def test_malformed_records_are_refused(record: dict[str, Any], field: str, text: str) -> None:
    with pytest.raises(AnalysisError, match=text) as info:
        fit_group([record])
    assert info.value.field == field


def test_single_lr_runs_are_not_sweeps() -> None:
    records = [{"run": f"d{d}", "depth": d, "lr": 0.01, "val_loss": 3.0} for d in (8, 12)]
    assert fit_group(records).sweeps == ()


def test_unknown_baseline_is_refused() -> None:
    with pytest.raises(AnalysisError, match="no run has flops"):
        fit_group(sweep(8, T0), baseline="muon")
    records = [{"run": f"r{i}", "method": "m", "flops": 10.0**i, "val_loss": 3.0 - 0.1 * i} for i in range(15, 20)]
    with pytest.raises(AnalysisError, match="'muon' is not a method"):
        fit_group(records, baseline="muon")
