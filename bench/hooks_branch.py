"""``bench/hooks_overhead.py --branch``: the branch statistics (RMS + 5-sigma count) of one branch
output, side by side in one run.

Sides, on a (4, 4096, 1024) tensor in bf16 and in fp32 (``--branch-shape`` to change it):

- ``old eager``: the formulation the hooks used before issue #11's fused read (per-token
  [sum x^2, count] concatenated, then summed over tokens; about six passes over the tensor plus
  temporaries the size of the tensor), kept here only as the baseline;
- ``eager``: :func:`hooks.indicators.add_branch_sums_`, what the hooks run in eager mode off CUDA
  (cache-sized row slices on CPU);
- ``compiled``: the same under ``torch.compile`` (inductor's fused loops), where a hooked
  compiled model runs it;
- ``triton``: :func:`hooks.fused.add_branch_sums_`, the fused kernel (CUDA with Triton only).

Interleaved rounds; medians (process CPU time of one call on CPU with pinned threads; on CUDA
wall time of 20 queued calls after a device synchronize, per call), each side's ratio to the
old path, and the bandwidth of one read of the tensor in that time. Every side's sums are
checked against the old path's first.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from hyperwatch.hooks import fused, indicators


def old_branch_sums(x: torch.Tensor) -> torch.Tensor:
    """The pre-fusion formula (hooks/indicators.py before issue #11), for the comparison only."""
    x = x.detach()
    hidden = x.shape[-1]
    mean = x.mean(dim=-1, keepdim=True, dtype=torch.float32)
    sq_dev = (x - mean).square_()
    dev_sum = sq_dev.nansum(dim=-1, keepdim=True)
    outliers = sq_dev.gt_(dev_sum * (indicators.OUTLIER_SIGMAS**2 / hidden)).sum(dim=-1, keepdim=True)
    per_token = torch.cat([torch.addcmul(dev_sum, mean, mean, value=hidden), outliers], dim=-1).view(-1, 2)
    return per_token.sum(dim=0, dtype=torch.float64)


def path_name(dev: torch.device) -> str:
    """Which path the hooks take for branch outputs on ``dev`` in eager mode."""
    if dev.type != "cuda":
        return "torch formula in cache-sized row slices" if dev.type == "cpu" else "torch formula"
    return "fused Triton kernel" if fused.kernel() is not None else "torch formula (Triton is not importable)"


def _sides(x: torch.Tensor) -> dict[str, Callable[[torch.Tensor], None]]:
    def old(out: torch.Tensor) -> None:
        out.add_(old_branch_sums(x))

    def eager(out: torch.Tensor) -> None:
        indicators.add_branch_sums_(out, x)

    compiled_fn = torch.compile(indicators.add_branch_sums_)

    def compiled(out: torch.Tensor) -> None:
        compiled_fn(out, x)

    sides = {"old eager": old, "eager": eager, "compiled": compiled}
    if fused.applies(x):

        def triton(out: torch.Tensor) -> None:
            fused.add_branch_sums_(out, x)

        sides["triton"] = triton
    return sides


def _timed(fn: Callable[[torch.Tensor], None], out: torch.Tensor, cuda: bool, reps: int) -> float:
    """Seconds per call over ``reps`` back-to-back calls (on CUDA: queued, then one synchronize)."""
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter() if cuda else time.process_time()
    for _ in range(reps):
        fn(out)
    if cuda:
        torch.cuda.synchronize()
    return ((time.perf_counter() if cuda else time.process_time()) - t0) / reps


def branch_path(args: argparse.Namespace) -> None:
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    shape = tuple(int(s) for s in args.branch_shape.split("x"))
    print(f"branch statistics on {dev}: {path_name(dev)}")
    for dtype in (torch.bfloat16, torch.float32):
        g = torch.Generator().manual_seed(0)
        x = (torch.randn(shape, generator=g) + 0.3 * torch.randn((*shape[:-1], 1), generator=g)).to(dtype).to(dev)
        x.view(-1, shape[-1])[::97, 5] = 9.0  # outliers in a few tokens
        sides = _sides(x)
        want = torch.zeros(2, dtype=torch.float64, device=dev)
        sides["old eager"](want)
        for name, fn in sides.items():  # warm-up (compile, kernel JIT), and the same sums on every side
            got = torch.zeros(2, dtype=torch.float64, device=dev)
            fn(got)
            rel = abs(float(got[0]) / float(want[0]) - 1)
            if rel > 1e-5 or abs(float(got[1]) - float(want[1])) > 1e-6 * x.numel():
                raise SystemExit(f"{name} disagrees with the old path: {got.tolist()} vs {want.tolist()}")
        times: dict[str, list[float]] = {name: [] for name in sides}
        out = torch.zeros(2, dtype=torch.float64, device=dev)
        order = list(sides.items())
        reps = 20 if cuda else 1  # a GPU call is tens of microseconds: time a queue of them
        for r in range(args.rounds):
            for name, fn in order if r % 2 == 0 else order[::-1]:
                times[name].append(_timed(fn, out, cuda, reps))
        med = {name: statistics.median(ts) for name, ts in times.items()}
        gbytes = x.numel() * x.element_size() / 1e9
        cells = "; ".join(
            f"{name} {t * 1e3:.3f} ms = {t / med['old eager']:.3f}x ({gbytes / t:.1f} GB/s)" for name, t in med.items()
        )
        clock = "wall" if cuda else f"process CPU, {torch.get_num_threads()} thread(s)"
        print(
            f"branch {tuple(shape)} {str(dtype).removeprefix('torch.')} on {dev}, "
            f"{args.rounds} rounds ({clock}): {cells}"
        )
