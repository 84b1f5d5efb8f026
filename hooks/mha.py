"""Attention Z of PyTorch's own ``nn.MultiheadAttention`` (inside ``nn.TransformerEncoderLayer``,
``nn.TransformerDecoderLayer``, ``nn.Transformer`` or a hand-written block).

Why not intercept its attention call as :mod:`hooks.intercept` does for other modules:
``nn.MultiheadAttention.forward`` hands everything to ``F.multi_head_attention_forward``, which
is itself a ``__torch_function__`` override point. A ``TorchFunctionMode`` therefore receives
that one call, and the mode is switched off while the call runs, so the
``scaled_dot_product_attention`` (or softmax) inside it is never seen; re-entering the mode
there re-dispatches the same call forever. So the scores are recomputed, on logged steps only,
from the module's own projection weights and the call's arguments: the fallback the design
allows, recorded in the run's config (``_hyperwatch.attention_z_source``). Cost on a logged
step: the query and key projections once more, and the LSE from the CPU flash kernel (causal
masks recognised, so masked blocks are skipped) or, elsewhere, from the scores in chunks of at
most ``chunk_elements`` (:func:`hooks.indicators.attention_lse`), never the full score matrix.

Semantics are ``nn.MultiheadAttention``'s, not SDPA's: a boolean ``attn_mask`` or
``key_padding_mask`` is True where attention is *not* allowed; float masks are added to the
scores; ``bias_k`` and ``add_zero_attn`` each append one key. ``is_causal`` is only a hint there
(the module requires ``attn_mask`` with it), so the mask is what counts.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.hooks import RemovableHandle

from hyperwatch.hooks import indicators
from hyperwatch.hooks.accumulate import Accumulator
from hyperwatch.hooks.intercept import cpu_flash_with_lse
from hyperwatch.hooks.probes import Gate, Probe, Report, ignore

_FORWARD_PARAMS = (
    "query",
    "key",
    "value",
    "key_padding_mask",
    "need_weights",
    "attn_mask",
    "average_attn_weights",
    "is_causal",
)

RECOMPUTED = (
    "recomputed from nn.MultiheadAttention's query/key projections on logged steps "
    "(its fused call hides the attention kernel's log-sum-exp)"
)


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An MHA mask as scores to add: boolean True (not allowed) -> -inf, float as is."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask, -math.inf)
    return mask.to(dtype)


def _is_causal_mask(mask: torch.Tensor) -> bool:
    """Whether a 2-D (L, L) MHA mask is exactly the causal one (boolean or 0/-inf)."""
    if mask.dim() != 2 or mask.shape[0] != mask.shape[1]:
        return False
    upper = torch.ones(mask.shape, dtype=torch.bool, device=mask.device).triu_(1)
    if mask.dtype == torch.bool:
        return torch.equal(mask, upper)
    return bool(((mask == -math.inf) == upper).all()) and bool((mask.masked_fill(upper, 0) == 0).all())


def mha_lse(module: nn.MultiheadAttention, a: dict[str, Any], chunk_elements: int) -> tuple[torch.Tensor, bool]:
    """(N, H, L) LSE of the attention scores one ``module(**a)`` call computes, and whether every
    row attends (a causal mask alone: no row can be fully masked).

    On CPU the LSE comes from the flash kernel (:func:`hooks.intercept.cpu_flash_with_lse`, the
    key standing in for the value, whose output is dropped), with ``is_causal`` when the mask is
    the causal one (the kernel then skips the masked blocks): about 4x cheaper than the chunked
    scores. Elsewhere (CUDA, autocast) :func:`hooks.indicators.attention_lse` computes it."""
    query, key = a["query"].detach(), a["key"].detach()
    batched = query.dim() == 3
    if not batched:  # (L, E) -> (L, 1, E)
        query, key = query.unsqueeze(1), key.unsqueeze(1)
    elif module.batch_first:  # (N, L, E) -> (L, N, E)
        query, key = query.transpose(0, 1), key.transpose(0, 1)
    E, H = module.embed_dim, module.num_heads
    hd = E // H
    L, N = query.shape[0], query.shape[1]
    bias = module.in_proj_bias.detach() if module.in_proj_bias is not None else None
    bq, bk = (bias[:E], bias[E : 2 * E]) if bias is not None else (None, None)
    if module._qkv_same_embed_dim:
        w = module.in_proj_weight.detach()
        wq, wk = w[:E], w[E : 2 * E]
    else:
        wq, wk = module.q_proj_weight.detach(), module.k_proj_weight.detach()
    q = F.linear(query, wq, bq)  # (L, N, E)
    k = F.linear(key, wk, bk)  # (S, N, E)
    extra = 0
    if module.bias_k is not None:
        k = torch.cat([k, module.bias_k.detach().to(k.dtype).expand(1, N, E)])
        extra += 1
    q = q.reshape(L, N, H, hd).permute(1, 2, 0, 3)  # (N, H, L, hd)
    k = k.reshape(k.shape[0], N, H, hd).permute(1, 2, 0, 3)  # (N, H, S, hd)
    if module.add_zero_attn:
        k = torch.cat([k, k.new_zeros(N, H, 1, hd)], dim=2)
        extra += 1
    S = k.shape[2]
    dtype = torch.float32
    mask: torch.Tensor | None = None
    attn_mask = a.get("attn_mask")
    kpm = a.get("key_padding_mask")
    causal = isinstance(attn_mask, torch.Tensor) and kpm is None and extra == 0 and _is_causal_mask(attn_mask)
    if causal:
        attn_mask = None
    if isinstance(attn_mask, torch.Tensor):
        m = _additive(attn_mask.detach(), dtype)
        m = m.reshape(N, H, L, -1) if m.dim() == 3 else m.reshape(1, 1, L, -1)
        mask = F.pad(m, (0, extra)) if extra else m
    if isinstance(kpm, torch.Tensor):
        p = _additive(kpm.detach().reshape(N, -1), dtype).reshape(N, 1, 1, -1)
        p = F.pad(p, (0, extra)) if extra else p
        mask = p if mask is None else mask + p
    if q.device.type == "cpu":
        fused = cpu_flash_with_lse({"query": q, "key": k, "value": k, "attn_mask": mask, "is_causal": causal})
        if fused is not None:
            return fused[1], causal
    if mask is not None:
        mask = mask.expand(N, H, L, S)
    return indicators.attention_lse(q, k, attn_mask=mask, is_causal=causal, chunk_elements=chunk_elements), causal


class MhaProbe(Probe):
    """Attention Z of an ``nn.MultiheadAttention``, from a forward pre-hook (see the module docstring)."""

    keys = ("attention_z",)

    def __init__(
        self, acc: Accumulator, gate: Gate, layer: int, module: nn.Module, chunk_elements: int, report: Report = ignore
    ) -> None:
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"MhaProbe: expected an nn.MultiheadAttention, got {type(module).__name__}")
        super().__init__(acc, gate, layer, report)
        self.module = module
        self.chunk_elements = chunk_elements

    def register(self) -> list[RemovableHandle]:
        return [self.module.register_forward_pre_hook(self._pre, with_kwargs=True)]

    def _pre(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self.live():
            self.guard(lambda: self._measure(args, kwargs))
        return None

    def _measure(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        with torch.no_grad():
            lse, every_row_attends = mha_lse(self.module, call_arguments(args, kwargs), self.chunk_elements)
            self.acc.add_attention_lse(self.where, lse, every_row_attends=every_row_attends)


def call_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """An ``nn.MultiheadAttention`` call's arguments by name."""
    bound = dict(zip(_FORWARD_PARAMS, args))
    bound.update(kwargs)
    return bound
