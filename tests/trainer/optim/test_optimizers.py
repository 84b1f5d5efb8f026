"""Muon, MuonH, AdamH and Newton-Schulz: the invariants the spec (HYPERP.md section 1) states."""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest
import torch

from hyperwatch.trainer.optim import AdamH, Muon, MuonH, OptimizerSet, build_optimizers
from hyperwatch.trainer.optim.newton_schulz import NS_COEFFICIENTS, newton_schulz5
from tests.trainer.optim.models import TinyRolesModel, batch, hidden_matrices, loss_fn

# Singular values of NS5's output, measured on the Gaussian matrices below (fp32, CPU): 0.682 .. 1.134.
# The scalar map x -> p(p(p(p(p(x))))) with p(x) = a x + b x^3 + c x^5 sends every
# x = sigma / ||G||_F in [1.5e-3, 1] into [0.680, 1.2024]; the band below allows fp32 rounding.
NS_BAND = (0.67, 1.21)
NS_MIN_RELATIVE_SIGMA = 1.5e-3


def _well_conditioned_square(n: int, gen: torch.Generator) -> torch.Tensor:
    q1, _ = torch.linalg.qr(torch.randn(n, n, generator=gen))
    q2, _ = torch.linalg.qr(torch.randn(n, n, generator=gen))
    sigma = torch.linspace(0.05, 3.0, n)
    return q1 @ torch.diag(sigma) @ q2.T


