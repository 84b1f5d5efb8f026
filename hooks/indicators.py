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

BRANCH_CHUNK_ELEMENTS = 1 << 19
"""Branch-output elements per slice in eager CPU mode: a 2 MiB fp32 temporary, about an L2, reused by
the allocator (a tensor-sized one is fresh pages from the OS per call). 2^18-2^20 measured alike
on a (16384, 1024) tensor; smaller slices pay per-op overhead, larger ones leave the cache."""


def z_sums(lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of LSE^2 over rows that have a softmax, number of such rows) of any-shaped LSE."""
    lse = lse.detach().float()
    masked = lse <= MASKED_LSE  # NaN compares False, so NaN rows stay counted
    sq = lse.square().masked_fill_(masked, 0.0)
    return sq.sum(dtype=torch.float64), lse.numel() - masked.sum()


def lse_square_sum(lse: torch.Tensor) -> torch.Tensor:
    """Sum of LSE^2 over every row: the Z numerator when no row can be fully masked (a causal
    kernel without a mask), so the row count is the shape's and no validity pass is needed."""
    lse = lse.detach()
    if lse.dtype != torch.float32 and lse.dtype != torch.float64:
        lse = lse.float()
    return lse.square().sum()


def branch_sums(x: torch.Tensor) -> torch.Tensor:
    """[sum of x^2, number of 5-sigma outliers] of a branch output (..., hidden): (2,) float64.

    Per token t (hidden size C): mean m_t; squared deviations e = (x - m_t)^2, in fp32 also for
    bf16/fp16 inputs (the subtraction promotes: no separate conversion pass), written in place;
    S_t = sum of e (two-pass variance: no cancellation). Then sum_j x_j^2 = S_t + C m_t^2, and an
    outlier is e > 25 S_t / C, i.e. |x - m_t| > 5 sigma_t. The comparison is written in place
    into e as 1.0/0.0 (a comparison into a float tensor is several times faster than into bool
    on CPU); per-token counts of ones are exact in fp32. S_t is a nansum: a token holding +-Inf
    has an infinite mean, so its deviations are Inf (and one NaN), and its sum of squares must
    come out Inf, not NaN; a token holding NaN keeps a NaN mean, so its sum of squares stays NaN.
    Per-token values are fp32, their sums over tokens float64.

    Every reduction is per token, and the two totals over tokens are separate reductions (no
    per-token concatenation): so inductor fuses the three row reductions under one loop over
    tokens, each row read from memory once (TORCH_LOGS=output_code shows one ``omp for`` over
    the rows with three inner loops on CPU). Eager callers on CPU should go through
    :func:`add_branch_sums_`, which feeds this cache-sized slices of rows.
    """
    x = x.detach()
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    hidden = x.shape[-1]
    mean = x.mean(dim=-1, keepdim=True, dtype=acc)
    sq_dev = (x - mean).square_()
    if sq_dev.dtype != acc:  # integer or exotic inputs
        sq_dev = sq_dev.to(acc)
    dev_sum = sq_dev.nansum(dim=-1, keepdim=True)
    outliers = sq_dev.gt_(dev_sum * (OUTLIER_SIGMAS * OUTLIER_SIGMAS / hidden)).sum(dim=-1)
    sumsq = torch.addcmul(dev_sum, mean, mean, value=hidden)
    return torch.stack([sumsq.sum(dtype=torch.float64), outliers.sum(dtype=torch.float64)])


