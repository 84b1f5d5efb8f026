"""The batched (foreach) step of Muon, MuonH and AdamH against the per-matrix reference path."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch

from hyperwatch.trainer.optim import AdamH, Muon, MuonH, batched, build_optimizers
from hyperwatch.trainer.optim.newton_schulz import newton_schulz5
from tests.trainer.optim.models import TinyRolesModel, batch, hidden_matrices, loss_fn

# Same-shaped matrices in several parameters (two 2-D and an expert stack of the same 12x8),
# a transposed shape, a tall one: the buckets mix parameters and expert stacks.
SHAPES = [(12, 8), (12, 8), (5, 12, 8), (8, 12), (20, 6), (3, 6, 20)]


def _params(dtype: torch.dtype, seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=gen, dtype=torch.float64).to(dtype)) for s in SHAPES]


def _run(make: Callable[..., torch.optim.Optimizer], foreach: bool, dtype: torch.dtype) -> list[torch.Tensor]:
    params = _params(dtype)
    opt = make(params, foreach=foreach)
    gen = torch.Generator().manual_seed(1)
    for step in range(6):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(dtype)
        opt.param_groups[0]["lr"] = 0.05 / (1 + step)
        opt.step()
    return [p.detach().clone() for p in params]


OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "muon": lambda ps, foreach: Muon(ps, lr=0.05, weight_decay=0.1, foreach=foreach),
    "muonh": lambda ps, foreach: MuonH(ps, lr=0.05, foreach=foreach),
    "muonh_wd": lambda ps, foreach: MuonH(ps, lr=0.05, weight_decay=0.3, nesterov=False, foreach=foreach),
    "adamh": lambda ps, foreach: AdamH(ps, lr=0.05, foreach=foreach),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_batched_step_equals_per_matrix_step_in_float64(name: str) -> None:
    ref = _run(OPTIMIZERS[name], foreach=False, dtype=torch.float64)
    got = _run(OPTIMIZERS[name], foreach=True, dtype=torch.float64)
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_batched_step_equals_per_matrix_step_in_float32(name: str) -> None:
    ref = _run(OPTIMIZERS[name], foreach=False, dtype=torch.float32)
    got = _run(OPTIMIZERS[name], foreach=True, dtype=torch.float32)
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["muonh", "adamh"])
def test_batched_hypersphere_steps_keep_every_matrix_norm(name: str) -> None:
    before = _params(torch.float32)
    after = _run(OPTIMIZERS[name], foreach=True, dtype=torch.float32)
    for w0, w1 in zip(before, after, strict=True):
        n0 = w0.detach().norm(dim=(-2, -1))
        torch.testing.assert_close(w1.norm(dim=(-2, -1)), n0, rtol=1e-5, atol=0)
        assert (w1 - w0.detach()).norm() > 1e-2


def test_bf16_params_keep_float32_radius_under_the_batched_step() -> None:
    params = _params(torch.bfloat16)
    norms = [p.detach().float().norm(dim=(-2, -1)) for p in params]
    opt = MuonH(params, lr=0.05)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn_like(p)
        opt.step()
    for p, n0 in zip(params, norms, strict=True):
        assert opt.state[p]["c_W"].dtype == torch.float32
        torch.testing.assert_close(p.detach().float().norm(dim=(-2, -1)), n0, rtol=8e-3, atol=0)  # bf16 rounding


def test_orthogonalise_batches_each_shape_once_and_equals_each_matrix() -> None:
    gen = torch.Generator().manual_seed(3)
    mats = [torch.randn(*s, generator=gen, dtype=torch.float64) for s in SHAPES]
    assert sorted(len(v) for v in batched.buckets(mats).values()) == [1, 1, 1, 3]
    out = batched.orthogonalise(mats, steps=5)
    for m, o in zip(mats, out, strict=True):
        assert o.shape == m.shape
        torch.testing.assert_close(o, newton_schulz5(m), rtol=0, atol=1e-12)


def test_build_optimizers_batched_equals_per_matrix_over_training() -> None:
    """The hyperp arm on a model with every role: 10 steps, batched vs per-matrix, same weights."""
    runs = []
    for foreach in (True, False):
        model = TinyRolesModel(seed=5)
        opts = build_optimizers(model, "hyperp", lr=0.05, depth=8, width=16, tokens=1e9)
        for group in opts.param_groups:
            if "foreach" in group and group["role"] in ("hidden", "head"):
                group["foreach"] = foreach
        for step in range(10):
            inputs, targets = batch(step)
            opts.zero_grad()
            loss_fn(model, inputs, targets).backward()
            opts.step()
        runs.append(hidden_matrices(model))
    for name, w in runs[0].items():
        torch.testing.assert_close(w, runs[1][name], rtol=1e-4, atol=1e-5, msg=name)


def test_state_dict_of_a_batched_optimizer_resumes_the_same() -> None:
    params = _params(torch.float32)
    opt = MuonH(params, lr=0.05)
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    saved_params = [p.detach().clone() for p in params]
    saved = copy.deepcopy(opt.state_dict())
    opt.step()
    expected = [p.detach().clone() for p in params]
    fresh = [torch.nn.Parameter(w.clone()) for w in saved_params]
    resumed = MuonH(fresh, lr=0.05)
    resumed.load_state_dict(saved)
    for p in fresh:
        p.grad = torch.ones_like(p)
    resumed.step()
    for e, p in zip(expected, fresh, strict=True):
        torch.testing.assert_close(p.detach(), e, rtol=0, atol=0)
