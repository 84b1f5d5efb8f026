"""HyperP LR transfer, per-parameterization multipliers and the linear-decay schedule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hyperwatch.trainer.optim.schedule import (
    ARMS,
    check_arm,
    head_multiplier,
    hyperp_lr,
    linear_decay,
    lr_multiplier,
    parameterization_for_arm,
    residual_multiplier,
    weight_decay_for,
)

T0 = 10.4e9


def test_hyperp_lr_known_values() -> None:
    assert hyperp_lr(0.02, 8, T0) == pytest.approx(0.02, rel=1e-12)
    assert hyperp_lr(0.02, 32, T0) == pytest.approx(0.01, rel=1e-12)
    assert hyperp_lr(0.02, 8, 10 * T0) == pytest.approx(0.02 * 10**-0.32, rel=1e-12)
    assert hyperp_lr(0.01, 2, T0 / 10) == pytest.approx(0.01 * 2 * 10**0.32, rel=1e-12)
    assert hyperp_lr(1.0, 16, 4e9, base_depth=4, base_tokens=1e9, exponent=0.5) == pytest.approx(0.25)


@pytest.mark.parametrize("argument", ["eta0", "depth", "tokens", "base_depth", "base_tokens"])
@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_hyperp_lr_names_the_bad_argument(argument: str, bad: float) -> None:
    kwargs = {"eta0": 0.02, "depth": 8, "tokens": T0, "base_depth": 8, "base_tokens": T0, argument: bad}
    with pytest.raises(ValueError, match=rf"^{argument} must be a finite number > 0"):
        hyperp_lr(**kwargs)


@given(
    eta0=st.floats(1e-5, 1.0),
    depth=st.integers(1, 128),
    tokens=st.floats(1e6, 1e13),
)
def test_hyperp_lr_scales_as_the_law(eta0: float, depth: int, tokens: float) -> None:
    eta = hyperp_lr(eta0, depth, tokens)
    assert hyperp_lr(eta0, 4 * depth, tokens) == pytest.approx(eta / 2, rel=1e-12)
    assert hyperp_lr(eta0, depth, 2 * tokens) == pytest.approx(eta * 2**-0.32, rel=1e-12)
    assert hyperp_lr(3 * eta0, depth, tokens) == pytest.approx(3 * eta, rel=1e-12)


def test_linear_decay_endpoints_and_line() -> None:
    assert linear_decay(0, 101) == 1.0
    assert linear_decay(100, 101) == pytest.approx(0.1, abs=1e-15)
    assert linear_decay(50, 101) == pytest.approx(0.55)
    values = [linear_decay(s, 11, final_fraction=0.0) for s in range(11)]
    assert values == pytest.approx([1 - s / 10 for s in range(11)])
    assert linear_decay(0, 1) == 1.0


@pytest.mark.parametrize(
    ("step", "total", "fraction", "match"),
    [
        (10, 10, 0.1, r"step must be an integer in \[0, total_steps - 1\] = \[0, 9\]"),
        (-1, 10, 0.1, "step"),
        (0, 0, 0.1, "total_steps must be an integer >= 1"),
        (0, 10, 1.5, "final_fraction"),
        (0, 10, float("nan"), "final_fraction"),
    ],
)
def test_linear_decay_validates(step: int, total: int, fraction: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        linear_decay(step, total, final_fraction=fraction)


def test_residual_and_head_multipliers() -> None:
    assert residual_multiplier("vanilla", 8) == 1.0
    assert residual_multiplier("mup", 8) == 1.0
    assert residual_multiplier("mup++", 8) == pytest.approx(0.25)
    assert residual_multiplier("hyperp", 18) == pytest.approx(1 / 6)
    assert head_multiplier("mup", 2048, 1024) == pytest.approx(0.5)
    assert head_multiplier("mup++", 4096, 1024) == pytest.approx(0.25)
    assert head_multiplier("hyperp", 4096, 1024) == 1.0
    assert head_multiplier("vanilla", 4096, 1024) == 1.0
    with pytest.raises(ValueError, match="parameterization must be one of vanilla, mup, mup\\+\\+, hyperp"):
        residual_multiplier("sp", 8)
    with pytest.raises(ValueError, match="depth"):
        residual_multiplier("hyperp", 0)
    with pytest.raises(ValueError, match="base_width"):
        head_multiplier("mup", 1024, -1)


def test_lr_multipliers_follow_the_table() -> None:
    def mult(parameterization: str, role: str, **shape: int) -> float:
        return lr_multiplier(parameterization, role, depth=32, tokens=10 * T0, **shape)

    assert mult("vanilla", "hidden") == 1.0
    assert mult("mup", "hidden", d_out=64, d_in=16) == pytest.approx(2.0)
    assert mult("mup", "embedding") == 1.0
    assert mult("mup++", "hidden", d_out=64, d_in=16) == pytest.approx(1.0)
    assert mult("mup++", "head") == pytest.approx(0.5)
    for role in ("embedding", "head", "hidden", "vector"):
        assert mult("hyperp", role) == pytest.approx(0.5 * 10**-0.32)
    with pytest.raises(ValueError, match="d_out and d_in are required"):
        mult("mup++", "hidden")
    with pytest.raises(ValueError, match="role must be one of embedding, head, hidden, vector"):
        mult("mup", "bias")


def test_weight_decay_follows_the_table() -> None:
    decay = {"weight_decay": 1e-3, "width": 2048, "base_width": 1024}
    assert weight_decay_for("mup++", "hidden", **decay) == pytest.approx(5e-4)
    assert weight_decay_for("mup++", "embedding", **decay) == 0.0
    assert weight_decay_for("mup", "hidden", **decay) == pytest.approx(5e-4)
    assert weight_decay_for("mup", "vector", **decay) == pytest.approx(1e-3)
    for role in ("embedding", "head", "hidden", "vector"):
        assert weight_decay_for("hyperp", role, **decay) == 0.0
        assert weight_decay_for("vanilla", role, **decay) == 0.0
    with pytest.raises(ValueError, match="weight_decay must be a finite number >= 0"):
        weight_decay_for("mup", "hidden", weight_decay=-1.0, width=1, base_width=1)


def test_arms_and_their_parameterizations() -> None:
    assert ARMS == ("muon", "muonh", "hyperp", "hyperp_moe")
    assert [parameterization_for_arm(a) for a in ARMS] == ["mup++", "vanilla", "hyperp", "hyperp"]
    assert check_arm("hyperp") == "hyperp"
    with pytest.raises(ValueError, match=r"arm must be one of muon, muonh, hyperp, hyperp_moe; got 'sgd'"):
        check_arm("sgd")
