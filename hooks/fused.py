"""One read of each branch output on CUDA: the Triton kernel of :mod:`hooks.triton_branch`.

Triton is optional (a CUDA build of torch brings its own; a CPU build has none), so it is imported
the first time a CUDA branch output is measured. :func:`applies` says whether the kernel takes a
tensor: on CUDA, in a dtype it loads (fp32, fp16, bf16), with Triton importable, and not while
``torch.compile`` traces (inductor fuses :func:`hooks.indicators.branch_sums` itself, and an
opaque launch there would break the graph). Otherwise the caller uses the torch formula,
:func:`hooks.indicators.add_branch_sums_`; both add the same two sums into the same slots, and
neither synchronizes the host.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any, NamedTuple

import torch

from hyperwatch.hooks.indicators import OUTLIER_SIGMAS

log = logging.getLogger(__name__)

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_TILE = 16384
"""The widest row kept whole in registers (one HBM read); wider rows are walked in tiles of this."""
TILE_ELEMENTS = 8192
"""Elements one program holds per row block (rows x padded width): 32 fp32 values a thread at 8 warps."""
PROGRAMS_PER_SM = 4

_kernel: Any = None  # the jitted kernel once imported; False once the import failed


def kernel() -> Any | None:
    """The Triton kernel, imported on first use; None when Triton is missing or fails to import."""
    global _kernel
    if _kernel is None:
        try:
            from hyperwatch.hooks import triton_branch

            _kernel = triton_branch.branch_sums_kernel
        except Exception as exc:  # ImportError, or a Triton that cannot initialise here
            log.info("branch statistics use the torch formula: Triton is unavailable (%s)", exc)
            _kernel = False
    return _kernel or None


def applies(x: torch.Tensor) -> bool:
    """Whether :func:`add_branch_sums_` takes ``x`` (cheapest tests first; no import while tracing)."""
    return x.is_cuda and x.dtype in KERNEL_DTYPES and not torch.compiler.is_compiling() and kernel() is not None


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class Launch(NamedTuple):
    block_r: int  # rows a program holds at once
    block_c: int  # padded row width (one tile) or tile width
    one_tile: bool  # the row fits the tile: read once
    warps: int


def launch_config(n_rows: int, hidden: int, max_tile: int = MAX_TILE) -> Launch:
    """The kernel's block shape for rows of ``hidden`` elements (``n_rows`` caps the rows a block)."""
    width = _pow2(hidden)
    one_tile = width <= max_tile
    block_c = width if one_tile else max_tile
    block_r = max(1, min(TILE_ELEMENTS // block_c, _pow2(n_rows)))
    elements = block_r * block_c
    return Launch(block_r, block_c, one_tile, 4 if elements <= 2048 else 8 if elements <= 8192 else 16)


@functools.lru_cache(maxsize=16)
def _programs(device: torch.device) -> int:
    """A persistent grid: a few programs per SM (the interpreter on CPU tensors gets four)."""
    if device.type != "cuda":
        return 4
    return PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count


def add_branch_sums_(out: torch.Tensor, x: torch.Tensor, max_tile: int = MAX_TILE) -> None:
    """Add [sum of x^2, number of 5-sigma outliers] of ``x`` (..., hidden) into ``out`` (2 float64).

    One kernel launch, no host synchronization. ``max_tile`` (a power of two) caps the row width
    held whole in registers; tests lower it to walk rows in tiles.
    """
    k = kernel()
    if k is None:
        raise RuntimeError("fused.add_branch_sums_: Triton is not importable; use indicators.add_branch_sums_")
    if max_tile < 1 or max_tile & (max_tile - 1):
        raise ValueError(f"fused.add_branch_sums_: max_tile={max_tile} must be a power of two")
    if out.dtype != torch.float64 or out.numel() != 2 or not out.is_contiguous() or out.device != x.device:
        raise ValueError(
            f"fused.add_branch_sums_: out must be 2 contiguous float64 elements on {x.device}; "
            f"got {out.dtype} of shape {tuple(out.shape)} on {out.device}"
        )
    if x.dtype not in KERNEL_DTYPES:
        raise ValueError(f"fused.add_branch_sums_: x is {x.dtype}; the kernel loads {KERNEL_DTYPES}")
    hidden = x.shape[-1]
    rows = x.detach().reshape(-1, hidden)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    n = rows.shape[0]
    if n == 0 or hidden == 0:
        return
    cfg = launch_config(n, hidden, max_tile)
    grid = min(-(-n // cfg.block_r), _programs(x.device))
    # Triton launches on the current device: make it the tensor's (a model on cuda:1 while cuda:0 is current)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        k[(grid,)](
            rows,
            out,
            n,
            hidden,
            rows.stride(0),
            OUTLIER_SIGMAS * OUTLIER_SIGMAS / hidden,
            BLOCK_R=cfg.block_r,
            BLOCK_C=cfg.block_c,
            ONE_TILE=cfg.one_tile,
            num_warps=cfg.warps,
            enable_fp_fusion=True,  # FMA contraction, Triton's historical default; explicit (3.9 warns, 3.10 flips it)
        )
