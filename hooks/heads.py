"""Per-head attention ceilings and the output logits' Z: the indicators the alerts need.

Per head, ``attention_lse_max.h<k>`` (layer ``l``) is the largest log-sum-exp of head ``k``'s
attention scores over every query of the logged step (batch, micro-batches and positions). A row's
LSE bounds its largest score from both sides, ``max_j s_j <= LSE <= max_j s_j + log T`` (T keys),
so the per-head max LSE is a QK-clip-style ceiling signal (Kimi K2 clips heads whose max logit
passes 100) that costs one ``amax`` of the LSE the kernel already returns: the max logit is at
least ``attention_lse_max - log T`` and at most ``attention_lse_max``. ``attention_lse_max`` (no
qualifier) is the layer's max over its heads: the one value per layer that ``/metrics`` exports,
so Prometheus keeps its bounded series budget while the store keeps the heads (qualified names of
the same base metric; the wire schema already allows qualifiers, so nothing else changes).

``output_z`` is the mean over positions of LSE(logits over the vocabulary)^2 of the LM head: the
quantity z-loss (PaLM) penalizes; it drifts up when output logits diverge.

Cost rules as for every indicator (see :mod:`hooks.accumulate`): device reductions added into
preallocated slots, no host synchronization, read back with the step's one device-to-host copy.
The per-head maxima are not part of the summed all-reduce (a maximum does not add): under data
parallelism they take one more all-reduce of their own, with MAX, on logged steps only.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hyperwatch.hooks.indicators import MASKED_LSE
from hyperwatch.hooks.schema import head_name, head_of

__all__ = ["MAX_HEADS", "find_output_head", "head_lse_max", "head_name", "head_of", "output_z_sums", "unpack_heads"]

MAX_HEADS = 128
"""Head slots per layer. A layer with more heads folds the rest into the last slot (their max)."""


OUTPUT_HEAD_NAMES = ("lm_head", "output", "embed_out", "output_layer", "head")
"""Child names (of the model, or of its one wrapped model) that hold the LM head, first match wins."""


def head_lse_max(lse: torch.Tensor) -> torch.Tensor:
    """Per-head max of an LSE shaped (..., heads, queries), in fp32: (min(heads, MAX_HEADS),).

    NaN propagates (a NaN row makes its head NaN: a training fact); a fully masked row's -inf or
    ``finfo.min`` never wins a maximum unless the whole head is masked (then the slot stays unseen).
    A 1-D LSE is one head.
    """
    lse = lse.detach()
    if lse.dtype != torch.float32 and lse.dtype != torch.float64:
        lse = lse.float()
    if lse.dim() < 2:
        return lse.amax().reshape(1)
    head_dim = lse.dim() - 2
    per_head = lse.amax(dim=[d for d in range(lse.dim()) if d != head_dim])
    if per_head.shape[0] > MAX_HEADS:
        per_head = torch.cat([per_head[: MAX_HEADS - 1], per_head[MAX_HEADS - 1 :].amax().reshape(1)])
    return per_head


def unpack_heads(flat: np.ndarray, heads_at: int, layer: int) -> tuple[list[float | None], float | None]:
    """(per-head values up to the last head seen, their max) of one layer from the host copy."""
    row = flat[heads_at + layer * MAX_HEADS : heads_at + (layer + 1) * MAX_HEADS]
    seen = ~(row <= MASKED_LSE)  # NaN compares False: a NaN head is seen
    idx = np.flatnonzero(seen)
    if idx.size == 0:
        return [], None
    values: list[float | None] = [float(v) if s else None for v, s in zip(row[: idx[-1] + 1], seen[: idx[-1] + 1])]
    top = row[idx]
    return values, float("nan") if np.isnan(top).any() else float(top.max())


OUTPUT_CHUNK_ELEMENTS = 1 << 18
"""Logit elements per slice of :func:`output_z_sums` in eager CPU mode (1 MiB of fp32: about an L2)."""
OUTPUT_CHUNK_ELEMENTS_DEVICE = 1 << 26
"""Logit elements per slice on an accelerator without the Triton kernel: the fp32 copy and the
log-softmax of a slice take 512 MiB, never a copy of the whole step's logits (a 128k vocabulary at
32k tokens a step would take two 16 GiB temporaries at once), in a few dozen launches."""


def _lse_rows(rows: torch.Tensor) -> torch.Tensor:
    """LSE over the last dimension of 2-D ``rows``, in fp32 or fp64: cross-entropy against class 0
    plus logit 0 (``CE = LSE - z_0``). PyTorch's fused log-softmax kernel makes this ~2x faster on
    CPU than ``torch.logsumexp`` (max, subtract, exp, sum, log as separate passes); the rounding
    added is ~1 ulp of |z_0|. A row whose logit 0 is +-inf gives NaN where LSE may be +inf: a
    non-finite value either way, which the detectors report."""
    if rows.dtype != torch.float32 and rows.dtype != torch.float64:
        rows = rows.float()
    target = torch.zeros(rows.shape[0], dtype=torch.long, device=rows.device)
    return F.cross_entropy(rows, target, reduction="none").add_(rows[:, 0])


def output_z_sums(logits: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(sum over positions of LSE(logits)^2 in float64, number of positions) of (..., vocab) logits.

    Eager, the positions go through in slices: of about :data:`OUTPUT_CHUNK_ELEMENTS` logits on CPU
    (each pass then streams a cache-sized temporary, as :func:`hooks.indicators.add_branch_sums_`),
    of :data:`OUTPUT_CHUNK_ELEMENTS_DEVICE` elsewhere (a bounded temporary). Under
    ``torch.compile`` it is one call (inductor fuses it). On CUDA with Triton the accumulator uses
    :func:`hooks.fused.add_lse_square_sum_` instead (one read, no temporary).
    """
    rows = logits.detach().reshape(-1, logits.shape[-1])
    if torch.compiler.is_compiling():
        return _lse_rows(rows).square().sum(dtype=torch.float64).reshape(1), rows.shape[0]
    total = torch.zeros(1, dtype=torch.float64, device=rows.device)
    chunk = OUTPUT_CHUNK_ELEMENTS if rows.device.type == "cpu" else OUTPUT_CHUNK_ELEMENTS_DEVICE
    step = max(1, chunk // max(1, rows.shape[-1]))
    for start in range(0, rows.shape[0], step):
        total.add_(_lse_rows(rows[start : start + step]).square().sum(dtype=torch.float64))
    return total, rows.shape[0]


def find_output_head(model: nn.Module) -> nn.Module | None:
    """The LM head: an ``nn.Linear`` child named like one (``lm_head``, ``output``, ...) of the model
    or of a model it wraps (Hugging Face's ``*ForCausalLM.lm_head``; one level of ``.model``/``.module``)."""
    for owner in (model, getattr(model, "module", None), getattr(model, "model", None)):
        if not isinstance(owner, nn.Module):
            continue
        for name in OUTPUT_HEAD_NAMES:
            child = getattr(owner, name, None)
            if isinstance(child, nn.Linear) and child.out_features > 1:
                return child
    return None


def first_logits(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None
