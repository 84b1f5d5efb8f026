"""The stability indicators of spec section 4, as device-side reductions.

Every function here returns *sums* (and, where the count depends on the data, counts) as 0-d
tensors on the input's device: the caller adds them into preallocated buffers so that a logged
step costs one device-to-host transfer, whatever the number of layers and micro-batches. Nothing
here calls ``.item()`` or indexes with a data-dependent mask (both would synchronize the host).

Definitions (natural log, fp32 accumulation):

- Z-value: mean over rows of LSE(z)^2, LSE(z) = log sum_i exp(z_i). A row whose scores are all
  masked (LSE = -inf, or below -1e30 when the mask is additive ``finfo.min``) has no softmax at
  all and is left out of the mean; NaN and +Inf rows are kept: they are training facts.
- Branch RMS: sqrt(mean of x^2) over every element of a branch output.
- Outlier ratio: fraction of elements with |x - mean_t| > 5 sigma_t, where mean_t and sigma_t are
  the token's mean and population standard deviation over the hidden dimension.
- MaxVio: (max_i c_i - mean_i c_i) / mean_i c_i over routed experts' token counts.
"""

from __future__ import annotations

import math

import torch

OUTLIER_SIGMAS = 5.0
MASKED_LSE = -1e30
"""An LSE at or below this comes from a row whose every score is masked."""

DEFAULT_CHUNK_ELEMENTS = 1 << 22
"""Score elements materialized at once by :func:`attention_lse` (16 MiB in fp32)."""


def z_sums(lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of LSE^2 over rows that have a softmax, number of such rows) of any-shaped LSE."""
    lse = lse.detach().float()
    valid = ~(lse <= MASKED_LSE)  # NaN compares False, so NaN rows stay valid
    sq = torch.where(valid, lse.square(), torch.zeros((), device=lse.device))
    return sq.sum(dtype=torch.float64), valid.sum()


def branch_sums(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of x^2, number of 5-sigma outliers) of a branch output (..., hidden).

    One fused variance/mean pass per token, then one comparison pass over the elements; the
    sum of squares comes from the per-token moments: sum_j x_j^2 = C * (var + mean^2).
    """
    x = x.detach()
    if x.dtype != torch.float32 and x.dtype != torch.float64:
        x = x.float()
    var, mean = torch.var_mean(x, dim=-1, correction=0, keepdim=True)
    hidden = x.shape[-1]
    sumsq = (var + mean.square()).sum(dtype=torch.float64) * hidden
    dev = (x - mean).square_()
    outliers = torch.count_nonzero(dev > var * (OUTLIER_SIGMAS * OUTLIER_SIGMAS))
    return sumsq, outliers


def router_lse(logits: torch.Tensor) -> torch.Tensor:
    """LSE over all routed experts of each token's router logits, in fp32."""
    return torch.logsumexp(logits.detach().float(), dim=-1)


def expert_counts(indices: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Tokens dispatched to each routed expert, from the selected expert indices (any shape)."""
    return torch.bincount(indices.detach().reshape(-1).long(), minlength=n_experts)[:n_experts]


def max_vio(counts: list[float] | tuple[float, ...]) -> float:
    """(max c - mean c) / mean c; NaN when no token was routed (there is no load to balance)."""
    if not counts:
        raise ValueError("max_vio: counts is empty; pass one count per routed expert")
    mean = sum(counts) / len(counts)
    if mean == 0:
        return math.nan
    return (max(counts) - mean) / mean


def _broadcast_mask(
    attn_mask: torch.Tensor | None, shape: tuple[int, ...], device: torch.device
) -> torch.Tensor | None:
    if attn_mask is None:
        return None
    return attn_mask.to(device).expand(shape)


def attention_lse(
    q: torch.Tensor,
    k: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
) -> torch.Tensor:
    """LSE of the attention scores q.k*scale (+ mask) per query, with the semantics of
    ``torch.nn.functional.scaled_dot_product_attention``, never holding the full score matrix.

    q: (*, Hq, L, D); k: (*, Hk, S, D); ``attn_mask`` boolean (True takes part) or additive,
    broadcastable to (*, Hq, L, S); ``is_causal`` masks key j > query i (top-left aligned, as
    SDPA does); ``enable_gqa`` lets Hq be a multiple of Hk (query head h reads key head h // g).
    Queries are processed in chunks of rows so that at most ``chunk_elements`` scores exist at
    once. Returns (*, Hq, L) fp32.
    """
    q = q.detach().float()
    k = k.detach().float()
    *lead, hq, L, D = q.shape
    hk, S = k.shape[-3], k.shape[-2]
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    if hq != hk and (not enable_gqa or hq % hk != 0):
        raise ValueError(f"attention_lse: q has {hq} heads and k has {hk}; pass enable_gqa=True with a multiple")
    group = hq // hk
    full_shape = (*lead, hq, L, S)
    mask = _broadcast_mask(attn_mask, full_shape, q.device)
    # (*, Hk, g, L, D) against (*, Hk, 1, S, D): each key head serves its g query heads.
    qg = q.reshape(*lead, hk, group, L, D)
    kt = k.unsqueeze(-3).transpose(-1, -2)  # (*, Hk, 1, D, S)
    per_row = max(1, math.prod(lead) * hq * S)
    rows = max(1, min(L, chunk_elements // per_row))
    out = torch.empty((*lead, hk, group, L), dtype=torch.float32, device=q.device)
    for i0 in range(0, L, rows):
        i1 = min(L, i0 + rows)
        scores = torch.matmul(qg[..., i0:i1, :], kt).mul_(scale)  # (*, Hk, g, c, S)
        if mask is not None:
            m = mask[..., i0:i1, :].reshape(*lead, hk, group, i1 - i0, S)
            if m.dtype == torch.bool:
                scores.masked_fill_(~m, -math.inf)
            else:
                scores.add_(m.float())
        if is_causal:
            qi = torch.arange(i0, i1, device=q.device).unsqueeze(-1)
            kj = torch.arange(S, device=q.device).unsqueeze(0)
            scores.masked_fill_(kj > qi, -math.inf)
        out[..., i0:i1] = torch.logsumexp(scores, dim=-1)
    return out.reshape(*lead, hq, L)
