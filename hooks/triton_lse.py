"""The Triton kernel behind output Z on CUDA (imported only through :mod:`hooks.fused`).

Output Z is the mean over positions of LSE(logits over the vocabulary)^2. The torch formula makes an
fp32 copy of the logits and a log-softmax of them: for a 128k vocabulary and 32k tokens a step, two
16 GB temporaries on top of the model's own logits. This kernel reads each row once, in its own
dtype, and keeps nothing but registers: one program owns ``BLOCK_R`` rows at a time and walks their
columns in tiles of ``BLOCK_C`` with the online log-sum-exp (running max m and running sum
s = sum exp(x - m), rescaled when m grows), over a persistent grid like the branch kernel's. Per
row, LSE = m + log s in fp32; the squares are summed in float64 and added into ``out[0]`` with one
atomic add per program (their order, hence the last bits of the sum, varies between runs).

Non-finite rows keep what they mean: a row holding NaN gives NaN; a row holding +inf gives +inf;
a row whose every logit is -inf gives -inf (LSE^2 = +inf). The detectors report each of them.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def lse_square_sum_kernel(
    x_ptr,
    out_ptr,
    n_rows,
    n_cols,
    stride_row,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_C)
    acc = tl.zeros([BLOCK_R], dtype=tl.float64)
    for block in range(pid, tl.cdiv(n_rows, BLOCK_R), n_prog):
        rows = block * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = rows < n_rows
        base = x_ptr + rows[:, None].to(tl.int64) * stride_row
        m = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
        s = tl.zeros([BLOCK_R], dtype=tl.float32)
        nan = tl.zeros([BLOCK_R], dtype=tl.int1)
        for c0 in range(0, n_cols, BLOCK_C):
            c = c0 + cols
            mask = rmask[:, None] & (c[None, :] < n_cols)
            x = tl.load(base + c[None, :], mask=mask, other=float("-inf")).to(tl.float32)
            nan = nan | (tl.sum((x != x).to(tl.int32), axis=1) > 0)
            m_new = tl.maximum(m, tl.max(x, axis=1))
            empty = m_new == float("-inf")  # nothing but -inf so far: keep s at 0, not exp(-inf + inf)
            alpha = tl.where(empty, 0.0, tl.exp(m - m_new))
            p = tl.where(empty[:, None], 0.0, tl.exp(x - m_new[:, None]))
            s = s * alpha + tl.sum(p, axis=1)
            m = m_new
        lse = m + tl.log(s)
        lse = tl.where(m == float("inf"), float("inf"), lse)
        lse = tl.where(m == float("-inf"), float("-inf"), lse)
        lse = tl.where(nan, float("nan"), lse)
        sq = lse.to(tl.float64) * lse.to(tl.float64)
        acc += tl.where(rmask, sq, 0.0)
    tl.atomic_add(out_ptr, tl.sum(acc, axis=0), sem="relaxed")
