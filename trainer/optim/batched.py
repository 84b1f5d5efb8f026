"""The matrix optimizers' per-step work, batched over same-shaped matrices (the GPU path).

MuonH's step is, per matrix, Newton-Schulz on the momentum direction and a renormalisation onto
the sphere ``||W||_F = c_W``. Done one parameter at a time that is ~15 small kernels per matrix
(a d=8 paper model has 8 layers x 7 hidden matrices, plus 63 experts x 3 per MoE layer): launch
bound on a GPU. Here the matrices of a step are grouped by shape -- every expert of a bank, and the
same-shaped matrices of all layers -- stacked into one ``(n, rows, cols)`` tensor, orthogonalised
by one batched Newton-Schulz (bf16 on CUDA) and renormalised by one batched update; the results
are written back with one ``_foreach_copy_``. The arithmetic per matrix is the per-matrix path's
(tests/trainer/optim/test_batched.py compares them).

Sharded parameters (FSDP2 ``DTensor``): the orthogonalisation and the norms need whole matrices,
so :func:`full` all-gathers the direction and the weight, every rank computes the same update
on the whole matrices, and :func:`write_back` copies this rank's shard of the result into the
local shard (gather, orthogonalise, shard back). Elementwise state (momentum, Adam moments) stays
sharded.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hyperwatch.trainer.optim.newton_schulz import newton_schulz5

try:  # DTensor ships with torch.distributed; absent on builds without it
    from torch.distributed.tensor import DTensor, distribute_tensor
except ImportError:  # pragma: no cover - torch built without distributed
    DTensor = None  # type: ignore[assignment,misc]
    distribute_tensor = None  # type: ignore[assignment]

NORM_EPS = 1e-12


def is_sharded(t: torch.Tensor) -> bool:
    return DTensor is not None and isinstance(t, DTensor)


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor: ``t`` itself, or all shards gathered when it is a ``DTensor``."""
    return t.full_tensor() if is_sharded(t) else t  # type: ignore[attr-defined]


def write_back(params: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> None:
    """``p.copy_(v)`` for each pair (``v`` whole), this rank's shard only for sharded ``p``; one foreach copy."""
    dst: list[torch.Tensor] = []
    src: list[torch.Tensor] = []
    for p, v in zip(params, values, strict=True):
        if is_sharded(p):
            assert distribute_tensor is not None
            local = distribute_tensor(v, p.device_mesh, p.placements, src_data_rank=None)  # type: ignore[attr-defined]
            dst.append(p.to_local())  # type: ignore[attr-defined]
            src.append(local.to_local())
        else:
            dst.append(p)
            src.append(v.reshape(p.shape))
    src = [s.to(d.dtype) for s, d in zip(src, dst, strict=True)]
    torch._foreach_copy_(dst, src)


def matrix_norm(x: torch.Tensor) -> torch.Tensor:
    """Frobenius norm of each matrix in ``x`` (shape ``(..., m, n)``), kept as ``(..., 1, 1)``."""
    return x.norm(dim=(-2, -1), keepdim=True)


def buckets(tensors: Sequence[torch.Tensor]) -> dict[tuple[object, ...], list[int]]:
    """Indices of ``tensors`` grouped by (rows, cols, dtype, device): what can be stacked together."""
    out: dict[tuple[object, ...], list[int]] = {}
    for i, t in enumerate(tensors):
        out.setdefault((t.shape[-2], t.shape[-1], t.dtype, t.device), []).append(i)
    return out


def stack(tensors: Sequence[torch.Tensor], dtype: torch.dtype | None = None) -> torch.Tensor:
    """Same-shaped matrices (each ``(..., r, c)``) as one ``(n, r, c)`` tensor, in ``dtype``."""
    r, c = tensors[0].shape[-2:]
    flat = [t.reshape(-1, r, c) for t in tensors]
    out = flat[0] if len(flat) == 1 else torch.cat(flat)
    return out.to(dtype) if dtype is not None else out


def unstack(stacked: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The inverse of :func:`stack`: views of ``stacked`` shaped like each of ``like``."""
    sizes = [t.numel() // (t.shape[-2] * t.shape[-1]) for t in like]
    return [part.reshape(t.shape) for part, t in zip(stacked.split(sizes), like, strict=True)]


def orthogonalise(directions: Sequence[torch.Tensor], steps: int) -> list[torch.Tensor]:
    """Newton-Schulz of every matrix, one batched call per shape bucket (bf16 on CUDA)."""
    out: list[torch.Tensor] = [torch.empty(0)] * len(directions)
    for idx in buckets(directions).values():
        group = [directions[i] for i in idx]
        for i, o in zip(idx, unstack(newton_schulz5(stack(group), steps=steps), group), strict=True):
            out[i] = o
    return out


def sphere_update(
    params: Sequence[torch.Tensor],
    weights: Sequence[torch.Tensor],
    directions: Sequence[torch.Tensor],
    c_ws: Sequence[torch.Tensor],
    lr: float,
    weight_decay: float,
) -> None:
    """``W+ = c_W (W' - lr G_hat) / ||W' - lr G_hat||_F``, ``G_hat = c_W G/||G||_F``, batched per shape.

    ``weights`` and ``directions`` are whole matrices (gathered when sharded), ``c_ws`` each
    ``(..., 1, 1)`` in the work precision; the result goes to ``params`` (their shard when sharded).
    """
    for idx in buckets(weights).values():
        dtype = c_ws[idx[0]].dtype
        w = stack([weights[i] for i in idx], dtype)
        if weight_decay != 0.0:
            w = w * (1.0 - lr * weight_decay)
        g = stack([directions[i] for i in idx], dtype)
        c = stack([c_ws[i] for i in idx], dtype)
        w = w - lr * (c * g / (matrix_norm(g) + NORM_EPS))
        w = c * w / matrix_norm(w)
        write_back([params[i] for i in idx], unstack(w, [weights[i] for i in idx]))
