"""Each indicator against a naive reference computed on the same tensors."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from hyperwatch.hooks import indicators
from hyperwatch.hooks.accumulate import Accumulator
from hyperwatch.hooks.intercept import cpu_flash_with_lse


def explicit_lse(q, k, mask=None, is_causal=False, scale=None, enable_gqa=False):  # type: ignore[no-untyped-def]
    """Materialize every score, mask, logsumexp: the reference."""
    if enable_gqa:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    scale = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else s + mask.double()
    if is_causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), -math.inf)
    return torch.logsumexp(s, dim=-1)


@pytest.mark.parametrize("chunk", [1, 37, 1 << 22])
def test_attention_lse_causal_gqa_matches_materialized_scores(chunk: int) -> None:
    torch.manual_seed(0)
    q, k = torch.randn(2, 6, 11, 8) * 3, torch.randn(2, 3, 11, 8) * 3
    got = indicators.attention_lse(q, k, is_causal=True, enable_gqa=True, chunk_elements=chunk)
    ref = explicit_lse(q, k, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)


def test_attention_lse_bool_and_additive_masks_and_scale() -> None:
    torch.manual_seed(1)
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 9, 8)
    mask = torch.rand(2, 1, 5, 9) > 0.3
    mask[..., 0] = True  # every row keeps a key
    got = indicators.attention_lse(q, k, attn_mask=mask, scale=0.7, chunk_elements=50)
    torch.testing.assert_close(got.double(), explicit_lse(q, k, mask, scale=0.7), rtol=1e-5, atol=1e-5)
    bias = torch.randn(1, 4, 5, 9)
    got = indicators.attention_lse(q, k, attn_mask=bias, chunk_elements=50)
    torch.testing.assert_close(got.double(), explicit_lse(q, k, bias), rtol=1e-5, atol=1e-5)


def test_attention_lse_half_precision_fully_masked_rows_and_infinite_scores() -> None:
    torch.manual_seed(5)
    q, k = torch.randn(2, 4, 9, 16) * 2, torch.randn(2, 2, 9, 16) * 2
    ref = explicit_lse(q.bfloat16().float(), k.bfloat16().float(), is_causal=True, enable_gqa=True)
    got = indicators.attention_lse(q.bfloat16(), k.bfloat16(), is_causal=True, enable_gqa=True, chunk_elements=40)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), ref, rtol=1e-2, atol=2e-2)  # scores rounded to bf16
    mask = torch.ones(2, 1, 9, 9, dtype=torch.bool)
    mask[0, 0, 3] = False  # query 3 of batch 0 sees no key: no softmax at all
    got = indicators.attention_lse(q, k, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(got.double(), explicit_lse(q, k, mask, enable_gqa=True), rtol=1e-5, atol=1e-5)
    assert torch.isneginf(got[0, :, 3]).all() and torch.isfinite(got[1]).all()
    k[0, 0, 2, 0] = math.inf  # an infinite score is a training fact: LSE +inf, not NaN
    got = indicators.attention_lse(q.abs(), k, is_causal=True, enable_gqa=True)
    assert torch.isposinf(got[0, 0, 2:]).all()


def test_cpu_flash_answers_sdpa_bit_identically_with_the_reference_lse() -> None:
    """The SDPA interception's fast path: same output and gradients as SDPA, LSE as the reference."""
    torch.manual_seed(6)
    q, k, v = torch.randn(2, 4, 10, 8), torch.randn(2, 2, 10, 8), torch.randn(2, 2, 10, 8)
    mask = torch.rand(2, 1, 10, 10) > 0.4
    mask[..., 0] = True
    mask[1, 0, 7] = False  # a fully masked query row
    cases: list[tuple[dict[str, Any], torch.Tensor]] = [
        ({"is_causal": True, "enable_gqa": True}, explicit_lse(q, k, is_causal=True, enable_gqa=True)),
        ({"attn_mask": mask, "enable_gqa": True, "scale": 0.3}, explicit_lse(q, k, mask, scale=0.3, enable_gqa=True)),
    ]
    for kwargs, ref in cases:
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        want = F.scaled_dot_product_attention(leaves[0], leaves[1], leaves[2], **kwargs)
        want.square().sum().backward()
        want_grads = [t.grad for t in leaves if t.grad is not None]
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        fused = cpu_flash_with_lse({"query": leaves[0], "key": leaves[1], "value": leaves[2], **kwargs})
        assert fused is not None, kwargs
        out, lse = fused
        out.square().sum().backward()
        assert torch.equal(out, want)
        got_grads = [t.grad for t in leaves if t.grad is not None]
        assert len(got_grads) == len(want_grads) == 3
        assert all(torch.equal(a, b) for a, b in zip(got_grads, want_grads))
        torch.testing.assert_close(lse.double(), ref, rtol=1e-5, atol=1e-5)
    assert torch.isneginf(lse[1, :, 7]).all()  # the kernel says 0 there; no softmax means -inf
    # Another backend would run (dropout: the math backend): the call is left to SDPA.
    assert cpu_flash_with_lse({"query": q, "key": q, "value": q, "dropout_p": 0.5}) is None


