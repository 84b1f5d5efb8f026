"""``bench/hooks_overhead.py --output-z``: output Z (sum of LSE^2 over the vocabulary) of one step's
logits, side by side in one run, with the extra memory each side takes.

Sides, on (4, 4096, 32000) bf16 logits on CUDA, (4, 256, 32000) on CPU (``--output-shape``):

- ``whole``: the torch formula over every row in one call (an fp32 copy of the logits and a
  log-softmax of it), what the hooks ran on CUDA before the kernel; the baseline;
- ``slices``: :func:`hooks.heads.output_z_sums`, the same formula over bounded row slices (what
  the hooks run off CUDA, or on CUDA without Triton);
- ``compiled``: the whole formula under ``torch.compile`` (what a hooked compiled model runs);
- ``triton``: :func:`hooks.fused.add_lse_square_sum_`, one read of the logits (CUDA with Triton).

Interleaved rounds; medians (process CPU time of one call on CPU; on CUDA wall time of 5 queued
calls after a synchronize, per call), each side's ratio to ``whole``, the bandwidth of one read of
the logits in that time, and on CUDA the peak memory a call allocates beyond the logits. Every
side's sum is checked against float64 first.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch

from bench.hooks_branch import _timed
from hyperwatch.hooks import fused, heads
from hyperwatch.hooks.heads import _lse_rows


def _whole(x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    return _lse_rows(rows).square().sum(dtype=torch.float64).reshape(1)


def _sides(x: torch.Tensor) -> dict[str, Callable[[torch.Tensor], None]]:
    compiled_fn = torch.compile(_whole)
    sides: dict[str, Callable[[torch.Tensor], None]] = {
        "whole": lambda out: out.add_(_whole(x)),
        "slices": lambda out: out.add_(heads.output_z_sums(x)[0]),
        "compiled": lambda out: out.add_(compiled_fn(x)),
    }
    if fused.applies(x):
        sides["triton"] = lambda out: fused.add_lse_square_sum_(out, x)
    return sides


def _peak_extra(fn: Callable[[torch.Tensor], None], out: torch.Tensor) -> float:
    """GiB a call allocates at its peak beyond what was allocated before it (CUDA)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn(out)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def output_z_path(args: argparse.Namespace) -> None:
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    shape = tuple(int(s) for s in (args.output_shape or ("4x4096x32000" if cuda else "4x256x32000")).split("x"))
    path = "fused Triton kernel" if cuda and fused.lse_kernel() is not None else "torch formula in row slices"
    print(f"output Z on {dev}: {path}")
    for dtype in (torch.bfloat16, torch.float32):
        g = torch.Generator().manual_seed(0)
        x = (torch.randn(shape, generator=g) * 3).to(dtype).to(dev)
        want = float(torch.logsumexp(x.double(), -1).square().sum()) if not cuda else float(_whole(x)[0])
        sides = _sides(x)
        extra: dict[str, float] = {}
        for name, fn in sides.items():  # warm-up (compile, kernel JIT), and the same sum on every side
            got = torch.zeros(1, dtype=torch.float64, device=dev)
            fn(got)
            if abs(float(got[0]) / want - 1) > 1e-5:
                raise SystemExit(f"{name} disagrees: {float(got[0])} vs {want}")
            if cuda:
                extra[name] = _peak_extra(fn, got)
        times: dict[str, list[float]] = {name: [] for name in sides}
        out = torch.zeros(1, dtype=torch.float64, device=dev)
        order = list(sides.items())
        for r in range(args.rounds):
            for name, fn in order if r % 2 == 0 else order[::-1]:
                times[name].append(_timed(fn, out, cuda, 5 if cuda else 1))
        med = {name: statistics.median(ts) for name, ts in times.items()}
        gbytes = x.numel() * x.element_size() / 1e9
        cells = "; ".join(
            f"{name} {t * 1e3:.3f} ms = {t / med['whole']:.3f}x ({gbytes / t:.1f} GB/s"
            + (f", +{extra[name]:.2f} GiB peak" if name in extra else "")
            + ")"
            for name, t in med.items()
        )
        clock = "wall" if cuda else f"process CPU, {torch.get_num_threads()} thread(s)"
        print(f"output Z {shape} {str(dtype).removeprefix('torch.')} on {dev}, {args.rounds} rounds ({clock}): {cells}")
