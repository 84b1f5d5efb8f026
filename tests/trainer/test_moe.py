"""Transformer-Next-MoE: routing, SqrtGate, the Switch aux loss and MaxVio."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hyperwatch.trainer.moe import MoE, max_vio, switch_aux_loss
from tests.trainer.conftest import tiny_model_config


def test_expert_counts_follow_spec() -> None:
    cfg = tiny_model_config(moe=True, moe_sparsity=4, moe_granularity=4)
    assert cfg.n_routed_experts == 15 and cfg.moe_top_k == 3 and cfg.expert_hidden == 4 * 64 // 4
    no_shared = tiny_model_config(moe=True, moe_sparsity=4, moe_granularity=4, shared_expert=False)
    assert no_shared.n_routed_experts == 16 and no_shared.moe_top_k == 4


def test_dispatch_equals_a_per_token_loop() -> None:
    cfg = tiny_model_config(moe=True, parameterization="vanilla")
    moe = MoE(cfg, 0)
    x = torch.randn(2, 5, cfg.width)
    out = moe(x)
    xs = x.reshape(-1, cfg.width)
    logits = xs @ moe.router.weight.t()
    top, idx = logits.topk(cfg.moe_top_k, dim=-1)
    gates = torch.softmax(top, -1).sqrt()  # SqrtGate, softmax after Top-k
    ref = torch.zeros_like(xs)
    for n in range(xs.shape[0]):
        for j in range(cfg.moe_top_k):
            e = int(idx[n, j])
            h = F.silu(xs[n] @ moe.experts.w1[e].t()) * (xs[n] @ moe.experts.w3[e].t())
            ref[n] += gates[n, j] * (h @ moe.experts.w2[e].t())
    assert moe.shared is not None
    ref = (ref + moe.shared(xs)) / math.sqrt(2)
    torch.testing.assert_close(out.reshape(-1, cfg.width), ref, rtol=1e-5, atol=1e-5)
    assert int(moe.counts.sum()) == 10 * cfg.moe_top_k  # type: ignore[union-attr]


def _routed_rms(k: int, sqrt_gate: bool) -> float:
    """RMS of the routed branch alone for granularity k (Top-k of kS routed experts, S=1)."""
    torch.manual_seed(k)
    cfg = tiny_model_config(
        moe=True,
        moe_sparsity=1,
        moe_granularity=k,
        shared_expert=False,
        sqrt_gate=sqrt_gate,
        parameterization="vanilla",
        depth=2,
    )
    moe = MoE(cfg, 0)
    with torch.no_grad():
        moe.router.weight.normal_(0, 0.02)  # near-uniform gates: the weakly-correlated, equal-RMS regime
        x = torch.randn(4096, cfg.width)
        _logits, idx, w = moe.route(x)
        routed = moe.experts(x, idx, w)
    return float(routed.pow(2).mean().sqrt())


def test_sqrt_gate_keeps_routed_rms_while_classical_falls_like_inverse_sqrt_k() -> None:
    ks = [2, 4, 8, 16, 32, 64]
    sqrt_rms = [_routed_rms(k, True) for k in ks]
    classic = [_routed_rms(k, False) for k in ks]
    # SqrtGate: nearly constant (measured max/min 1.02 over k = 2..64; allow 1.2).
    assert max(sqrt_rms) / min(sqrt_rms) < 1.2, sqrt_rms
    # Classical: RMS * sqrt(k) is what stays constant, so RMS itself falls ~32x... by sqrt(64/2).
    scaled = [r * math.sqrt(k) for r, k in zip(classic, ks)]
    assert max(scaled) / min(scaled) < 1.2, scaled
    assert classic[0] / classic[-1] == pytest.approx(math.sqrt(32), rel=0.2)


def test_switch_aux_loss_on_a_hand_computed_example() -> None:
    # 4 routed experts, 4 tokens, top-1. Logits chosen so the full softmax is easy to write down.
    logits = torch.log(torch.tensor([
        [0.7, 0.1, 0.1, 0.1],
        [0.1, 0.7, 0.1, 0.1],
        [0.6, 0.2, 0.1, 0.1],
        [0.4, 0.3, 0.2, 0.1],
    ]))  # fmt: skip
    counts = torch.tensor([3, 1, 0, 0])  # argmax of each row
    probs_sum = torch.softmax(logits, -1).sum(0)  # [1.8, 1.3, 0.5, 0.4]
    # f = [0.75, 0.25, 0, 0]; P = [0.45, 0.325, 0.125, 0.1]; N = 4; gamma = 0.1
    expected = 0.1 * 4 * (0.75 * 0.45 + 0.25 * 0.325)
    got = switch_aux_loss(counts, probs_sum, 4.0, 0.1)
    assert float(got) == pytest.approx(expected, rel=1e-6)
    assert expected == pytest.approx(0.1675)


def test_moe_layer_aux_loss_uses_its_router() -> None:
    cfg = tiny_model_config(moe=True, aux_loss_gamma=0.3)
    moe = MoE(cfg, 0)
    x = torch.randn(1, 16, cfg.width)
    moe(x)
    logits = x.reshape(-1, cfg.width) @ moe.router.weight.t()
    counts = torch.bincount(logits.topk(cfg.moe_top_k, -1).indices.reshape(-1), minlength=cfg.n_routed_experts)
    assert torch.equal(moe.counts, counts)  # type: ignore[arg-type]
    f = counts.float() / counts.sum()
    p = torch.softmax(logits, -1).mean(0)
    torch.testing.assert_close(moe.aux_loss, 0.3 * cfg.n_routed_experts * (f * p).sum())


def test_max_vio_counts() -> None:
    assert float(max_vio(torch.tensor([4, 2, 2, 0]))) == pytest.approx(1.0)
    assert float(max_vio(torch.tensor([5, 5, 5]))) == 0.0
    assert float(max_vio(torch.tensor([12, 0, 0, 0]))) == pytest.approx(3.0)  # all on one expert: E-1


def test_router_runs_in_fp32_under_bf16_autocast() -> None:
    cfg = tiny_model_config(moe=True)
    moe = MoE(cfg, 0)
    moe.capture = True
    with torch.autocast("cpu", dtype=torch.bfloat16):
        moe(torch.randn(1, 8, cfg.width))
    assert moe.router_logits is not None and moe.router_logits.dtype == torch.float32