def add_branch_sums_(out: torch.Tensor, x: torch.Tensor, chunk_elements: int = BRANCH_CHUNK_ELEMENTS) -> None:
    """Add :func:`branch_sums` of ``x`` into ``out`` (2 float64 elements, e.g. adjacent slots).

    Eager on CPU, the rows go through in slices of about ``chunk_elements``: each op of the
    formula then streams a cache-sized temporary instead of a tensor-sized one, so ``x`` is read
    from memory once and its fp32 deviations stay in cache (3-7x faster than one call on a
    (16384, 1024) tensor, one thread; ``bench/hooks_overhead.py --branch``). Under
    ``torch.compile`` it is one call (a Python loop would unroll into the graph; inductor fuses
    the formula itself), and on other devices too (on CUDA this path runs only without Triton,
    where a launch per slice would cost more than the passes it saves).
    """
    x = x.detach()
    if torch.compiler.is_compiling() or x.device.type != "cpu":
        out.add_(branch_sums(x))
        return
    rows = x.reshape(-1, x.shape[-1])
    step = max(1, chunk_elements // max(1, rows.shape[-1]))
    for start in range(0, rows.shape[0], step):
        out.add_(branch_sums(rows[start : start + step]))


def router_lse(logits: torch.Tensor) -> torch.Tensor:
    """LSE over all routed experts of each token's router logits, in fp32."""
    return torch.logsumexp(logits.detach().float(), dim=-1)


def expert_counts(indices: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Tokens dispatched to each routed expert, from the selected expert indices (any shape).

    A scatter-add into ``n_experts + 1`` preallocated bins (indices outside the range land in the
    last, dropped), not ``torch.bincount``: bincount sizes its output from the data's maximum,
    which synchronizes the host with a GPU on every call."""
    idx = indices.detach().reshape(-1).long().clamp(0, n_experts)
    bins = torch.zeros(n_experts + 1, dtype=torch.int64, device=idx.device)
    return bins.scatter_add_(0, idx, torch.ones_like(idx))[:n_experts]


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


def _logsumexp_(scores: torch.Tensor) -> torch.Tensor:
    """logsumexp over the last dimension, overwriting ``scores``; -inf rows give -inf, +inf give +inf."""
    top = scores.amax(dim=-1, keepdim=True)
    top.masked_fill_(top.isinf(), 0.0)  # all -inf (fully masked) or +inf rows: exp stays 0 or inf
    return scores.sub_(top).exp_().sum(dim=-1).log_().add_(top.squeeze(-1))


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
    SDPA does); ``enable_gqa`` lets Hq be a multiple of Hk (query head h reads key head h // g); one key head
    (Hk = 1) is broadcast over every query head with or without it, as SDPA does.
    Queries are processed in chunks of rows so that at most ``chunk_elements`` scores exist at
    once (one chunk when that fits). Returns (*, Hq, L) fp32.

    Cost: the scale is folded into the query chunk (L x D, not L x S); fp16/bf16 inputs are
    multiplied in their own dtype (the tensor-core path on GPUs; scores rounded to that dtype,
    about 0.4% of a score, before an fp32 log-sum-exp); the log-sum-exp works in place on the
    chunk (max, subtract, exp, sum: no extra score-sized allocation).
    """
    q, k = q.detach(), k.detach()
    half = q.dtype in (torch.float16, torch.bfloat16) and k.dtype == q.dtype
    if not half:
        q, k = q.float(), k.float()
    *lead, hq, L, D = q.shape
    hk, S = k.shape[-3], k.shape[-2]
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    # SDPA broadcasts a single key/value head over every query head (multi-query attention) as a
    # matmul would; any other difference in heads needs enable_gqa and a multiple.
    if hq != hk and hk != 1 and (not enable_gqa or hq % hk != 0):
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
        scores = torch.matmul(qg[..., i0:i1, :] * scale, kt)  # (*, Hk, g, c, S)
        if half:
            scores = scores.float()
        if mask is not None:
            m = mask[..., i0:i1, :].reshape(*lead, hk, group, i1 - i0, S)
            if m.dtype == torch.bool:
                scores.masked_fill_(~m, -math.inf)
            else:
                scores.add_(m)
        if is_causal:
            qi = torch.arange(i0, i1, device=q.device).unsqueeze(-1)
            kj = torch.arange(S, device=q.device).unsqueeze(0)
            scores.masked_fill_(kj > qi, -math.inf)
        out[..., i0:i1] = _logsumexp_(scores)
    return out.reshape(*lead, hq, L)
