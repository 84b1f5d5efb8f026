"""The fused branch kernel in Triton's interpreter, against the torch formula it replaces.

Run by ``tests/hooks/test_fused.py`` in a child process with ``TRITON_INTERPRET=1`` in its
environment from the start: Triton reads it when each ``@triton.jit`` function is decorated,
its own standard library included, which happens at its first import (``torch._dynamo``
imports it too), so it cannot be switched on inside a test session that has already started.
The interpreter runs the kernel's own code on CPU tensors: its lane masks, tile loops,
persistent row-block loop and float64 atomics.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from hyperwatch.hooks import fused, indicators
from tests.hooks.test_fused import float64_truth, kernel_sums, spiky

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("run by tests/hooks/test_fused.py with TRITON_INTERPRET=1", allow_module_level=True)


def test_the_interpreter_runs_the_kernel() -> None:
    assert fused.kernel() is not None, "Triton is installed but the kernel module did not import"
    assert type(fused.kernel()).__name__ == "InterpretedFunction"


# (shape, max_tile): one tile (several rows a program, a padded width), C a power of two, and rows
# wider than the tile (walked in tiles: a full last tile, a partial one, a last tile of one column).
CASES = [
    ((3, 7, 96), fused.MAX_TILE),
    ((40, 200), fused.MAX_TILE),
    ((9, 256), fused.MAX_TILE),
    ((37, 200), 64),
    ((5, 1000), 128),
    ((6, 257), 128),
    ((4, 64), 64),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("shape", "max_tile"), CASES)
def test_kernel_equals_the_torch_formula(dtype: torch.dtype, shape: tuple[int, ...],
                                         max_tile: int) -> None:  # fmt: skip
    x = spiky(shape, dtype, seed=len(shape) * 1000 + shape[-1])
    got, want = kernel_sums(x, max_tile), indicators.branch_sums(x)
    truth_sq, truth_outliers = float64_truth(x)
    assert truth_outliers > 0
    assert float(got[1]) == float(want[1]) == truth_outliers
    assert math.isclose(float(got[0]), float(want[0]), rel_tol=1e-6)
    assert math.isclose(float(got[0]), truth_sq, rel_tol=1e-6)


@pytest.mark.parametrize("max_tile", [fused.MAX_TILE, 64])
def test_nonfinite_rows_keep_the_formula_semantics(max_tile: int) -> None:
    """NaN rows stay NaN, +-Inf rows give an infinite sum of squares (not NaN), none has outliers;
    a row holding both +Inf and -Inf has a NaN mean, so NaN, as the formula says."""
    base = spiky((7, 150), torch.float32, seed=3)
    base[0, 4] = math.inf
    base[1, 9] = -math.inf
    base[2] = math.inf  # every element infinite: deviations all NaN, sum of squares still Inf
    base[3, 0], base[3, 1] = math.inf, -math.inf
    base[4, 100] = math.nan
    for dtype in (torch.float32, torch.bfloat16):
        x = base.to(dtype)
        for row in range(x.shape[0]):
            got, want = kernel_sums(x[row : row + 1], max_tile), indicators.branch_sums(x[row : row + 1])
            assert got.tolist() == pytest.approx(want.tolist(), rel=1e-6, nan_ok=True), (dtype, row)
        assert [math.isinf(float(kernel_sums(x[r : r + 1], max_tile)[0])) for r in range(3)] == [True] * 3
        assert math.isnan(float(kernel_sums(x[3:4], max_tile)[0]))
        assert float(kernel_sums(x[:3], max_tile)[0]) == math.inf
        assert math.isnan(float(kernel_sums(x, max_tile)[0]))  # a NaN token makes the layer's sum NaN


def test_kernel_adds_into_its_slots_and_takes_strided_input() -> None:
    x = spiky((2, 16, 48), torch.float32, seed=9)
    out = torch.zeros(2, dtype=torch.float64)
    fused.add_branch_sums_(out, x)
    fused.add_branch_sums_(out, x)
    want = indicators.branch_sums(x) * 2
    assert out[1] == want[1] and math.isclose(float(out[0]), float(want[0]), rel_tol=1e-6)
    wide = spiky((48, 40), torch.float32, seed=10)
    rows = wide.t()  # (40, 48) with a row stride of 1 element: copied to contiguous rows first
    assert kernel_sums(rows).tolist() == pytest.approx(indicators.branch_sums(rows).tolist(), rel=1e-6)
    assert not kernel_sums(torch.empty(0, 48)).any()


def test_bad_arguments_are_refused_with_the_field_named() -> None:
    x = torch.randn(4, 32)
    with pytest.raises(ValueError, match="max_tile=48 must be a power of two"):
        fused.add_branch_sums_(torch.zeros(2, dtype=torch.float64), x, max_tile=48)
    with pytest.raises(ValueError, match="out must be 2 contiguous float64"):
        fused.add_branch_sums_(torch.zeros(2), x)
    with pytest.raises(ValueError, match=r"x is torch\.float64"):
        fused.add_branch_sums_(torch.zeros(2, dtype=torch.float64), x.double())