def test_accumulator_every_row_attends_fast_path_equals_the_general_z() -> None:
    lse = torch.randn(2, 3, 17) * 4
    acc = Accumulator(2, [0, 0], torch.device("cpu"))
    acc.add_attention_lse(0, lse)
    acc.add_attention_lse(1, lse, every_row_attends=True)
    acc.add_attention_lse(1, lse[:1], every_row_attends=True)
    values = acc.unpack(acc.pack().numpy())
    both = torch.cat([lse, lse[:1]])
    assert values[0].attention_z == pytest.approx(float(lse.double().square().mean()), rel=1e-6)
    assert values[1].attention_z == pytest.approx(float(both.double().square().mean()), rel=1e-6)


def test_router_z_of_a_diverged_router_is_infinite_not_dropped() -> None:
    acc = Accumulator(1, [2], torch.device("cpu"))
    acc.add_router_logits(0, torch.tensor([[1.0, 2.0], [3.0, 0.5]]))
    ref = float(torch.logsumexp(torch.tensor([[1.0, 2.0], [3.0, 0.5]]), -1).square().mean())
    assert acc.unpack(acc.pack().numpy())[0].router_z == pytest.approx(ref, rel=1e-6)
    acc.add_router_logits(0, torch.tensor([[-math.inf, -math.inf]]))  # LSE -inf: Z = +inf
    assert acc.unpack(acc.pack().numpy())[0].router_z == math.inf


def test_attention_lse_rejects_head_mismatch_without_gqa() -> None:
    with pytest.raises(ValueError, match="enable_gqa"):
        indicators.attention_lse(torch.randn(1, 4, 3, 8), torch.randn(1, 2, 3, 8))


def test_z_sums_skip_fully_masked_rows_and_keep_nan() -> None:
    lse = torch.tensor([2.0, -math.inf, torch.finfo(torch.float32).min, 3.0])
    total, n = indicators.z_sums(lse)
    assert float(total) == 13.0 and int(n) == 2
    total, n = indicators.z_sums(torch.tensor([1.0, math.nan]))
    assert math.isnan(float(total)) and int(n) == 2


def test_branch_sums_match_direct_rms_and_outlier_count() -> None:
    torch.manual_seed(2)
    x = torch.randn(3, 7, 64)
    x[0, 1, 5] = 40.0
    x[2, 6, 0] = -35.0
    x[1, 2] = 0.0  # a constant token has no outliers
    sumsq, outliers = indicators.branch_sums(x)
    assert math.isclose(float(sumsq), float(x.double().square().sum()), rel_tol=1e-6)
    mean = x.double().mean(-1, keepdim=True)
    sigma = x.double().std(-1, correction=0, keepdim=True)
    direct = int(((x.double() - mean).abs() > 5 * sigma).sum())
    assert direct >= 2
    assert int(outliers) == direct


def test_branch_sums_bf16_and_nonfinite_are_faithful() -> None:
    x = torch.randn(4, 16).to(torch.bfloat16)
    sumsq, _ = indicators.branch_sums(x)
    assert math.isclose(float(sumsq), float(x.double().square().sum()), rel_tol=1e-5)
    x = torch.randn(4, 16)
    x[0, 0] = -math.inf
    sumsq, outliers = indicators.branch_sums(x)
    assert float(sumsq) == math.inf  # an infinite element: the sum of squares is infinite, not NaN
    assert int(outliers) == 0  # the Inf token has no finite sigma; the other tokens are Gaussian
    x[0, 0] = math.nan
    assert math.isnan(float(indicators.branch_sums(x)[0]))


