"""Causal attention through a kernel that also returns the softmax log-sum-exp (LSE).

The attention Z-value (spec section 4) is the mean of LSE^2 over (batch, head, query). Flash
kernels compute the LSE anyway (they need it for the backward pass), so taking it from the
kernel makes the indicator free. PyTorch exposes those kernels as ATen ops that return it:

- CPU: ``aten._scaled_dot_product_flash_attention_for_cpu`` (any float dtype);
- CUDA: ``aten._scaled_dot_product_flash_attention`` (fp16/bf16 inputs).

They are not differentiable on their own through the public API, so :class:`FlashAttentionLSE`
wraps forward and backward in an ``autograd.Function``. Where neither applies (CUDA in fp32, or
``attention_kernel="sdpa"``), the plain ``F.scaled_dot_product_attention`` fallback runs and,
only when the LSE was asked for, it is computed in query chunks that never hold the full score
matrix. :func:`causal_attention` reports which path ran.

Shapes: ``q, k, v: (B, H, T, D)`` (K/V already expanded to H heads for GQA); ``lse: (B, H, T)``
in natural log, fp32.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

FLASH_LSE = "flash_lse"
SDPA_FALLBACK = "sdpa_fallback"

_aten: Any = torch.ops.aten


class FlashAttentionLSE(torch.autograd.Function):
    """Causal flash attention returning (out, lse); lse is a non-differentiable by-product."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> Any:
        ctx.scale = scale
        ctx.device_type = q.device.type
        if q.is_cuda:
            out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = _aten._scaled_dot_product_flash_attention(
                q, k, v, 0.0, True, False, scale=scale
            )
            ctx.save_for_backward(q, k, v, out, lse, cum_q, cum_k, seed, offset)
            ctx.max_q, ctx.max_k = max_q, max_k
        else:
            out, lse = _aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scale)
            ctx.save_for_backward(q, k, v, out, lse)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor, _grad_lse: torch.Tensor | None) -> Any:
        grad_out = grad_out.contiguous()
        if ctx.device_type == "cuda":
            q, k, v, out, lse, cum_q, cum_k, seed, offset = ctx.saved_tensors
            dq, dk, dv = _aten._scaled_dot_product_flash_attention_backward(
                grad_out,
                q,
                k,
                v,
                out,
                lse,
                cum_q,
                cum_k,
                ctx.max_q,
                ctx.max_k,
                0.0,
                True,
                seed,
                offset,
                scale=ctx.scale,
            )
        else:
            q, k, v, out, lse = ctx.saved_tensors
            dq, dk, dv = _aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad_out, q, k, v, out, lse, 0.0, True, scale=ctx.scale
            )
        return dq, dk, dv, None


def flash_lse_available(q: torch.Tensor) -> bool:
    """Whether the LSE-returning flash kernel can run on these inputs."""
    if q.device.type == "cpu":
        return q.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16)
    if q.is_cuda:
        return q.dtype in (torch.float16, torch.bfloat16)
    return False


@torch.no_grad()
def chunked_causal_lse(q: torch.Tensor, k: torch.Tensor, scale: float, chunk: int = 256) -> torch.Tensor:
    """LSE of causal scores q.k*scale, in query chunks of ``chunk`` rows (never the full T x T)."""
    B, H, T, _ = q.shape
    lse = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
    keys = torch.arange(k.shape[2], device=q.device)
    for start in range(0, T, chunk):
        stop = min(start + chunk, T)
        scores = torch.matmul(q[:, :, start:stop].float(), k.float().transpose(-1, -2)) * scale
        rows = torch.arange(start, stop, device=q.device).unsqueeze(-1)
        scores.masked_fill_(keys.unsqueeze(0) > rows, float("-inf"))
        lse[:, :, start:stop] = torch.logsumexp(scores, dim=-1)
    return lse


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, *, need_lse: bool, kernel: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor | None, str]:
    """Causal attention; returns (out, lse or None, path) where path names the kernel that ran."""
    use_flash = kernel in ("auto", FLASH_LSE) and flash_lse_available(q)
    if kernel == FLASH_LSE and not use_flash:
        raise RuntimeError(
            f"attention_kernel='flash_lse' cannot run on {q.device.type} with dtype {q.dtype}; "
            "use attention_kernel='auto' to fall back to SDPA"
        )
    if use_flash:
        out, lse = FlashAttentionLSE.apply(q, k, v, scale)
        return out, (lse if need_lse else None), FLASH_LSE
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    lse = chunked_causal_lse(q.detach(), k.detach(), scale) if need_lse else None
    return out, lse, SDPA_FALLBACK
