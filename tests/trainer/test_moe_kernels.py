"""The grouped-GEMM expert kernel against the per-expert loop, and the MoE's detached state."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch._subclasses.fake_tensor import DataDependentOutputException as DataDependent
from torch._subclasses.fake_tensor import DynamicOutputShapeException as DynamicShape
from torch._subclasses.fake_tensor import FakeTensorMode

from hyperwatch.trainer.model import Transformer
from hyperwatch.trainer.moe import AuxLosses, MoE, expert_counts, grouped_mm_available
from tests.trainer.conftest import tiny_model_config

pytestmark = pytest.mark.skipif(not grouped_mm_available(torch.device("cpu")), reason="torch without _grouped_mm")


def _pair(**overrides: object) -> tuple[MoE, MoE]:
    """Two MoE layers with the same weights, one per kernel (tiny sizes are 16-byte aligned in bf16)."""
    cfg = tiny_model_config(moe=True, moe_sparsity=2, moe_granularity=4, **overrides)
    loop = MoE(dataclasses.replace(cfg, expert_kernel="loop"), 0)
    grouped = MoE(dataclasses.replace(cfg, expert_kernel="grouped"), 0)
    grouped.load_state_dict(loop.state_dict())
    return loop, grouped


def _run(moe: MoE, x: torch.Tensor, autocast: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    x = x.clone().requires_grad_()
    aux = AuxLosses()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = moe(x, aux_out=aux)
    (out.float().square().mean() + aux.losses[0]).backward()
    grads = {n: p.grad.clone() for n, p in moe.named_parameters() if p.grad is not None}
    assert x.grad is not None
    grads["x"] = x.grad
    return out.detach().float(), grads


def test_grouped_equals_loop_in_fp32() -> None:
    loop, grouped = _pair()
    x = torch.randn(3, 16, loop.router.in_features)
    out_l, g_l = _run(loop, x, autocast=False)
    out_g, g_g = _run(grouped, x, autocast=False)
    torch.testing.assert_close(out_g, out_l, rtol=1e-5, atol=1e-6)
    assert g_l.keys() == g_g.keys() and {"experts.w1", "experts.w2", "experts.w3", "router.weight"} <= g_l.keys()
    for name in g_l:
        torch.testing.assert_close(g_g[name], g_l[name], rtol=1e-4, atol=1e-6, msg=name)
    assert torch.equal(grouped.counts, loop.counts)  # type: ignore[arg-type]
    assert torch.equal(grouped.aux_loss, loop.aux_loss)  # type: ignore[arg-type]


def test_grouped_equals_loop_under_bf16_autocast() -> None:
    loop, grouped = _pair()
    x = torch.randn(3, 16, loop.router.in_features)
    out_l, g_l = _run(loop, x, autocast=True)
    out_g, g_g = _run(grouped, x, autocast=True)
    scale = out_l.abs().max()
    torch.testing.assert_close(out_g, out_l, rtol=2e-2, atol=2e-2 * float(scale))
    for name in g_l:
        ref = g_l[name]
        err = (g_g[name] - ref).abs().max() / ref.abs().max().clamp_min(1e-12)
        assert err < 3e-2, f"{name}: relative max error {float(err):.3g}"
    assert torch.equal(grouped.counts, loop.counts)  # type: ignore[arg-type]  # routing is fp32 in both


def test_experts_nobody_picks_get_zero_gradient() -> None:
    loop, grouped = _pair()
    with torch.no_grad():
        for m in (loop, grouped):
            m.router.weight[3:].fill_(-1e3)  # only experts 0..2 ever win: 3 experts, Top-3
            m.router.weight[:3].zero_()
    x = torch.randn(2, 8, loop.router.in_features).abs()
    _, g_l = _run(loop, x, autocast=False)
    _, g_g = _run(grouped, x, autocast=False)
    assert int(grouped.counts[3:].sum()) == 0  # type: ignore[index]
    assert torch.count_nonzero(g_g["experts.w1"][3:]) == 0
    torch.testing.assert_close(g_g["experts.w2"], g_l["experts.w2"], rtol=1e-4, atol=1e-6)


def test_grouped_forward_never_reads_device_values_on_the_host() -> None:
    """Under fake tensors any .item()/.tolist()/bincount-size read raises: the grouped path has none."""
    _, grouped = _pair()
    grouped = grouped.to(torch.bfloat16)  # the meta kernel of _grouped_mm takes bf16 only, as CUDA does
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        x = mode.from_tensor(torch.randn(2, 8, grouped.router.in_features, dtype=torch.bfloat16))
        out = grouped(x)
        assert out.shape == x.shape


def test_the_loop_kernel_does_read_counts_on_the_host() -> None:
    """The control for the test above: the fake-tensor probe does catch the loop's bincount().tolist()."""
    loop, _ = _pair()
    loop = loop.to(torch.bfloat16)
    with (
        FakeTensorMode(allow_non_fake_inputs=True) as mode,
        pytest.raises((DataDependent, DynamicShape)),
    ):
        loop(mode.from_tensor(torch.randn(2, 8, loop.router.in_features, dtype=torch.bfloat16)))


