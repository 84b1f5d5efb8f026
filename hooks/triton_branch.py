"""The Triton kernel behind :mod:`hooks.fused` (imported only through it, and only when Triton is).

One program owns ``BLOCK_R`` token rows at a time and walks over row blocks with a stride of the
grid (a persistent grid: a few programs per SM, so the float64 atomics at the end are a few
hundred, not one per row block). Per row, in fp32, with the semantics of
:func:`hooks.indicators.branch_sums`: mean m, S = nansum (x - m)^2, the count of (x - m)^2 >
25 S / C, and sum x^2 = S + C m^2; per-row values are summed over rows in float64 and added into
``out[0]`` and ``out[1]`` with one atomic add each per program (their order, hence the last bit of
the float64 sums, varies between runs).

``ONE_TILE`` (the row fits ``BLOCK_C``): the row is loaded once into registers and every
statistic comes from there (one HBM read, a two-pass variance without a second load). Otherwise
the row is walked in tiles twice: the first walk combines each tile's (mean, M2) with Chan's
parallel formula (stable, no cancellation) and sums the tile for the mean itself; the second
re-reads the row for the outlier count, which needs the final m and S (two reads of the row, the
second usually from L2). A row whose mean is not finite (it holds NaN or +-Inf) gets what the torch
formula gives it: sum x^2 = C m^2 (NaN, or Inf) and no outlier.
"""

from __future__ import annotations

import triton
import triton.language as tl

FP32_MAX: tl.constexpr = tl.constexpr(3.4028234663852886e38)


@triton.jit
def _tile(x_ptr, rows, rmask, cols, n_cols, stride_row):
    """(fp32 values, mask) of the rows' columns ``cols``; masked lanes read 0."""
    mask = rmask[:, None] & (cols[None, :] < n_cols)
    ptrs = x_ptr + rows[:, None].to(tl.int64) * stride_row + cols[None, :]
    return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32), mask


@triton.jit
def branch_sums_kernel(
    x_ptr,
    out_ptr,
    n_rows,
    n_cols,
    stride_row,
    outlier_scale,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    ONE_TILE: tl.constexpr,
):
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_C)
    acc_sq = tl.zeros([BLOCK_R], dtype=tl.float64)
    acc_out = tl.zeros([BLOCK_R], dtype=tl.float64)
    for block in range(pid, tl.cdiv(n_rows, BLOCK_R), n_prog):
        rows = block * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = rows < n_rows
        if ONE_TILE:
            x, mask = _tile(x_ptr, rows, rmask, cols, n_cols, stride_row)
            mean = tl.sum(x, axis=1) / n_cols
            d = x - mean[:, None]
            e = d * d
            e = tl.where(mask & (e == e), e, 0.0)  # nansum, and the padding lanes out
            dev_sum = tl.sum(e, axis=1)
            hits = tl.where(e > (dev_sum * outlier_scale)[:, None], 1.0, 0.0)
            outliers = tl.sum(hits, axis=1)
        else:
            x, mask = _tile(x_ptr, rows, rmask, cols, n_cols, stride_row)
            n_a = tl.minimum(n_cols, BLOCK_C).to(tl.float32)
            total = tl.sum(x, axis=1)
            mean_a = total / n_a
            d = tl.where(mask, x - mean_a[:, None], 0.0)
            m2 = tl.sum(d * d, axis=1)
            for c0 in range(BLOCK_C, n_cols, BLOCK_C):  # fresh names inside: nothing tile-sized is loop-carried
                xb, mb = _tile(x_ptr, rows, rmask, c0 + cols, n_cols, stride_row)
                n_b = tl.minimum(n_cols - c0, BLOCK_C).to(tl.float32)
                s_b = tl.sum(xb, axis=1)
                mean_b = s_b / n_b
                db = tl.where(mb, xb - mean_b[:, None], 0.0)
                n = n_a + n_b
                delta = mean_b - mean_a
                mean_a = mean_a + delta * (n_b / n)
                m2 = m2 + tl.sum(db * db, axis=1) + delta * delta * (n_a * n_b / n)
                n_a = n
                total += s_b
            mean = total / n_cols
            finite = tl.abs(mean) <= FP32_MAX  # False for NaN and +-Inf
            dev_sum = tl.where(finite, m2, 0.0)
            limit = dev_sum * outlier_scale
            outliers = tl.zeros([BLOCK_R], dtype=tl.float32)
            for c0 in range(0, n_cols, BLOCK_C):
                xb, mb = _tile(x_ptr, rows, rmask, c0 + cols, n_cols, stride_row)
                db = xb - mean[:, None]
                outliers += tl.sum(tl.where(mb & ((db * db) > limit[:, None]), 1.0, 0.0), axis=1)
            outliers = tl.where(finite, outliers, 0.0)
        sumsq = dev_sum + n_cols * mean * mean
        acc_sq += tl.where(rmask, sumsq.to(tl.float64), 0.0)
        acc_out += tl.where(rmask, outliers.to(tl.float64), 0.0)
    tl.atomic_add(out_ptr, tl.sum(acc_sq, axis=0), sem="relaxed")
    tl.atomic_add(out_ptr + 1, tl.sum(acc_out, axis=0), sem="relaxed")
