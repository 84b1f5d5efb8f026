"""The fused kernels (hooks/fused.py: branch statistics, output Z) against the torch formulas they
replace on CUDA.

Without a GPU the kernels run in Triton's interpreter: ``interpreted_fused.py`` and
``interpreted_lse.py`` hold those tests, run here in a child process whose environment sets
``TRITON_INTERPRET=1`` before Triton is first imported (see there why it must be a fresh
process). On a GPU the last tests compare the compiled kernels with the formulas on the device.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from hyperwatch.hooks import fused, indicators
from hyperwatch.hooks.accumulate import Accumulator


def test_kernel_in_the_triton_interpreter() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    files = [str(Path(__file__).with_name(f)) for f in ("interpreted_fused.py", "interpreted_lse.py")]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]


def kernel_sums(x: torch.Tensor, max_tile: int = fused.MAX_TILE) -> torch.Tensor:
    """The kernel's two sums, added into the middle of a larger zeroed buffer (slots are views)."""
    buf = torch.zeros(6, dtype=torch.float64, device=x.device)
    fused.add_branch_sums_(buf[2:4], x, max_tile=max_tile)
    assert not buf[:2].any() and not buf[4:].any(), "the kernel wrote outside its two slots"
    return buf[2:4].cpu()


def float64_truth(x: torch.Tensor) -> tuple[float, int]:
    xd = x.double()
    mean, sigma = xd.mean(-1, keepdim=True), xd.std(-1, correction=0, keepdim=True)
    return float(xd.square().sum()), int(((xd - mean).abs() > 5 * sigma).sum())


def spiky(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Tokens with a common offset larger than their spread, and sparse 5-sigma-plus spikes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 2 + 20 * torch.randn((*shape[:-1], 1), generator=g)
    x += (torch.rand(shape, generator=g) < 0.004) * 30.0
    return x.to(dtype)


# (dtype, rows, hidden): the benchmark's shape in every dtype; wide rows (one tile up to 16384,
# walked in tiles beyond); a hidden size that is not a multiple of 16 (no vector loads then).
AOT_CASES = [("bf16", 16384, 1024), ("fp16", 16384, 1024), ("fp32", 16384, 1024), ("bf16", 16384, 4096),
             ("bf16", 2048, 16384), ("fp32", 64, 20000), ("bf16", 4096, 1000), ("fp32", 16, 96)]  # fmt: skip


@pytest.mark.parametrize(("dtype", "rows", "hidden"), AOT_CASES)
def test_kernel_compiles_for_hopper_with_vector_loads_and_two_float64_atomics(dtype: str, rows: int,
                                                                             hidden: int) -> None:  # fmt: skip
    """Without a GPU, Triton still compiles the kernel for sm_90 (its own ptxas): the block shape
    :func:`fused.launch_config` picks, with the 16-divisibility the JIT gives aligned arguments.
    The PTX must load 16 bytes a thread where the row stride allows it, add into the two float64
    slots with exactly two atomics (per program), and the cubin must not spill to local memory."""
    triton = pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("TRITON_INTERPRET=1 is set for the whole run")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from hyperwatch.hooks.triton_branch import branch_sums_kernel

    cfg = fused.launch_config(rows, hidden)
    args = ["x_ptr", "out_ptr", "n_rows", "n_cols", "stride_row", "outlier_scale"]
    signature = dict(zip(args, [f"*{dtype}", "*fp64", "i32", "i32", "i32", "fp32"]))
    signature.update(BLOCK_R="constexpr", BLOCK_C="constexpr", ONE_TILE="constexpr")
    divisible = [0, 1] + [i for i, v in ((2, rows), (3, hidden), (4, hidden)) if v % 16 == 0]
    src = ASTSource(
        fn=branch_sums_kernel,
        signature=signature,
        constexprs={"BLOCK_R": cfg.block_r, "BLOCK_C": cfg.block_c, "ONE_TILE": cfg.one_tile},
        attrs={(i,): [["tt.divisibility", 16]] for i in divisible},
    )
    compiled = triton.compile(
        src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.warps, "enable_fp_fusion": True}
    )
    _check_ptx_and_spills(compiled, triton, atomics=2, vector_loads=hidden % 16 == 0)


# (dtype, rows, vocab): the benchmarks' vocabulary, Llama 3's, one that is not a multiple of 16.
LSE_AOT_CASES = [("bf16", 16384, 32000), ("fp32", 16384, 32000), ("bf16", 32768, 128256), ("fp16", 64, 50257)]


