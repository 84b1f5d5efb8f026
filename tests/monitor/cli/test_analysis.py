"""``hyperwatch fit`` end to end: CSV in, JSON out, one-line errors with exit status 2."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hyperwatch.cli import main


def write_csv(path: Path, header: list[str], rows: list[list[Any]]) -> Path:
    path.write_text("\n".join([",".join(header)] + [",".join(str(c) for c in r) for r in rows]) + "\n")
    return path


def run_ok(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    assert main(["fit", *argv]) == 0
    out = capsys.readouterr().out
    return json.loads(out)


def run_err(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["fit", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


def sweep_rows(depth: int, opt: float, lrs: np.ndarray) -> list[list[Any]]:
    return [[depth, lr, 0.05 * (math.log(lr) - math.log(opt)) ** 2 + 3.0] for lr in lrs]


LRS = 2.0 ** -np.arange(3, 11)


def test_fit_lr_prints_the_vertex(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_csv(tmp_path / "s.csv", ["depth", "lr", "loss"], [*sweep_rows(8, 0.01, LRS), [8, 1.0, "nan"]])
    out = run_ok(capsys, "lr", "--csv", str(path))
    assert out["method"] == "quadratic"
    assert out["optimal_lr"] == pytest.approx(0.01, rel=1e-9)
    assert out["optimal_loss"] == pytest.approx(3.0, rel=1e-12)
    assert out["excluded_lrs"] == [1.0]


def test_fit_lr_per_group_with_the_transfer_law(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # HyperP depth transfer: eta(d) = 0.02 * sqrt(8 / d)  =>  optimal lr ~ d^-0.5.
    rows = [r for d in (8, 12, 16, 20) for r in sweep_rows(d, 0.02 * math.sqrt(8 / d), LRS)]
    path = write_csv(tmp_path / "s.csv", ["depth", "lr", "loss"], rows)
    out = run_ok(capsys, "lr", "--csv", str(path), "--group-col", "depth")
    assert [g["group"] for g in out["groups"]] == [8.0, 12.0, 16.0, 20.0]
    assert out["groups"][3]["fit"]["optimal_lr"] == pytest.approx(0.02 * math.sqrt(8 / 20), rel=1e-8)
    assert out["transfer"]["b"] == pytest.approx(-0.5, rel=1e-6)
    assert out["transfer"]["a"] == pytest.approx(0.02 * math.sqrt(8), rel=1e-6)


def test_fit_lr_fallback_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_csv(tmp_path / "s.csv", ["lr", "loss"], [[lr, loss] for _, lr, loss in sweep_rows(8, 1.0, LRS)])
    out = run_ok(capsys, "lr", "--csv", str(path))
    assert out["method"] == "observed_best"
    assert "outside the swept range" in out["reason"]
    assert out["optimal_lr"] == LRS.max()


def test_fit_power_law(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokens = [1.3e9, 2.6e9, 5.2e9, 1.04e10, 2.08e10]
    path = write_csv(tmp_path / "p.csv", ["tokens", "opt_lr"], [[t, 0.02 * (t / 1.04e10) ** -0.32] for t in tokens])
    out = run_ok(capsys, "power-law", "--csv", str(path), "--x", "tokens", "--y", "opt_lr")
    assert {"a", "b", "loo_mape", "r2", "converged"} <= set(out)
    assert out["b"] == pytest.approx(-0.32, rel=1e-8)
    assert out["loo_mape"] == pytest.approx(0.0, abs=1e-6)
    assert out["x"] == "tokens" and out["c"] is None


def test_fit_scaling_with_leverage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flops = np.logspace(16, 21, 6)
    rows = [["muon", c, 400 * c**-0.15 + 1.8] for c in flops] + [["hyperp", c, 300 * c**-0.15 + 1.8] for c in flops]
    path = write_csv(tmp_path / "c.csv", ["method", "flops", "loss"], rows)
    out = run_ok(capsys, "scaling", "--csv", str(path), "--baseline", "muon")
    assert out["baseline"] == "muon"
    assert out["methods"]["muon"]["A"] == pytest.approx(400.0, rel=1e-4)
    assert out["methods"]["muon"]["C0"] == pytest.approx(1.8, rel=1e-4)
    levers = out["leverage"]["hyperp"]
    assert [p["flops"] for p in levers] == pytest.approx(list(flops))
    assert [p["rho"] for p in levers] == pytest.approx([(4 / 3) ** (1 / 0.15)] * 6, rel=1e-4)


def test_fit_sensitivity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_csv(tmp_path / "s.csv", ["lr", "loss"], [[lr, loss] for _, lr, loss in sweep_rows(8, 0.01, LRS)])
    out = run_ok(capsys, "sensitivity", "--csv", str(path))
    assert [r["k"] for r in out["by_k"]] == [3, 4, 5, 6, 7]
    assert out["by_k"][-1]["n_subsets"] == 8
    assert out["full_fit"]["optimal_lr"] == pytest.approx(0.01, rel=1e-9)


def test_fit_stability_from_long_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [
        ["d8", 8, "router_z", 2, 9.0],
        ["d8", 8, "router_z", 1, 5.0],
        ["d12", 12, "router_z", 1, 4.0],
        ["d12", 12, "router_z", 2, "NaN"],
        ["d8", 8, "mlp_rms", 1, 0.3],
        ["d12", 12, "mlp_rms", 1, 0.2],
    ]
    path = write_csv(tmp_path / "st.csv", ["run", "scale", "indicator", "step", "value"], rows)
    assert main(["fit", "stability", "--csv", str(path)]) == 0
    text_out = capsys.readouterr().out
    assert "NaN" in text_out and ": NaN" not in text_out  # NaN travels as the string "NaN"
    out = json.loads(text_out)
    assert out["transferable"] is False
    assert out["indicators"]["router_z"]["verdict"] == "breaks"
    assert out["indicators"]["router_z"]["breaks_at"] == 12.0
    assert out["indicators"]["router_z"]["final"]["values"] == [9.0, "NaN"]  # sorted by step
    assert out["indicators"]["mlp_rms"]["verdict"] == "transferable"


@pytest.mark.parametrize(
    ("header", "rows", "argv", "expected"),
    [
        (["lr", "los"], [[0.01, 3.0]], ["lr"], "no column 'loss'; the header has ['lr', 'los']; pass --loss-col"),
        (["lr", "loss"], [[0.01, 3.0], [0.02, "x"]], ["lr"], "line 3, column 'loss': 'x' is not a number"),
        (["lr", "loss"], [[0.01, 3.0], [0.02, 2.9]], ["lr"], "column 'lr': 2 distinct learning rates"),
        (["x", "y"], [[1, 2], [-1, 3]], ["power-law", "--x", "x", "--y", "y"], "line 3, column 'x': -1.0 is not"),
        (["x", "y"], [[1, 2]], ["power-law", "--x", "x", "--y", "y"], "column 'x': 1 distinct x values"),
        (["x", "y"], [[1, 2], [2, -3]], ["power-law", "--x", "x", "--y", "y"], "column 'y': y = a*x^b has one sign"),
        (["method", "flops", "loss"], [["m", 1e18, 3.0]], ["scaling", "--baseline", "z"], "--baseline 'z' is not"),
        (["method", "flops", "loss"], [["m", 1e18, 3.0]], ["scaling", "--baseline", "m"], "column 'flops': baseline"),
        (["method", "flops", "loss"], [["m", 0, 3.0]], ["scaling", "--baseline", "m"], "line 2, column 'flops'"),
        (["lr", "loss"], [[0.01, 3.0], [0.02, 2.9], [0.04, 3.1]], ["sensitivity"], "at least 4"),
        (["run", "scale"], [["a", 1]], ["stability"], "no column 'indicator'"),
    ],
)
def test_bad_csvs_exit_2_with_one_line_naming_the_problem(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    header: list[str],
    rows: list[list[Any]],
    argv: list[str],
    expected: str,
) -> None:
    path = write_csv(tmp_path / "bad.csv", header, rows)
    err = run_err(capsys, argv[0], "--csv", str(path), *argv[1:])
    assert expected in err
    assert str(path) in err
    assert err.startswith(f"hyperwatch fit {argv[0]}: ")


def test_grouped_sweep_error_names_the_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [*sweep_rows(8, 0.01, LRS), [12, 0.01, 3.0], [12, 0.02, 2.9]]
    path = write_csv(tmp_path / "g.csv", ["depth", "lr", "loss"], rows)
    err = run_err(capsys, "lr", "--csv", str(path), "--group-col", "depth")
    assert "depth = 12" in err and "2 distinct learning rates" in err


def test_missing_file_and_bad_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = run_err(capsys, "lr", "--csv", str(tmp_path / "none.csv"))
    assert "no such file" in err
    with pytest.raises(SystemExit) as info:
        main(["fit", "sensitivity", "--csv", "x.csv", "--max-subsets", "0"])
    assert info.value.code == 2
    assert "--max-subsets" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["fit", "lr", "--csv", "x.csv", "--r2-threshold", "2"])
    assert "outside (0, 1]" in capsys.readouterr().err
