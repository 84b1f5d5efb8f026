"""One read of each tensor measured on CUDA: the Triton kernels of :mod:`hooks.triton_branch`
(branch statistics) and :mod:`hooks.triton_lse` (output Z).

Triton is optional (a CUDA build of torch brings its own; a CPU build has none), so it is imported
the first time a CUDA tensor is measured. :func:`applies` says whether the kernels take a tensor:
on CUDA, in a dtype they load (fp32, fp16, bf16), with Triton importable, and not while
``torch.compile`` traces (inductor fuses the torch formulas itself, and an opaque launch there
would break the graph). Otherwise the caller uses the torch formulas,
:func:`hooks.indicators.add_branch_sums_` and :func:`hooks.heads.output_z_sums`; both add the
same sums into the same slots, and neither synchronizes the host.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
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

_kernels: Any = None  # (branch, lse) jitted kernels once imported; False once the import failed


def _loaded() -> Any | None:
    global _kernels
    if _kernels is None:
        try:
            from hyperwatch.hooks import triton_branch, triton_lse

            _kernels = (triton_branch.branch_sums_kernel, triton_lse.lse_square_sum_kernel)
        except Exception as exc:  # ImportError, or a Triton that cannot initialise here
            log.info("branch statistics and output Z use the torch formulas: Triton is unavailable (%s)", exc)
            _kernels = False
    return _kernels or None


def kernel() -> Any | None:
    """The branch kernel, imported on first use; None when Triton is missing or fails to import."""
    k = _loaded()
    return k[0] if k else None


def lse_kernel() -> Any | None:
    """The output-Z kernel (:mod:`hooks.triton_lse`), as :func:`kernel`."""
    k = _loaded()
    return k[1] if k else None


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


def _rows(name: str, out: torch.Tensor, n_out: int, x: torch.Tensor, max_tile: int) -> torch.Tensor:
    """``x`` as 2-D rows with unit column stride, after the arguments' checks (naming ``name``)."""
    if max_tile < 1 or max_tile & (max_tile - 1):
        raise ValueError(f"fused.{name}: max_tile={max_tile} must be a power of two")
    if out.dtype != torch.float64 or out.numel() != n_out or not out.is_contiguous() or out.device != x.device:
        raise ValueError(
            f"fused.{name}: out must be {n_out} contiguous float64 element{'s' if n_out > 1 else ''} on "
            f"{x.device}; got {out.dtype} of shape {tuple(out.shape)} on {out.device}"
        )
    if x.dtype not in KERNEL_DTYPES:
        raise ValueError(f"fused.{name}: x is {x.dtype}; the kernel loads {KERNEL_DTYPES}")
    rows = x.detach().reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _launch(k: Any, rows: torch.Tensor, cfg: Launch, *args: Any, **constexprs: Any) -> None:
    grid = min(-(-rows.shape[0] // cfg.block_r), _programs(rows.device))
    # Triton launches on the current device: make it the tensor's (a model on cuda:1 while cuda:0 is current)
    with torch.cuda.device(rows.device) if rows.is_cuda else contextlib.nullcontext():
        k[(grid,)](
            rows,
            *args,
            BLOCK_R=cfg.block_r,
            BLOCK_C=cfg.block_c,
            **constexprs,
            num_warps=cfg.warps,
            enable_fp_fusion=True,  # FMA contraction, Triton's historical default; explicit (3.9 warns, 3.10 flips it)
        )


def add_branch_sums_(out: torch.Tensor, x: torch.Tensor, max_tile: int = MAX_TILE) -> None:
    """Add [sum of x^2, number of 5-sigma outliers] of ``x`` (..., hidden) into ``out`` (2 float64).

    One kernel launch, no host synchronization. ``max_tile`` (a power of two) caps the row width
    held whole in registers; tests lower it to walk rows in tiles.
    """
    k = kernel()
    if k is None:
        raise RuntimeError("fused.add_branch_sums_: Triton is not importable; use indicators.add_branch_sums_")
    rows = _rows("add_branch_sums_", out, 2, x, max_tile)
    n, hidden = rows.shape
    if n == 0 or hidden == 0:
        return
    cfg = launch_config(n, hidden, max_tile)
    _launch(
        k, rows, cfg, out, n, hidden, rows.stride(0), OUTLIER_SIGMAS * OUTLIER_SIGMAS / hidden, ONE_TILE=cfg.one_tile
    )


def add_lse_square_sum_(out: torch.Tensor, logits: torch.Tensor, max_tile: int = MAX_TILE) -> None:
    """Add the sum over rows of LSE(row)^2 of ``logits`` (..., vocab) into ``out`` (1 float64).

    One kernel launch that reads each logit once in its own dtype (no fp32 copy, no log-softmax
    temporary), no host synchronization. Rows are walked in tiles of at most ``max_tile``.
    """
    k = lse_kernel()
    if k is None:
        raise RuntimeError("fused.add_lse_square_sum_: Triton is not importable; use heads.output_z_sums")
    rows = _rows("add_lse_square_sum_", out, 1, logits, max_tile)
    n, vocab = rows.shape
    if n == 0:
        return
    if vocab == 0:  # an empty softmax: LSE -inf, LSE^2 +inf per row, as the torch formula says
        out.add_(math.inf)
        return
    cfg = launch_config(n, vocab, max_tile)
    _launch(k, rows, cfg, out, n, vocab, rows.stride(0))