@pytest.mark.parametrize("shape", [(16, 64), (64, 16), (128, 32), (300, 40), (4, 24, 96), (3, 96, 24)])
def test_newton_schulz_singular_values_lie_in_the_measured_band(shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(len(shape) * 100 + shape[-1])
    G = torch.randn(*shape, generator=gen)
    relative = torch.linalg.svdvals(G) / G.norm(dim=(-2, -1), keepdim=True)[..., 0]
    assert relative.min() >= NS_MIN_RELATIVE_SIGMA  # precondition of the band
    sigma = torch.linalg.svdvals(newton_schulz5(G))
    assert sigma.min() >= NS_BAND[0] and sigma.max() <= NS_BAND[1], (sigma.min(), sigma.max())


def test_newton_schulz_square_well_conditioned_and_scale_invariant() -> None:
    gen = torch.Generator().manual_seed(5)
    G = _well_conditioned_square(48, gen)
    out = newton_schulz5(G)
    sigma = torch.linalg.svdvals(out)
    assert sigma.min() >= NS_BAND[0] and sigma.max() <= NS_BAND[1]
    # The input is normalised by its Frobenius norm first, so scaling G changes nothing.
    torch.testing.assert_close(newton_schulz5(1000.0 * G), out, rtol=1e-5, atol=1e-6)
    # The left and right singular vectors are G's: out ~ U f(S) V^T, so out^T G is symmetric PSD.
    sym = out.T @ G
    torch.testing.assert_close(sym, sym.T, rtol=1e-4, atol=1e-4)
    assert torch.linalg.eigvalsh(0.5 * (sym + sym.T)).min() > 0


def test_newton_schulz_batched_equals_each_matrix_and_keeps_dtype() -> None:
    gen = torch.Generator().manual_seed(1)
    G = torch.randn(5, 12, 20, generator=gen, dtype=torch.float64)
    out = newton_schulz5(G)
    assert out.dtype == torch.float64 and out.shape == G.shape
    for e in range(G.shape[0]):
        torch.testing.assert_close(out[e], newton_schulz5(G[e]), rtol=0, atol=1e-12)


def test_newton_schulz_rejects_vectors() -> None:
    with pytest.raises(ValueError, match=r"\(\.\.\., rows, cols\)"):
        newton_schulz5(torch.ones(4))


def _naive_ns5(G: torch.Tensor) -> torch.Tensor:
    """One matrix, written out from the spec without batching tricks."""
    a, b, c = NS_COEFFICIENTS
    X = G.clone()
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.T
    X = X / (torch.sqrt((X * X).sum()) + 1e-7)
    for _ in range(5):
        A = X @ X.T
        X = a * X + b * (A @ X) + c * (A @ A @ X)
    return X.T if tall else X


def test_muon_matches_a_naive_reference_over_two_steps() -> None:
    gen = torch.Generator().manual_seed(2)
    W2 = torch.randn(6, 10, generator=gen, dtype=torch.float64)
    W3 = torch.randn(3, 9, 4, generator=gen, dtype=torch.float64)
    grads = [(torch.randn_like(W2), torch.randn_like(W3)) for _ in range(2)]
    p2, p3 = torch.nn.Parameter(W2.clone()), torch.nn.Parameter(W3.clone())
    peak, lam, m = 0.1, 0.3, 0.95
    opt = Muon([p2, p3], lr=peak, momentum=m, weight_decay=lam)

    ref = [W2.clone(), W3.clone()]
    bufs = [torch.zeros_like(W2), torch.zeros_like(W3)]
    for step, (g2, g3) in enumerate(grads):
        lr = peak if step == 0 else 0.5 * peak  # the second step runs at half the peak LR
        opt.param_groups[0]["lr"] = lr
        p2.grad, p3.grad = g2.clone(), g3.clone()
        opt.step()
        for i, g in enumerate((g2, g3)):
            bufs[i] = m * bufs[i] + g
            nesterov = g + m * bufs[i]
            if nesterov.ndim == 2:
                update = _naive_ns5(nesterov)
            else:
                update = torch.stack([_naive_ns5(nesterov[e]) for e in range(nesterov.shape[0])])
            ref[i] = ref[i] - (lr / peak) * lam * ref[i]
            ref[i] = ref[i] - lr * update
    torch.testing.assert_close(p2.detach(), ref[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(p3.detach(), ref[1], rtol=0, atol=1e-12)


def _train(model: TinyRolesModel, opt: torch.optim.Optimizer | OptimizerSet, steps: int, seed: int = 0) -> None:
    for step in range(steps):
        inputs, targets = batch(seed + step)
        opt.zero_grad(set_to_none=True)
        loss_fn(model, inputs, targets).backward()
        opt.step()


def test_muonh_and_adamh_keep_every_matrix_norm_for_50_steps() -> None:
    """float32; every 2-D matrix, every expert of the 3-D stack (MuonH) and the head (AdamH).

    The hyperp arm (eta = 0.05 * (10.4e9/1e9)^0.32 ~ 0.106); the muonh arm runs the same code."""
    model = TinyRolesModel(seed=3)
    initial = {name: w.clone() for name, w in hidden_matrices(model).items()}
    opts = build_optimizers(model, "hyperp", lr=0.05, depth=8, width=16, tokens=1e9)
    _train(model, opts, steps=50)
    final = hidden_matrices(model)
    assert set(final) >= {"head.weight", "experts[0]", "experts[2]", "up.weight", "router.weight"}
    for name, w0 in initial.items():
        n0, n1 = w0.norm().item(), final[name].norm().item()
        assert abs(n1 - n0) / n0 < 1e-5, (name, n0, n1)
        moved = (final[name] - w0).norm().item() / n0
        assert moved > 1e-2, (name, moved)  # the optimizer really moved it


def test_muon_does_not_keep_norms() -> None:
    """Control for the test above: plain Muon's steps change the norms."""
    model = TinyRolesModel(seed=3)
    initial = {name: w.norm().item() for name, w in hidden_matrices(model).items()}
    _train(model, build_optimizers(model, "muon", lr=0.05, depth=8, width=16, tokens=1e9), steps=10)
    drift = max(abs(w.norm().item() - initial[n]) / initial[n] for n, w in hidden_matrices(model).items())
    assert drift > 1e-3


def _run_with_decay(kind: str, lr: float, lam: float, steps: int = 5) -> torch.Tensor:
    """Train the hidden matrices of a float64 model with one optimizer; return them flattened."""
    model = TinyRolesModel(seed=4, dtype=torch.float64)
    params = [p for n, p in model.named_parameters() if model.parameter_roles()[n] == "hidden"]
    for n, p in model.named_parameters():
        p.requires_grad_(model.parameter_roles()[n] == "hidden")
    opt: torch.optim.Optimizer
    if kind == "muonh":
        opt = MuonH(params, lr=lr, weight_decay=lam)
    elif kind == "adamw":
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=lam)
    else:  # Muon's decay is independent of the LR: lr * lam makes it the same decay per step
        opt = Muon(params, lr=lr, weight_decay=lr * lam)
    _train(model, opt, steps)
    return torch.cat([p.detach().flatten() for p in params])


@pytest.mark.parametrize(("kind", "order"), [("muonh", 2), ("adamw", 1), ("muon", 1)])
def test_weight_decay_changes_muonh_only_at_second_order(kind: str, order: int) -> None:
    """The decay shrinks W by lr*lam per step in all three. The trajectory change it causes is
    O(lr^2 * lam) under MuonH (halving lr quarters it) and O(lr * lam) under AdamW and Muon."""
    lam = 0.5
    diffs = []
    for lr in (0.01, 0.005):
        with_decay = _run_with_decay(kind, lr, lam)
        without = _run_with_decay(kind, lr, 0.0)
        diffs.append((with_decay - without).norm().item())
    assert diffs[1] > 0
    ratio = diffs[0] / diffs[1]
    assert abs(ratio - 2**order) < 0.2 * 2**order, (kind, diffs, ratio)


def test_state_dict_round_trip_restores_c_w_and_the_next_steps() -> None:
    model_a = TinyRolesModel(seed=6)
    opts_a = build_optimizers(model_a, "hyperp", lr=0.05, depth=8, width=16, tokens=1e9)
    _train(model_a, opts_a, steps=3)
    buffer = io.BytesIO()
    torch.save({"model": model_a.state_dict(), "optim": opts_a.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)

    model_b = TinyRolesModel(seed=7)  # a different init: everything must come from the checkpoint
    model_b.load_state_dict(saved["model"])
    opts_b = build_optimizers(model_b, "hyperp", lr=0.05, depth=8, width=16, tokens=1e9)
    opts_b.load_state_dict(saved["optim"])

    for key in ("muonh", "adamh"):
        state_a = opts_a.optimizers[key].state
        state_b = opts_b.optimizers[key].state
        params_a = [p for g in opts_a.optimizers[key].param_groups for p in g["params"]]
        params_b = [p for g in opts_b.optimizers[key].param_groups for p in g["params"]]
        for pa, pb in zip(params_a, params_b, strict=True):
            assert torch.equal(state_a[pa]["c_W"], state_b[pb]["c_W"])
    _train(model_a, opts_a, steps=2, seed=100)
    _train(model_b, opts_b, steps=2, seed=100)
    for (name, pa), pb in zip(model_a.named_parameters(), model_b.parameters(), strict=True):
        assert torch.equal(pa, pb), name


def test_load_state_dict_keeps_c_w_in_float32_for_bf16_params() -> None:
    p = torch.nn.Parameter(torch.randn(8, 12, dtype=torch.bfloat16))
    opt = MuonH([p], lr=0.01)
    p.grad = torch.randn_like(p)
    opt.step()
    c_w = opt.state[p]["c_W"]
    assert c_w.dtype == torch.float32
    q = torch.nn.Parameter(p.detach().clone())
    restored = MuonH([q], lr=0.01)
    restored.load_state_dict(opt.state_dict())
    assert restored.state[q]["c_W"].dtype == torch.float32
    assert torch.equal(restored.state[q]["c_W"], c_w)
    assert restored.state[q]["c_W"] is not c_w


def test_c_w_is_per_expert_matrix() -> None:
    gen = torch.Generator().manual_seed(8)
    scales = torch.tensor([0.5, 1.0, 4.0]).view(3, 1, 1)
    p = torch.nn.Parameter(torch.randn(3, 6, 5, generator=gen) * scales)
    norms = p.detach().norm(dim=(-2, -1))
    opt = MuonH([p], lr=0.1)
    for _ in range(5):
        p.grad = torch.randn(3, 6, 5, generator=gen)
        opt.step()
    torch.testing.assert_close(p.detach().norm(dim=(-2, -1)), norms, rtol=1e-6, atol=0)
    assert opt.state[p]["c_W"].shape == (3, 1, 1)


def test_adamh_keeps_head_norm_and_moves_by_lr() -> None:
    gen = torch.Generator().manual_seed(9)
    p = torch.nn.Parameter(torch.randn(32, 16, generator=gen, dtype=torch.float64))
    before = p.detach().clone()
    opt = AdamH([p], lr=1e-3)
    p.grad = torch.randn(32, 16, generator=gen, dtype=torch.float64)
    opt.step()
    rel_step = ((p.detach() - before).norm() / before.norm()).item()
    assert abs(p.detach().norm().item() - before.norm().item()) < 1e-12 * before.norm().item()
    # ||G_hat|| = c_W, so the relative step is lr to first order whatever the gradient's size.
    assert abs(rel_step - 1e-3) < 1e-4


def test_zero_norm_matrix_is_refused_with_the_fix() -> None:
    p = torch.nn.Parameter(torch.zeros(4, 4))
    opt = MuonH([{"params": [("blocks.0.o_proj.weight", p)]}], lr=0.1)
    p.grad = torch.ones(4, 4)
    with pytest.raises(ValueError, match=r"blocks\.0\.o_proj\.weight.*zero Frobenius norm.*AdamW"):
        opt.step()


@pytest.mark.parametrize("cls", [Muon, MuonH, AdamH])
def test_matrix_optimizers_refuse_vectors(cls: Callable[..., torch.optim.Optimizer]) -> None:
    with pytest.raises(ValueError, match="AdamW"):
        cls([torch.nn.Parameter(torch.ones(5))])


def test_bad_hyperparameters_are_named() -> None:
    p = torch.nn.Parameter(torch.ones(2, 2))
    with pytest.raises(ValueError, match="momentum"):
        Muon([p], momentum=1.5)
    with pytest.raises(ValueError, match="lr"):
        MuonH([p], lr=-1.0)
    with pytest.raises(ValueError, match=r"betas\[1\]"):
        AdamH([p], betas=(0.9, 1.0))
