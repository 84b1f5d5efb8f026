"""The output-Z kernel (hooks/triton_lse.py) in Triton's interpreter, against float64 logsumexp.

Run by ``tests/hooks/test_fused.py`` in the same child process as ``interpreted_fused.py`` (see
there why ``TRITON_INTERPRET=1`` needs a fresh process): the kernel's own code on CPU tensors, its
online log-sum-exp across column tiles, lane masks, persistent row-block loop and float64 atomic.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from hyperwatch.hooks import fused, heads

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run by tests/hooks/test_fused.py with TRITON_INTERPRET=1", allow_module_level=True)


def lse_sum(x: torch.Tensor, max_tile: int = fused.MAX_TILE) -> float:
    """The kernel's sum, added into the middle of a larger zeroed buffer (the slot is a view)."""
    buf = torch.zeros(3, dtype=torch.float64)
    fused.add_lse_square_sum_(buf[1:2], x, max_tile=max_tile)
    assert buf[0] == 0 and buf[2] == 0, "the kernel wrote outside its slot"
    return float(buf[1])


def logits(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Output logits with a per-row offset and a few large ones (the rows' max moves between tiles)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 3 + 10 * torch.randn((*shape[:-1], 1), generator=g)
    x += (torch.rand(shape, generator=g) < 0.01) * 25.0
    return x.to(dtype)


# (shape, max_tile): one tile (several rows a program, padded width), rows walked in tiles (full
# and partial last tiles, a last tile of one column), a vocabulary larger than the default tile.
CASES = [((3, 7, 96), fused.MAX_TILE), ((40, 257), fused.MAX_TILE), ((37, 200), 64), ((6, 257), 128),
         ((5, 1000), 128), ((2, 20000), fused.MAX_TILE)]  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("shape", "max_tile"), CASES)
def test_kernel_equals_float64_logsumexp(dtype: torch.dtype, shape: tuple[int, ...], max_tile: int) -> None:
    x = logits(shape, dtype, seed=shape[-1] + max_tile)
    want = float(torch.logsumexp(x.double(), -1).square().sum())  # float64 arithmetic on the same values
    assert lse_sum(x, max_tile) == pytest.approx(want, rel=2e-6)
    total, n = heads.output_z_sums(x)  # the torch formula the kernel replaces
    assert n == x.numel() // shape[-1] and float(total[0]) == pytest.approx(want, rel=2e-6)


@pytest.mark.parametrize("max_tile", [fused.MAX_TILE, 32])
def test_nonfinite_rows_keep_their_meaning(max_tile: int) -> None:
    """NaN anywhere: NaN. +inf: +inf. Every logit -inf: LSE -inf, square +inf. -inf among finite
    logits (a masked vocabulary entry), in the first tile or later: the finite LSE of the rest."""
    base = logits((6, 100), torch.float32, seed=1)
    base[0, 70] = math.nan
    base[1, 3] = math.inf
    base[2] = -math.inf
    base[3, :40] = -math.inf  # the first tiles hold nothing but -inf at max_tile 32
    base[4, 99] = -math.inf
    for dtype in (torch.float32, torch.bfloat16):
        x = base.to(dtype)
        got = [lse_sum(x[r : r + 1], max_tile) for r in range(6)]
        assert math.isnan(got[0]) and got[1] == math.inf and got[2] == math.inf
        for r in (3, 4, 5):
            assert got[r] == pytest.approx(float(torch.logsumexp(x[r].double(), -1) ** 2), rel=2e-6), (dtype, r)
        assert math.isnan(lse_sum(x, max_tile))  # a NaN position makes the step's output Z NaN
        assert lse_sum(x[1:3], max_tile) == math.inf


def test_kernel_adds_into_its_slot_and_takes_strided_input() -> None:
    x = logits((2, 16, 48), torch.float32, seed=9)
    out = torch.zeros(1, dtype=torch.float64)
    fused.add_lse_square_sum_(out, x)
    fused.add_lse_square_sum_(out, x)
    want = 2 * float(torch.logsumexp(x.double(), -1).square().sum())
    assert float(out[0]) == pytest.approx(want, rel=1e-6)
    rows = logits((48, 40), torch.float32, seed=10).t()  # a row stride of 1 element: made contiguous
    assert lse_sum(rows) == pytest.approx(float(torch.logsumexp(rows.double(), -1).square().sum()), rel=1e-6)
    assert lse_sum(torch.empty(0, 48)) == 0.0