def test_grouped_kernel_that_cannot_run_says_so() -> None:
    cfg = tiny_model_config(moe=True, moe_sparsity=2, moe_granularity=4, expert_kernel="grouped")
    moe = MoE(cfg, 0)
    x = torch.randn(1, 4, cfg.width, dtype=torch.float64)  # fp64 is not a grouped-GEMM dtype on any device
    moe = moe.double()
    with pytest.raises(RuntimeError, match="expert_kernel='auto'"):
        moe(x)


def test_auto_takes_the_loop_on_cpu() -> None:
    cfg = tiny_model_config(moe=True)
    assert not MoE(cfg, 0).experts.use_grouped(torch.randn(2, cfg.width))


def test_expert_counts_equal_bincount() -> None:
    flat = torch.randint(0, 7, (500,))
    assert torch.equal(expert_counts(flat, 9), torch.bincount(flat, minlength=9))


def test_deepcopy_of_the_moe_model_after_forward_and_backward() -> None:
    cfg = tiny_model_config(moe=True, moe_sparsity=2, moe_granularity=4)
    model = Transformer(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, 16))
    out = model(idx, idx)
    clone = copy.deepcopy(model)  # before backward: the graph is alive, nothing of it on a module
    assert out.loss is not None
    out.loss.backward()
    clone2 = copy.deepcopy(model)
    for c in (clone, clone2):
        again = c(idx, idx)
        assert again.aux_loss is not None and again.aux_loss.requires_grad
    for m in model.moe_layers:
        assert m.aux_loss is not None and m.aux_loss.grad_fn is None and not m.aux_loss.requires_grad


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_grouped_cuda_forward_and_backward_without_host_sync() -> None:
    loop, grouped = _pair()
    loop, grouped = loop.cuda(), grouped.cuda()
    x = torch.randn(4, 64, loop.router.in_features, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):  # the experts compute in bf16: the grouped kernel's dtype
        assert grouped.experts.use_grouped(x)
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = grouped(x)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = loop(x)
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2 * float(ref.abs().max()))


def test_grouped_moe_compiles_as_one_graph_with_its_backward() -> None:
    """fullgraph=True fails on any graph break (a .tolist(), a data-dependent shape): the loop has one."""
    loop, grouped = _pair()
    grouped, loop = grouped.to(torch.bfloat16), loop.to(torch.bfloat16)
    x = torch.randn(2, 8, grouped.router.in_features, dtype=torch.bfloat16)
    out = torch.compile(grouped, fullgraph=True, backend="aot_eager")(x)
    out.float().square().sum().backward()
    assert grouped.experts.w1.grad is not None and grouped.router.weight.grad is not None
    torch.testing.assert_close(out.float(), loop(x).float(), rtol=2e-2, atol=2e-2)


def test_moe_transformer_traces_as_one_graph_under_bf16_autocast() -> None:
    """The whole MoE model, aux-loss collector included, is one dynamo graph with no break."""
    cfg = tiny_model_config(moe=True, moe_sparsity=2, moe_granularity=4, expert_kernel="grouped")
    model = Transformer(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        explained = torch._dynamo.explain(model)(idx, idx)
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
    assert explained.graph_count == 1