@pytest.mark.parametrize(("dtype", "rows", "vocab"), LSE_AOT_CASES)
def test_lse_kernel_compiles_for_hopper_with_one_float64_atomic(dtype: str, rows: int, vocab: int) -> None:
    """The output-Z kernel for sm_90 as :func:`fused.add_lse_square_sum_` launches it: 16-byte loads
    where the row stride allows, one float64 atomic per program, and no spill to local memory."""
    triton = pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("TRITON_INTERPRET=1 is set for the whole run")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from hyperwatch.hooks.triton_lse import lse_square_sum_kernel

    cfg = fused.launch_config(rows, vocab)
    args = ["x_ptr", "out_ptr", "n_rows", "n_cols", "stride_row"]
    signature = dict(zip(args, [f"*{dtype}", "*fp64", "i32", "i32", "i32"]))
    signature.update(BLOCK_R="constexpr", BLOCK_C="constexpr")
    divisible = [0, 1] + [i for i, v in ((2, rows), (3, vocab), (4, vocab)) if v % 16 == 0]
    src = ASTSource(
        fn=lse_square_sum_kernel,
        signature=signature,
        constexprs={"BLOCK_R": cfg.block_r, "BLOCK_C": cfg.block_c},
        attrs={(i,): [["tt.divisibility", 16]] for i in divisible},
    )
    compiled = triton.compile(
        src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.warps, "enable_fp_fusion": True}
    )
    _check_ptx_and_spills(compiled, triton, atomics=1, vector_loads=vocab % 16 == 0)


def _check_ptx_and_spills(compiled: Any, triton: Any, atomics: int, vector_loads: bool) -> None:
    ptx = compiled.asm["ptx"]
    assert len(re.findall(r"\b(?:red|atom)\.global\.[\w.]*add\.f64", ptx)) == atomics
    loads = set(re.findall(r"ld\.global[\w.]*", ptx))
    assert any(".v" in op for op in loads) == vector_loads, loads
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if cuobjdump.exists():
        cubin = Path(os.environ.get("TMPDIR", "/tmp")) / f"hyperwatch-kernel-{os.getpid()}.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        try:
            usage = subprocess.run([str(cuobjdump), "-res-usage", str(cubin)], capture_output=True, text=True).stdout
        finally:
            cubin.unlink()
        assert re.search(r"\bLOCAL:0\b", usage), usage


def test_the_kernel_is_for_cuda_tensors_only() -> None:
    """On CPU the accumulator keeps the torch formula (the interpreter exists for the tests only)."""
    assert not fused.applies(torch.randn(2, 8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_kernel_equals_the_formula_without_host_sync() -> None:
    """On a GPU: the compiled kernel against the torch formula on the same device, the accumulator
    takes the kernel, and neither path synchronizes the host (sync debug mode raises if one does)."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("TRITON_INTERPRET=1 is set for the whole run")
    dev = torch.device("cuda")
    cases = [((4 * 4096, 1024), fused.MAX_TILE), ((64, 1536), fused.MAX_TILE), ((16, 20000), fused.MAX_TILE),
             ((33, 1000), 256)]  # fmt: skip
    for dtype in (torch.bfloat16, torch.float32, torch.float16):
        for shape, tile in cases:
            x = spiky(shape, dtype, seed=shape[-1]).to(dev)
            x[0, 5] = math.inf
            got, want = kernel_sums(x, tile), indicators.branch_sums(x).cpu()
            assert float(got[0]) == float(want[0]) == math.inf
            x[0, 5] = 0.0
            got, want = kernel_sums(x, tile), indicators.branch_sums(x).cpu()
            assert abs(float(got[1]) - float(want[1])) <= 1e-6 * x.numel(), (dtype, shape)
            assert math.isclose(float(got[0]), float(want[0]), rel_tol=1e-5), (dtype, shape)
    x = spiky((2, 512, 1024), torch.bfloat16, seed=1).to(dev)
    assert fused.applies(x)
    acc = Accumulator(1, [0], dev)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        acc.add_branch(0, "mlp", x)
        indicators.add_branch_sums_(torch.zeros(2, dtype=torch.float64, device=dev), x)
        packed = acc.pack()  # the host counts join the device tensor without a sync
    finally:
        torch.cuda.set_sync_debug_mode("default")
    values = acc.unpack(packed.cpu().numpy())
    truth_sq, truth_outliers = float64_truth(x)
    assert values[0].mlp_rms == pytest.approx(math.sqrt(truth_sq / x.numel()), rel=1e-5)
    assert values[0].mlp_outlier_ratio == pytest.approx(truth_outliers / x.numel(), abs=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_output_z_kernel_equals_float64_without_host_sync() -> None:
    """On a GPU: the compiled output-Z kernel against float64 logsumexp, through the accumulator,
    with no host synchronization (sync debug mode raises if there is one)."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("TRITON_INTERPRET=1 is set for the whole run")
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(5)
    for dtype, shape in (
        (torch.bfloat16, (4, 512, 32000)),
        (torch.float32, (3, 100, 50257)),
        (torch.float16, (64, 96)),
    ):
        x = (torch.randn(shape, generator=g) * 3).to(dev, dtype)
        assert fused.applies(x)
        acc = Accumulator(1, [0], dev)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            acc.add_output_logits(x)
            acc.pack()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        got = acc.output_z(acc.flat.cpu().numpy())
        want = float(torch.logsumexp(x.double(), -1).square().mean())
        assert got == pytest.approx(want, rel=1e-5), (dtype, shape)
