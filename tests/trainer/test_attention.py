"""The LSE attention kernel: outputs, gradients and log-sum-exp against explicit references."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hyperwatch.trainer.attention import FLASH_LSE, SDPA_FALLBACK, causal_attention, chunked_causal_lse


def explicit_lse(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    scores = (q.double() @ k.double().transpose(-1, -2)) * scale
    T = q.shape[2]
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    return scores.masked_fill(mask, float("-inf")).logsumexp(-1)


@pytest.mark.parametrize("T", [1, 7, 64])
def test_flash_lse_matches_explicit_masked_logsumexp(T: int) -> None:
    q, k, v = (torch.randn(2, 3, T, 16) * 2 for _ in range(3))
    out, lse, path = causal_attention(q, k, v, 16**-0.5, need_lse=True)
    assert path == FLASH_LSE
    assert lse is not None and lse.shape == (2, 3, T)
    torch.testing.assert_close(lse.double(), explicit_lse(q, k, 16**-0.5), rtol=1e-5, atol=1e-5)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=16**-0.5)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_flash_backward_matches_sdpa_gradients() -> None:
    q, k, v = (torch.randn(2, 2, 24, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out, _, _ = causal_attention(q, k, v, 0.3, need_lse=False)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), g)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3)
    ref_grads = torch.autograd.grad(ref, (q, k, v), g)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-7)


def test_gradcheck_of_the_autograd_function() -> None:
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    assert torch.autograd.gradcheck(lambda a, b, c: causal_attention(a, b, c, 0.5, need_lse=False)[0], (q, k, v))


def test_sdpa_fallback_reports_itself_and_computes_lse_in_chunks() -> None:
    q, k, v = (torch.randn(1, 2, 50, 8) for _ in range(3))
    _out, lse, path = causal_attention(q, k, v, 0.35, need_lse=True, kernel="sdpa")
    assert path == SDPA_FALLBACK
    assert lse is not None
    torch.testing.assert_close(lse.double(), explicit_lse(q, k, 0.35), rtol=1e-5, atol=1e-5)
    # chunks smaller than T still give the same answer
    torch.testing.assert_close(chunked_causal_lse(q, k, 0.35, chunk=7), lse)
    _, none, _ = causal_attention(q, k, v, 0.35, need_lse=False, kernel="sdpa")
    assert none is None


def test_first_query_lse_is_its_own_score() -> None:
    q, k, v = (torch.randn(1, 1, 4, 8) for _ in range(3))
    _, lse, _ = causal_attention(q, k, v, 1.0, need_lse=True)
    assert lse is not None
    assert math.isclose(float(lse[0, 0, 0]), float((q[0, 0, 0] * k[0, 0, 0]).sum()), rel_tol=1e-5)
