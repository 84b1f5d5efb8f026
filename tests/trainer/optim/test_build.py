"""build_optimizers: parameter groups, per-arm LRs and weight decay, the wrapper's interface."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hyperwatch.trainer.optim import AdamH, Muon, MuonH, OptimizerSet, build_optimizers
from hyperwatch.trainer.optim.schedule import hyperp_lr
from tests.trainer.optim.models import WIDTH, TinyRolesModel


def _groups(opts: OptimizerSet) -> dict[str, dict]:
    return {g["name"]: g for g in opts.param_groups}


def _owner(opts: OptimizerSet, name: str) -> type:
    for opt in opts.optimizers.values():
        for group in opt.param_groups:
            if name in group["param_names"]:
                return type(opt)
    raise AssertionError(f"{name} is in no optimizer")


def test_bad_arm_lists_the_valid_arms() -> None:
    with pytest.raises(ValueError, match=r"arm must be one of muon, muonh, hyperp, hyperp_moe; got 'adam'"):
        build_optimizers(TinyRolesModel(), "adam", lr=0.02, depth=8, width=16, tokens=1e9)


@pytest.mark.parametrize("arm", ["muonh", "hyperp", "hyperp_moe"])
def test_muonh_arms_route_roles_to_muonh_adamh_adamw(arm: str) -> None:
    opts = build_optimizers(TinyRolesModel(), arm, lr=0.02, depth=8, width=16, tokens=1e9)
    assert _owner(opts, "up.weight") is MuonH
    assert _owner(opts, "router.weight") is MuonH
    assert _owner(opts, "experts") is MuonH
    assert _owner(opts, "head.weight") is AdamH
    assert _owner(opts, "embed.weight") is torch.optim.AdamW
    assert _owner(opts, "gain") is torch.optim.AdamW
    assert _owner(opts, "down.bias") is torch.optim.AdamW
    assert all(g["weight_decay"] == 0 for g in opts.param_groups)
    names = [n for g in opts.param_groups for n in g["param_names"]]
    assert sorted(names) == sorted(n for n, _ in TinyRolesModel().named_parameters())


def test_muonh_arm_uses_the_base_lr_everywhere() -> None:
    opts = build_optimizers(TinyRolesModel(), "muonh", lr=0.02, depth=32, width=64, tokens=1e12)
    assert {g["name"]: g["initial_lr"] for g in opts.param_groups} == {
        "hidden": 0.02,
        "head": 0.02,
        "embedding": 0.02,
        "vector": 0.02,
    }


def test_hyperp_arm_shares_one_transferred_lr() -> None:
    opts = build_optimizers(TinyRolesModel(), "hyperp", lr=0.02, depth=32, width=16, tokens=104e9)
    eta = hyperp_lr(0.02, 32, 104e9)
    assert math.isclose(eta, 0.02 * 0.5 * 10**-0.32)
    for group in opts.param_groups:
        assert math.isclose(group["initial_lr"], eta) and math.isclose(group["lr"], eta), group["name"]


def test_muon_arm_mup_plus_plus_multipliers_and_decay() -> None:
    depth, width, lam = 32, 64, 1e-3
    opts = build_optimizers(TinyRolesModel(), "muon", lr=0.02, depth=depth, width=width, tokens=1e9)
    groups = _groups(opts)
    depth_mult = math.sqrt(8 / depth)
    w0 = 8 * width / depth  # the default base width keeps the aspect ratio
    # up: (48, 16); down: (16, 48); router: (3, 16); experts: (3, 16, 16) -> per expert (16, 16)
    expected = {"hidden_48x16": 48 / 16, "hidden_16x48": 16 / 48, "hidden_3x16": 3 / 16, "hidden_16x16": 1.0}
    for name, aspect in expected.items():
        assert math.isclose(groups[name]["initial_lr"], 0.02 * math.sqrt(aspect) * depth_mult), name
        assert math.isclose(groups[name]["weight_decay"], lam * w0 / width), name
        assert groups[name]["role"] == "hidden"
    assert groups["hidden_16x16"]["param_names"] == ["experts"]
    for name in ("head", "embedding", "vector"):
        assert math.isclose(groups[name]["initial_lr"], 0.02 * depth_mult), name
        assert groups[name]["weight_decay"] == 0.0, name
    assert _owner(opts, "experts") is Muon
    assert _owner(opts, "head.weight") is torch.optim.AdamW


def test_muon_arm_weight_decay_scales_with_one_over_width() -> None:
    model = TinyRolesModel()
    small = build_optimizers(model, "muon", lr=0.02, depth=8, width=16, tokens=1e9, base_width=16)
    wide = build_optimizers(model, "muon", lr=0.02, depth=8, width=64, tokens=1e9, base_width=16)
    assert math.isclose(_groups(small)["hidden_48x16"]["weight_decay"], 1e-3)
    assert math.isclose(_groups(wide)["hidden_48x16"]["weight_decay"], 1e-3 / 4)


def test_set_lr_scale_multiplies_every_peak_and_validates() -> None:
    opts = build_optimizers(TinyRolesModel(), "muon", lr=0.02, depth=8, width=16, tokens=1e9)
    opts.set_lr_scale(0.25)
    for group in opts.param_groups:
        assert math.isclose(group["lr"], 0.25 * group["initial_lr"])
    assert all(math.isclose(v, 0.25 * _groups(opts)[k]["initial_lr"]) for k, v in opts.lrs().items())
    with pytest.raises(ValueError, match="scale"):
        opts.set_lr_scale(-0.1)
    with pytest.raises(ValueError, match="scale"):
        opts.set_lr_scale(float("nan"))


def test_zero_grad_and_step_cover_every_optimizer() -> None:
    model = TinyRolesModel()
    opts = build_optimizers(model, "hyperp", lr=0.02, depth=8, width=16, tokens=1e9)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model(torch.zeros(2, 3, dtype=torch.long)).sum().backward()
    opts.step()
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters())
    opts.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in model.parameters())


def test_load_state_dict_refuses_another_arm() -> None:
    model = TinyRolesModel()
    saved = build_optimizers(model, "muon", lr=0.02, depth=8, width=16, tokens=1e9).state_dict()
    other = build_optimizers(model, "hyperp", lr=0.02, depth=8, width=16, tokens=1e9)
    with pytest.raises(ValueError, match="same --arm"):
        other.load_state_dict(saved)


class _NoRoles(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)


class _BadRoles(TinyRolesModel):
    def __init__(self, roles: dict[str, str]) -> None:
        super().__init__()
        self._roles = roles

    def parameter_roles(self) -> dict[str, str]:
        return self._roles


def _roles_with(**changes: str | None) -> dict[str, str]:
    roles = TinyRolesModel().parameter_roles()
    for key, value in changes.items():
        name = key.replace("__", ".")
        if value is None:
            roles.pop(name)
        else:
            roles[name] = value
    return roles


@pytest.mark.parametrize(
    ("roles", "match"),
    [
        (_roles_with(gain=None), r"'gain' has no role"),
        (_roles_with(gain="bias"), r"'gain' has role 'bias'; valid roles"),
        (_roles_with(gain="hidden"), r"'gain' has role 'hidden' but shape \(16,\).*'vector'"),
        (_roles_with(ghost="vector"), r"does not have: \['ghost'\]"),
    ],
)
def test_roles_are_validated(roles: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_optimizers(_BadRoles(roles), "hyperp", lr=0.02, depth=8, width=WIDTH, tokens=1e9)


def test_model_without_roles_is_refused() -> None:
    with pytest.raises(TypeError, match=r"parameter_roles\(\)"):
        build_optimizers(_NoRoles(), "muon", lr=0.02, depth=8, width=16, tokens=1e9)


def test_frozen_parameters_are_left_out() -> None:
    model = TinyRolesModel()
    model.embed.weight.requires_grad_(False)
    opts = build_optimizers(model, "hyperp", lr=0.02, depth=8, width=16, tokens=1e9)
    assert "embedding" not in _groups(opts)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"lr": 0.0}, "lr"),
        ({"depth": -1}, "depth"),
        ({"width": float("inf")}, "width"),
        ({"tokens": 0}, "tokens"),
        ({"base_width": 0}, "base_width"),
        ({"weight_decay": -1e-3}, "weight_decay"),
        ({"betas": (0.9, 1.2)}, r"betas\[1\]"),
    ],
)
def test_bad_numbers_name_the_argument(kwargs: dict, match: str) -> None:
    args = {"lr": 0.02, "depth": 8, "width": 16, "tokens": 1e9, **kwargs}
    with pytest.raises(ValueError, match=match):
        build_optimizers(TinyRolesModel(), "muon", **args)
