"""Attention Z of models we did not write, by intercepting the attention call itself.

:class:`AttentionZMode` is a ``TorchFunctionMode`` entered around one attention module's forward,
only on logged steps. It watches two calls:

- ``scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)``:
  the call runs unchanged; beside it the log-sum-exp of the scores is computed from q and k in
  query chunks (:func:`hooks.indicators.attention_lse`), never holding the full score matrix.
- ``softmax(scores, dim=-1)`` on a 4-D tensor (the "eager" attention of Hugging Face models and
  most hand-written attention): the scores are materialized already, so their LSE is one more
  reduction over them.

Only the first such call per forward is taken (an attention module has one softmax); the rest
of the forward is untouched, so outputs and gradients are bit-identical with and without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from hooks import indicators

_SDPA = {F.scaled_dot_product_attention}
_SOFTMAX: set[Any] = {F.softmax, torch.softmax, torch.Tensor.softmax, torch.special.softmax}

_SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def _sdpa_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    bound = dict(zip(_SDPA_PARAMS, args))
    bound.update(kwargs)
    return bound


class AttentionZMode(TorchFunctionMode):
    """Collects the attention LSE of the attention call(s) made while it is active.

    ``sink(lse)`` receives the (..., heads, queries) fp32 LSE of each intercepted call.
    ``seen`` counts intercepted calls since the last :meth:`begin`.
    """

    def __init__(self, sink: Callable[[torch.Tensor], None], chunk_elements: int) -> None:
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
            self._on_sdpa(args, kwargs)
        elif func in _SOFTMAX and not self._taken:
            self._on_softmax(args, kwargs)
        return func(*args, **kwargs)

    def _on_sdpa(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        a = _sdpa_arguments(args, kwargs)
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
        self._taken = True
        self.seen += 1
        self.sink(lse)

    def _on_softmax(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        x = args[0] if args else kwargs.get("input")
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if not isinstance(x, torch.Tensor) or x.dim() != 4 or dim not in (-1, 3):
            return
        self._taken = True
        with torch.no_grad():
            lse = torch.logsumexp(x.detach().float(), dim=-1)
        self.seen += 1
        self.sink(lse)
