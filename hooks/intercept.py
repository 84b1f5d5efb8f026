"""Attention Z of models we did not write, by intercepting the attention call itself.

:class:`AttentionZMode` is a ``TorchFunctionMode`` entered around one attention module's forward,
only on logged steps. It watches two calls:

- ``scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)``:
  where PyTorch's own dispatcher (``torch._fused_sdp_choice``) picks the CPU flash kernel, the
  call is answered by that very kernel, ``aten._scaled_dot_product_flash_attention_for_cpu``,
  which SDPA would have called with the same arguments (a boolean mask converted to 0/-inf the
  way SDPA converts it) and which returns the log-sum-exp beside the output: the same output
  and autograd graph, bit for bit, and attention Z costs one reduction over the LSE. Elsewhere
  (CUDA, dropout, the math backend, autocast, tensor subclasses) the call runs unchanged and
  the LSE is computed beside it from q and k in query chunks
  (:func:`hooks.indicators.attention_lse`), never holding the full score matrix.
- ``softmax(scores, dim=-1)`` on a 4-D tensor (the "eager" attention of Hugging Face models and
  most hand-written attention): the scores are materialized already, so their LSE is one more
  reduction over them.

Only the first such call per forward is taken (an attention module has one softmax); the rest
of the forward is untouched, so outputs and gradients are bit-identical with and without it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from hyperwatch.hooks import indicators

log = logging.getLogger(__name__)

_SDPA = {F.scaled_dot_product_attention}
_SOFTMAX: set[Any] = {F.softmax, torch.softmax, torch.Tensor.softmax, torch.special.softmax}

_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


_FLASH_BACKEND = 1  # torch.nn.attention.SDPBackend.FLASH_ATTENTION
_sdp_choice: Any = getattr(torch, "_fused_sdp_choice", None)
_cpu_flash: Any = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)

LseSink = Callable[[torch.Tensor, bool], None]
"""sink(lse, every_row_attends): the (..., heads, queries) LSE of one attention call, and whether
no row can be fully masked (no mask given), so that its row count follows from the shape."""


def _sdpa_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    bound = dict(zip(_SDPA_PARAMS, args))
    bound.update(kwargs)
    return bound


def cpu_flash_with_lse(a: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(output, LSE) of an SDPA call from the CPU flash kernel, when SDPA itself would run it.

    ``a``: the call's arguments by name. None when another backend would run (then the caller
    runs the original call). Rows whose every key is masked get LSE -inf (the kernel gives 0).
    """
    q, k, v = a.get("query"), a.get("key"), a.get("value")
    mask = a.get("attn_mask")
    if _sdp_choice is None or _cpu_flash is None:
        return None
    if not all(type(t) is torch.Tensor for t in (q, k, v)) or not (mask is None or type(mask) is torch.Tensor):
        return None
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
    if q.device.type != "cpu" or q.dim() != 4 or torch.is_autocast_enabled("cpu"):
        return None
    dropout_p = float(a.get("dropout_p", 0.0))
    is_causal = bool(a.get("is_causal", False))
    scale = a.get("scale")
    try:
        choice = _sdp_choice(q, k, v, mask, dropout_p, is_causal, scale=scale, enable_gqa=bool(a.get("enable_gqa")))
        if int(choice) != _FLASH_BACKEND:
            return None
        if mask is not None and mask.dtype == torch.bool:  # as SDPA converts it: True -> 0, False -> -inf
            mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, -math.inf)
        out, lse = _cpu_flash(q, k, v, dropout_p, is_causal, attn_mask=mask, scale=scale)
    except (RuntimeError, TypeError, ValueError) as exc:  # an API drift: keep the original call
        log.debug("hooks: the CPU flash kernel could not answer an SDPA call (%s); computing the LSE beside it", exc)
        return None
    lse = lse.detach()
    if mask is not None:
        lse = lse.masked_fill(~(mask > -math.inf).any(dim=-1), -math.inf)
    return out, lse


class AttentionZMode(TorchFunctionMode):
    """Collects the attention LSE of the attention call(s) made while it is active.

    ``sink(lse, every_row_attends)`` receives the (..., heads, queries) fp32 LSE of each
    intercepted call. ``seen`` counts intercepted calls since the last :meth:`begin`.
    """

    def __init__(self, sink: LseSink, chunk_elements: int) -> None:
        super().__init__()
        self.sink = sink
        self.chunk_elements = chunk_elements
        self.seen = 0
        self._taken = False

    def begin(self) -> None:
        """A new forward of the watched module: its first softmax may be taken again."""
        self._taken = False

    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func in _SDPA:
            return self._on_sdpa(func, args, kwargs)
        if func in _SOFTMAX and not self._taken:
            self._on_softmax(args, kwargs)
        return func(*args, **kwargs)

    def _on_sdpa(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        a = _sdpa_arguments(args, kwargs)
        fused = cpu_flash_with_lse(a)
        self._taken = True
        self.seen += 1
        if fused is not None:
            with torch.no_grad():
                self.sink(fused[1], a.get("attn_mask") is None)
            return fused[0]
        with torch.no_grad():
            lse = indicators.attention_lse(
                a["query"],
                a["key"],
                attn_mask=a.get("attn_mask"),
                is_causal=bool(a.get("is_causal", False)),
                scale=a.get("scale"),
                enable_gqa=bool(a.get("enable_gqa", False)),
                chunk_elements=self.chunk_elements,
            )
            self.sink(lse, a.get("attn_mask") is None)
        return func(*args, **kwargs)

    def _on_softmax(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = args[0] if args else kwargs.get("input")
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or dim not in (-1, 3):
            return
        self._taken = True
        with torch.no_grad():
            lse = torch.logsumexp(x.detach().float(), dim=-1)
            self.sink(lse, False)
        self.seen += 1
