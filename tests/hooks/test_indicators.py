"""Each indicator against a naive reference computed on the same tensors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hooks import indicators
from hooks.accumulate import Accumulator


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
    x[0, 0] = math.inf
    assert math.isinf(float(indicators.branch_sums(x)[0])) or math.isnan(float(indicators.branch_sums(x)[0]))


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
