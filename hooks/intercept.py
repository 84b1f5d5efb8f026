"""Attention Z of models we did not write, by intercepting the attention call itself.

:class:`AttentionZMode` is a ``TorchFunctionMode`` entered around one attention module's forward,
only on logged steps. It watches two calls:

- ``scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)``:
  the call is answered by the very attention kernel SDPA would dispatch to, chosen by PyTorch's
  own dispatcher (``torch._fused_sdp_choice``) after autocast's casts, called with SDPA's own
  preprocessing, and asked for the log-sum-exp it computes anyway (:func:`sdpa_with_lse`): CPU
  flash, or CUDA flash / memory-efficient / cuDNN. Those ops are differentiable (their backward
  ops reuse the saved LSE and RNG state), so output and gradients are SDPA's, bit for bit where
  the same kernel runs, and attention Z costs one reduction over the LSE. Where no LSE kernel
  applies (the math backend would run: e.g. dropout on CPU, fp32 on CUDA, a mask the fused
  kernels refuse; tensor subclasses) the call runs unchanged and the LSE is recomputed beside it
  from q and k in query chunks (:func:`hooks.indicators.attention_lse`): the costly path, which
  the probe reports once (a warning and the monitor's ``unavailable`` notes).
- ``softmax(scores, dim=-1)`` (the "eager" attention of Hugging Face models and most
  hand-written attention): the scores are materialized already, so their LSE is one more
  reduction over them. Which softmax is the attention's is told by what follows: its output
  (through dropout, casts or a head mask) is multiplied by the values. A gate's softmax, before
  or after, is not.

Every other call runs as the model makes it, so outputs and gradients are bit-identical with and
without the mode; a failure of ours is reported (``on_error``) and never reaches the model.
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


# torch.nn.attention.SDPBackend values, as torch._fused_sdp_choice returns them
_MATH, _FLASH, _EFFICIENT, _CUDNN = 0, 1, 2, 3
_BACKEND_NAMES = {-1: "none (SDPA would raise)", 0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}
_sdp_choice: Any = getattr(torch, "_fused_sdp_choice", None)
_aten: Any = torch.ops.aten
_MEM_EFF_ALIGN = 16  # elements: the memory-efficient kernel wants its bias rows aligned like this

LseSink = Callable[[torch.Tensor, bool], None]
"""sink(lse, every_row_attends): the (..., heads, queries) LSE of one attention call, and whether
no row can be fully masked (no mask given), so that its row count follows from the shape."""


class KernelUnavailable(Exception):
    """No attention kernel that returns the LSE can answer this SDPA call the way SDPA would;
    the message says why (the caller then recomputes the LSE beside the original call)."""


def _sdpa_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    bound = dict(zip(_SDPA_PARAMS, args))
    bound.update(kwargs)
    return bound


@torch.compiler.assume_constant_result
def _static_choice(
    device: str,
    specs: tuple[tuple[tuple[int, ...], tuple[int, ...], torch.dtype, bool], ...],
    mask_spec: tuple[tuple[int, ...], tuple[int, ...], torch.dtype] | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> int:
    """``torch._fused_sdp_choice`` inside a ``torch.compile`` trace, where it cannot be called on
    the traced tensors (it returns an int: a graph break). The choice depends only on metadata
    (device, dtypes, sizes, strides, requires_grad, flags), so it is evaluated once at trace time
    on stand-in tensors of the same layout and baked into the graph, as inductor itself decides
    SDPA's backend at compile time."""

    def stand_in(size: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        extent = 1 + sum((n - 1) * st for n, st in zip(size, stride) if n > 0)
        return torch.empty(extent, dtype=dtype, device=device).as_strided(size, stride)

    q, k, v = (stand_in(size, stride, dt).requires_grad_(grad) for size, stride, dt, grad in specs)
    mask = stand_in(*mask_spec) if mask_spec is not None else None
    return int(_sdp_choice(q, k, v, mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa))


def _choice(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> int:
    """The backend SDPA would dispatch these arguments to (an ``SDPBackend`` value)."""
    if not torch.compiler.is_compiling():
        return int(_sdp_choice(q, k, v, mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa))
    specs = tuple(
        (tuple(t.shape), tuple(t.stride()), t.dtype, t.requires_grad and torch.is_grad_enabled()) for t in (q, k, v)
    )
    mask_spec = (tuple(mask.shape), tuple(mask.stride()), mask.dtype) if mask is not None else None
    return _static_choice(q.device.type, specs, mask_spec, dropout_p, is_causal, scale, enable_gqa)


def _autocast(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> tuple[Any, ...]:
    """What autocast does to SDPA's arguments before SDPA sees them: SDPA is a lower-precision op
    on CPU and CUDA, so every floating-point argument (the mask included) goes to the autocast
    dtype. The private kernels are not on autocast's lists, so the cast is ours to make."""
    device = q.device.type
    if not torch.is_autocast_enabled(device):
        return q, k, v, mask
    low = torch.get_autocast_dtype(device)

    def cast(t: torch.Tensor | None) -> Any:
        return t.to(low) if t is not None and t.is_floating_point() and t.dtype != torch.float64 else t

    return cast(q), cast(k), cast(v), cast(mask)


def _bool_to_additive(mask: torch.Tensor, dtype: torch.dtype, fill: float = -math.inf) -> torch.Tensor:
    """As SDPA converts a boolean mask: True (takes part) -> 0, False -> ``fill``, in the query dtype."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, fill)


_CUDNN_FILLS = (-math.inf, -65504.0)
_cudnn_fill_seen: dict[tuple[str, int | None], float] = {}


@torch.compiler.assume_constant_result
def _cudnn_bool_fill(device: str, index: int | None) -> float:
    """The value SDPA writes for a False of a boolean mask before it calls cuDNN attention.

    Not -inf everywhere: PyTorch's ``convert_boolean_attn_mask_cudnn`` has used the finite
    -65504 (cuDNN once gave NaN for -inf), which makes a fully masked row attend uniformly
    instead of giving 0. Which one this torch uses is found once per device by running SDPA on
    a small case under the cuDNN backend against the op with each candidate, bit for bit (a
    host sync, once; under ``torch.compile`` at trace time). -inf where cuDNN cannot run it."""
    key = (device, index)
    if key not in _cudnn_fill_seen:
        _cudnn_fill_seen[key] = _probe_cudnn_fill(
            torch.device(device) if index is None else torch.device(device, index)
        )
    return _cudnn_fill_seen[key]


def _probe_cudnn_fill(dev: torch.device) -> float:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 64, generator=g).to(dev, torch.float16) for _ in range(3))
    mask = torch.ones(1, 1, 16, 16, dtype=torch.bool)
    mask[..., 3, :] = False  # a fully masked row: where the candidates differ
    mask[..., 9, 4:12] = False
    mask = mask.to(dev)
    try:
        with torch.no_grad(), sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            for fill in _CUDNN_FILLS:
                bias = _bool_to_additive(mask, q.dtype, fill)
                got = _aten._scaled_dot_product_cudnn_attention(q, k, v, bias, False, 0.0, False, False)[0]
                if bool(((got == want) | (got.isnan() & want.isnan())).all()):
                    return fill
    except RuntimeError as exc:  # no cuDNN attention on this GPU or build
        log.debug("cuDNN attention probe: %s", exc)
    return -math.inf


def _aligned_bias(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The memory-efficient kernel's bias: (B, H, L, S), rows aligned (padded, then sliced back)."""
    S = k.shape[-2]
    if mask.stride(-1) != 1 or mask.stride(-2) % _MEM_EFF_ALIGN or mask.storage_offset() % _MEM_EFF_ALIGN:
        pad = (-S) % _MEM_EFF_ALIGN
        mask = F.pad(mask, (0, pad))[..., :S] if pad else mask.contiguous()
    return mask.expand(q.shape[0], q.shape[1], q.shape[2], S)


def _cuda_kernel(
    choice: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The CUDA op SDPA dispatches to for ``choice``, called as SDPA calls it, keeping the LSE.

    The ops are differentiable (autograd calls their matching backward ops with the saved LSE
    and RNG state), so output and gradients are SDPA's own.
    """
    if choice == _FLASH:  # SDPA pads the head dim to a multiple of 8 and keeps the original scale
        D = q.shape[-1]
        pad = (-D) % 8
        if scale is None:
            scale = 1.0 / math.sqrt(D)
        if pad:
            q, k, v = (F.pad(t, (0, pad)) for t in (q, k, v))
        res = _aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False, scale=scale)
        out = res[0][..., :D] if pad else res[0]
        return out, res[1]
    if choice == _EFFICIENT:
        bias = _aligned_bias(mask, q, k) if mask is not None else None
        res = _aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, dropout_p, is_causal, scale=scale)
        return res[0], res[1]
    if choice == _CUDNN:
        res = _aten._scaled_dot_product_cudnn_attention(q, k, v, mask, True, dropout_p, is_causal, False, scale=scale)
        return res[0], res[1]
    raise KernelUnavailable(f"SDPA would run the {_BACKEND_NAMES.get(choice, str(choice))} backend")


def sdpa_with_lse(a: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, LSE) of an SDPA call from the attention kernel SDPA itself would run.

    ``a``: the call's arguments by name. The backend is the one PyTorch's own dispatcher picks
    (``torch._fused_sdp_choice``, which honours dtype, mask, dropout, GQA, scale, is_causal and
    the ``sdpa_kernel`` context) after the casts autocast would make, and the op is called with
    SDPA's own argument preprocessing: on CPU ``_scaled_dot_product_flash_attention_for_cpu``; on
    CUDA ``_scaled_dot_product_flash_attention`` (head dim padded to a multiple of 8),
    ``_scaled_dot_product_efficient_attention`` (with ``compute_log_sumexp``; its LSE is padded
    along queries and sliced back) or ``_scaled_dot_product_cudnn_attention``. The LSE is
    (..., heads, queries) fp32, detached; rows whose every key is masked get -inf (no softmax).
    Raises :class:`KernelUnavailable` (with the reason) where no such kernel applies: the math
    backend would run (e.g. a float mask on a CUDA flash-only shape, fp32 on CUDA, dropout on
    CPU), tensor subclasses, or a kernel that refused the call.
    """
    q, k, v = a.get("query"), a.get("key"), a.get("value")
    mask = a.get("attn_mask")
    if _sdp_choice is None:
        raise KernelUnavailable(f"torch {torch.__version__} has no torch._fused_sdp_choice")
    if not all(type(t) is torch.Tensor for t in (q, k, v)) or not (mask is None or type(mask) is torch.Tensor):
        raise KernelUnavailable("q, k, v or the mask is not a plain torch.Tensor (a subclass or nested tensor)")
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)
    if q.dim() != 4 or q.device.type not in ("cpu", "cuda"):
        raise KernelUnavailable(f"a {q.dim()}-D query on {q.device.type} (the LSE kernels take 4-D CPU/CUDA tensors)")
    dropout_p = float(a.get("dropout_p", 0.0))
    is_causal = bool(a.get("is_causal", False))
    scale = a.get("scale")
    q, k, v, mask = _autocast(q, k, v, mask)
    try:
        choice = _choice(q, k, v, mask, dropout_p, is_causal, scale, bool(a.get("enable_gqa")))
        attends = None if mask is None else mask.any(dim=-1) if mask.dtype == torch.bool else (mask > -math.inf).any(-1)
        if mask is not None and mask.dtype == torch.bool:
            fill = _cudnn_bool_fill(q.device.type, q.device.index) if choice == _CUDNN else -math.inf
            mask = _bool_to_additive(mask, q.dtype, fill)
        with torch.autocast(q.device.type, enabled=False):
            if q.device.type == "cpu":
                if choice != _FLASH:
                    raise KernelUnavailable(f"SDPA would run the {_BACKEND_NAMES.get(choice, str(choice))} backend")
                out, lse = _aten._scaled_dot_product_flash_attention_for_cpu(
                    q, k, v, dropout_p, is_causal, attn_mask=mask, scale=scale
                )
            else:
                out, lse = _cuda_kernel(choice, q, k, v, mask, dropout_p, is_causal, scale)
    except (RuntimeError, TypeError, ValueError) as exc:  # a kernel refused or an API drift
        raise KernelUnavailable(f"the LSE kernel refused the call ({exc})") from exc
    L = q.shape[-2]
    lse = lse.detach().reshape(*q.shape[:-2], -1)[..., :L]  # efficient pads queries; cuDNN may add a dim
    if attends is not None:  # a row with no key to attend has no softmax (whatever the kernel wrote)
        lse = lse.masked_fill(~attends, -math.inf)
    return out, lse


def cpu_flash_with_lse(a: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`sdpa_with_lse`, or None where no LSE kernel applies (kept for callers of 0.x)."""
    try:
        return sdpa_with_lse(a)
    except KernelUnavailable:
        return None


def guarded(fn: Callable[[], Any], on_error: Callable[[BaseException], None]) -> Any:
    """``fn()``, or None after ``on_error(exc)`` if it raised: a measurement must never fail the
    user's forward. Inside a ``torch.compile`` trace ``fn`` runs as is (no try block to trace);
    there an error is a tracing error, which dynamo reports itself."""
    if torch.compiler.is_compiling():
        return fn()
    try:
        return fn()
    except Exception as exc:  # any failure of ours; the model's own result stays untouched
        on_error(exc)
        return None


_MATMUL: set[Any] = {
    torch.matmul,
    torch.Tensor.matmul,
    torch.Tensor.__matmul__,
    torch.bmm,
    torch.Tensor.bmm,
    torch.einsum,
}


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensor arguments of a call, one level into lists and tuples (einsum's operands)."""
    out: list[torch.Tensor] = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out += [t for t in a if isinstance(t, torch.Tensor)]
    return out


class AttentionZMode(TorchFunctionMode):
    """Collects the attention LSE of the attention call(s) made while it is active.

    ``sink(lse, every_row_attends)`` receives the (..., heads, queries) fp32 LSE of each
    intercepted call. ``seen`` counts attention calls found since the last :meth:`begin`;
    ``candidates`` counts softmax calls that were not (yet) identified as attention.
    ``on_recompute(reason)`` is told each time an SDPA call had to take the costly path (scores
    recomputed beside the call because no LSE kernel applies); ``on_error(exc)`` each time our
    own work failed (the call then ran as the model made it).

    A softmax over the last dimension of a tensor of 3 or more dimensions is only a candidate:
    its LSE is kept aside and counted as attention once its output (or a same-shaped tensor made
    from it: dropout, a cast, a head mask) is multiplied by the values in a matmul. A softmax
    whose output is used otherwise (a gate) is never taken, whatever the order of the calls.
    """

    def __init__(
        self,
        sink: LseSink,
        chunk_elements: int,
        on_recompute: Callable[[str], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        super().__init__()
        self.sink = sink
        self.chunk_elements = chunk_elements
        self.on_recompute = on_recompute
        self.on_error = on_error if on_error is not None else _log_error
        self.seen = 0
        self.candidates = 0
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []  # (softmax output or its carrier, LSE)

    def begin(self) -> None:
        """A new forward of the watched module: forget its softmax candidates."""
        self.seen = 0
        self.candidates = 0
        self._pending = []

    def end(self) -> None:
        self._pending = []

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
        out = func(*args, **kwargs)
        if func in _SOFTMAX or self._pending:
            guarded(lambda: self._after(func, args, kwargs, out), self.on_error)
        return out

    def _after(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        if func in _SOFTMAX:
            self._on_softmax(args, kwargs, out)
            return
        inputs = _tensors(args, kwargs)
        hit = [(p, lse) for p, lse in self._pending if any(t is p for t in inputs)]
        if not hit:
            return
        if func in _MATMUL:
            self._pending = [e for e in self._pending if not any(e is h for h in hit)]
            for entry in hit:
                self.seen += 1
                self.candidates -= 1
                with torch.no_grad():
                    self.sink(entry[1], False)
        elif isinstance(out, torch.Tensor) and out.shape == hit[0][0].shape:
            self._pending.append((out, hit[0][1]))  # dropout, cast, head mask...: still the probabilities

    def _on_sdpa(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        a = _sdpa_arguments(args, kwargs)
        self.seen += 1
        try:
            out, lse = sdpa_with_lse(a)
        except KernelUnavailable as why:
            if self.on_recompute is not None:
                self.on_recompute(str(why))
        except Exception as exc:  # not ours to raise: the call runs as the model made it
            self.on_error(exc)
            return func(*args, **kwargs)
        else:
            guarded(lambda: self._sink_lse(lse, a.get("attn_mask") is None), self.on_error)
            return out
        out = func(*args, **kwargs)  # the model's own call (its own errors are the model's)
        guarded(lambda: self._recompute(a), self.on_error)
        return out

    def _sink_lse(self, lse: torch.Tensor, every_row_attends: bool) -> None:
        with torch.no_grad():
            self.sink(lse, every_row_attends)

    def _recompute(self, a: dict[str, Any]) -> None:
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

    def _on_softmax(self, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        x = args[0] if args else kwargs.get("input")
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor) or x.dim() < 3:
            return
        if dim not in (-1, x.dim() - 1):
            return
        with torch.no_grad():
            lse = torch.logsumexp(x.detach().float(), dim=-1)
        self._pending.append((out, lse))
        self.candidates += 1


def _log_error(exc: BaseException) -> None:
    log.warning("hooks: attention Z interception failed (%s: %s); the call ran unchanged", type(exc).__name__, exc)