def test_branch_sums_outliers_against_float64_on_large_and_shifted_tokens() -> None:
    """Tokens with a large common offset (mean >> sigma) and heavy tails: exact count, exact rms."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 33, 128, generator=g) + 50.0 * torch.randn(6, 33, 1, generator=g)
    x += (torch.rand(x.shape, generator=g) < 0.002) * 30.0  # sparse spikes
    sumsq, outliers = indicators.branch_sums(x)
    xd = x.double()
    mean, sigma = xd.mean(-1, keepdim=True), xd.std(-1, correction=0, keepdim=True)
    assert int(outliers) == int(((xd - mean).abs() > 5 * sigma).sum()) > 0
    assert math.isclose(float(sumsq), float(xd.square().sum()), rel_tol=1e-6)


def test_max_vio() -> None:
    assert indicators.max_vio([10.0, 10.0, 10.0]) == 0.0
    assert indicators.max_vio([30.0, 10.0, 20.0]) == pytest.approx(0.5)
    assert math.isnan(indicators.max_vio([0.0, 0.0]))
    with pytest.raises(ValueError, match="counts"):
        indicators.max_vio([])


def test_accumulator_over_micro_batches_equals_one_big_batch() -> None:
    torch.manual_seed(3)
    acc = Accumulator(2, [0, 4], torch.device("cpu"))
    parts = [torch.randn(2, 5, 16) for _ in range(3)]
    logits = [torch.randn(10, 4) for _ in range(3)]
    for x, z in zip(parts, logits):
        acc.add_branch(1, "mlp", x)
        acc.add_router_logits(1, z)
        acc.add_expert_counts(1, indicators.expert_counts(z.topk(2).indices, 4))
    values = acc.unpack(acc.pack().numpy())
    full, zs = torch.cat(parts), torch.cat(logits)
    assert values[0].mlp_rms is None and values[0].max_vio is None
    assert values[1].mlp_rms == pytest.approx(float(full.square().mean().sqrt()), rel=1e-6)
    assert values[1].router_z == pytest.approx(float(torch.logsumexp(zs, -1).square().mean()), rel=1e-6)
    counts = torch.bincount(zs.topk(2).indices.reshape(-1), minlength=4).double()
    assert values[1].max_vio == pytest.approx(float((counts.max() - counts.mean()) / counts.mean()))
    acc.reset()
    assert acc.unpack(acc.pack().numpy())[1].mlp_rms is None


def test_sdpa_semantics_of_reference_helper() -> None:
    """The reference itself agrees with torch's SDPA normalisation (softmax rows sum to one)."""
    q, k = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    v = torch.eye(4).expand(1, 2, 4, 4)
    probs = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    lse = explicit_lse(q, k, is_causal=True)
    s = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(8)
    s = s.masked_fill(~torch.ones(4, 4, dtype=torch.bool).tril(), -math.inf)
    torch.testing.assert_close(probs.double(), (s - lse.unsqueeze(-1)).exp(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("chunk", [1, 64, 1000, 1 << 18])
def test_branch_sums_in_cache_sized_row_slices_equal_one_pass(chunk: int) -> None:
    """Eager CPU walks the rows in slices; per-token values are the same, only the float64 sum
    over tokens groups differently. A NaN token in any slice still makes the total NaN."""
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(5, 33, 64, generator=g) * 3).bfloat16()
    x[1, 4, 9] = 60.0
    want = indicators.branch_sums(x)
    out = torch.zeros(2, dtype=torch.float64)
    indicators.add_branch_sums_(out, x, chunk_elements=chunk)
    assert out[1] == want[1] >= 1
    assert math.isclose(float(out[0]), float(want[0]), rel_tol=1e-12)
    x[3, 30, 1] = math.inf
    out.zero_()
    indicators.add_branch_sums_(out, x, chunk_elements=chunk)
    assert float(out[0]) == math.inf and out[1] == want[1]
    x[4, 0, 0] = math.nan
    out.zero_()
    indicators.add_branch_sums_(out, x.transpose(0, 1), chunk_elements=chunk)  # strided input too
    assert math.isnan(float(out[0])) and out[1] == want[1]
