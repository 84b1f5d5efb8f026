"""Step time with and without hooks, side by side in one run.

For each model and each ``every``: one model trains with a real step (forward, backward,
``clip_grad_norm_``, optimizer step, ``zero_grad``; bf16 autocast on CUDA) in timed blocks of
``--block`` steps that alternate, ABBA, between hooked (monitor armed by its ``every`` schedule,
``mon.step`` with the loss and the clipped norm, as ``trainer.train`` does; the block ends with
``mon.flush()``, so the emitter thread's work is inside the figure) and plain (monitor disarmed:
no hook registered, capture flags off, no ``mon.step``; under ``torch.compile`` the hooks stay
registered and the disarmed graph holds no hook op). Same weights, memory and batches on both
sides; torch threads pinned; warm-up first (both compiled graphs included). Each round gives one
ratio hooked/plain of two adjacent blocks; printed are the median over rounds, its
interquartile range and the median ms per step of each side, by process CPU time and by wall
time (on CUDA the wall figure is the one to read), then the issue's table of medians.
``--control`` adds plain against plain (the noise floor) to each row.

Models (``--preset paper`` is the default on CUDA, ``tiny`` on CPU):

- ``dense``/``moe``: the bundled Transformer-Next, ``hyperp``/``hyperp_moe`` arm's optimizers
  (MuonH + AdamH + AdamW); paper: depth 8, seq 4096, micro-batch 8, vocab 32000.
- ``torch``: PyTorch's own ``nn.TransformerEncoderLayer`` stack (pre-norm, causal), the tiny shape.
- ``llama``: a Hugging Face Llama built from a ``LlamaConfig`` (no download), SDPA attention,
  fused AdamW; paper: hidden 1024, 8 layers, 16 heads, 4 KV heads, 4 x 4096 tokens, vocab 32000;
  tiny: the tiny preset's shape.

Targets (issue #11, GPU): <= 1.01x at every=1 and <= 1.002x at every=10, eager and compiled.

    python bench/hooks_overhead.py [--device cpu|cuda] [--preset tiny|paper] [--models dense,moe,llama,gpt]
        [--modes eager,compiled | --compile] [--every 1,10] [--rounds 20] [--block 10] [--control] [--profile]

``--compile`` (issue #34): compiled with hooks against compiled without, per step after warm-up. The
model is compiled in place (``Module.compile()``, inductor), then attached; the "without" side is
the same model with the monitor disarmed, which under compile runs the unlogged graph (hooks
registered, no hook op in it; the gate is the one guard that tells the two graphs apart).
``gpt`` is the plain GPT whose branches only discovery finds (its first logged step runs eagerly,
inside the warm-up).

``--attention`` times the intercepted SDPA call alone (plain, costly recompute path, kernel
LSE path; forward + backward under bf16 autocast) and profiles the two hooked paths.
``--output-z`` times output Z of one step's logits alone (the torch formula whole and in slices,
compiled, and on CUDA the Triton kernel), with the peak memory each takes (bench/hooks_output_z.py).
``--branch`` times the branch statistics of one (4, 4096, 1024) output alone, bf16 and fp32: the
old eager formula, the eager and compiled paths and, on CUDA, the fused Triton kernel (see
bench/hooks_branch.py). ``--profile`` instead runs ``torch.profiler`` over hooked every=1 steps and plain steps and
prints the top ops by self device time (CUDA) or self CPU time, and the CPU time spent inside
each hook function per step.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.hooks_branch import branch_path, path_name
from bench.hooks_models import Sizes, Trainee, bundled, hf_llama, plain_gpt, torch_encoder
from bench.hooks_output_z import output_z_path
from hyperwatch import hooks


def train_step(t: Trainee, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The bundled trainer's step (trainer.train.Trainer.train_step with one micro-batch)."""
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=x.is_cuda):
        loss = t.loss(t.model, x)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(t.model.parameters(), 1.0)
    t.optim.step()
    t.optim.zero_grad(set_to_none=True)
    return loss.detach(), grad_norm


class Bench:
    """One model copy that runs timed blocks either hooked or plain.

    Plain blocks run with the monitor disarmed (no hook is registered then, the capture flags are
    off) and without ``mon.step``: the model's own path. Hooked blocks step the monitor with its
    own step counter, re-armed by the ``every`` schedule at the block's start, so a block of
    ``n`` steps logs ``n / every`` of them. Same weights, same memory, same batches on both sides.
    """

    def __init__(self, trainee: Trainee, mon: Any | None, every: int, batches: list[torch.Tensor]) -> None:
        self.t = trainee
        self.mon = mon
        self.every = every
        self.batches = batches
        self.step = 0  # optimizer steps of the model
        self.logged_step = 0  # the monitor's steps (hooked blocks only)
        self.cuda = next(trainee.model.parameters()).is_cuda

    def run(self, n: int, hooked: bool) -> tuple[float, float]:
        """(wall seconds, process CPU seconds) per step over ``n`` steps."""
        mon = self.mon if hooked else None
        if self.mon is not None:
            # Disarmed for plain blocks; armed by the schedule for hooked ones.
            self.mon._arm(hooked and self.logged_step % self.every == 0)
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            x = self.batches[self.step % len(self.batches)]
            loss, grad_norm = train_step(self.t, x)
            if mon is not None:
                tokens = (self.logged_step + 1) * x.numel()
                mon.step(self.logged_step, loss=loss, lr=0.02, tokens=tokens, grad_norm=grad_norm)
                self.logged_step += 1
            self.step += 1
        if mon is not None:
            mon.flush(60)
        if self.cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n, (time.process_time() - c0) / n


@dataclass
class Figure:
    """Median and quartiles of the per-round ratio hooked/plain; median ms per step of each side."""

    ratio: float
    q1: float
    q3: float
    hooked_ms: float
    plain_ms: float

    def __str__(self) -> str:
        return (
            f"{self.ratio:.3f}x (IQR {self.q1:.3f}-{self.q3:.3f}; "
            f"hooked {self.hooked_ms:.1f} ms vs plain {self.plain_ms:.1f} ms per step)"
        )


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) < 4:
        m = statistics.median(xs)
        return min(xs), m, max(xs)
    q1, q2, q3 = statistics.quantiles(xs, n=4)
    return q1, q2, q3


def _batches(args: argparse.Namespace, batch: int, vocab: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, (batch, args.seq), generator=g).to(args.device) for _ in range(4)]


def _prepare(build: Callable[[], Trainee], every: int, args: argparse.Namespace, mode: str, control: bool) -> Bench:
    """The model (compiled before attach when ``mode == "compiled"``), its monitor and batches."""
    t = build()
    if mode == "compiled":
        t.model.compile()
    mon = None if control else hooks.attach(t.model, run="bench", sink=hooks.MemorySink(), every=every)
    vocab = t.model.get_input_embeddings().num_embeddings if hasattr(t.model, "get_input_embeddings") else None
    batch = args.llama_batch if vocab is not None else args.batch
    return Bench(t, mon, every, _batches(args, batch, vocab or args.sizes.vocab))


def measure(build: Callable[[], Trainee], every: int, args: argparse.Namespace, mode: str = "eager",
            control: bool = False) -> dict[str, Figure]:  # fmt: skip
    """Per clock ("cpu": process CPU time, "wall"): ratios of adjacent blocks and the sides' step times.

    ``control``: no monitor at all (plain against plain: the bench's own noise and bias).
    """
    bench = _prepare(build, every, args, mode, control)
    for _ in range(2 if mode == "compiled" else 1):  # compiled: the second pass runs both cached graphs
        for hooked in (False, True):
            bench.run(max(args.block, 2 * every), hooked)  # warm-up (allocator, kernels, optimizer state)
    samples: dict[str, list[tuple[float, float]]] = {"cpu": [], "wall": []}
    for r in range(args.rounds):
        if r % 2 == 0:
            p, h = bench.run(args.block, False), bench.run(args.block, True)
        else:
            h, p = bench.run(args.block, True), bench.run(args.block, False)
        samples["wall"].append((h[0], p[0]))
        samples["cpu"].append((h[1], p[1]))
    if bench.mon is not None:
        bench.mon.close()
    out = {}
    for clock, pairs in samples.items():
        q1, med, q3 = _quartiles([h / p for h, p in pairs])
        out[clock] = Figure(
            med, q1, q3, statistics.median(h for h, _ in pairs) * 1e3, statistics.median(p for _, p in pairs) * 1e3
        )
    del bench
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


class HookTimers:
    """Thread CPU time spent inside the hooks' own functions, by what they compute.

    The functions are wrapped for the profile only (and restored after it).
    """

    def __init__(self) -> None:
        self.us: dict[str, float] = {}
        self._restore: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, name: str, key: str) -> None:
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time_ns()
            try:
                return original(*args, **kwargs)
            finally:
                self.us[key] = self.us.get(key, 0.0) + (time.thread_time_ns() - t0) / 1e3

        setattr(owner, name, timed)
        self._restore.append((owner, name, original))

    def restore(self) -> None:
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()


def profile(name: str, build: Callable[[], Trainee], args: argparse.Namespace, mode: str) -> None:
    """Where the hooks' time goes at every=1: torch.profiler's top ops of hooked and plain steps,
    and the CPU time spent inside each hook function per step."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from hyperwatch.hooks import accumulate, intercept, monitor

    bench = _prepare(build, 1, args, mode, control=False)
    for _ in range(2 if mode == "compiled" else 1):
        for hooked in (False, True):
            bench.run(args.block, hooked)
    cuda = args.device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    steps = max(1, args.profile_steps)
    for hooked in (True, False):
        with torch_profile(activities=activities) as prof:
            bench.run(steps, hooked)
        side = "hooked" if hooked else "plain"
        events = prof.key_averages()
        total = sum(getattr(e, key) for e in events) / 1e3 / steps
        print(f"profile {name} {mode} every=1, {side}: {total:.1f} ms self {'CUDA' if cuda else 'CPU'} time per step")
        print(events.table(sort_by=key, row_limit=args.profile_top, max_name_column_width=70))
    timers = HookTimers()
    acc = accumulate.Accumulator
    timers.wrap(acc, "add_branch", "branch RMS + outliers (add_branch)")
    timers.wrap(acc, "add_attention_lse", "attention Z from an LSE (add_attention_lse)")
    for fn in ("add_router_logits", "add_expert_counts", "add_aux_loss"):
        timers.wrap(acc, fn, "router Z, expert counts, aux")
    timers.wrap(monitor.Monitor, "step", "mon.step (all-reduce/pack, copy, re-arm)")
    timers.wrap(monitor.Monitor, "_emit", "emitter thread (points, sink)")
    timers.wrap(intercept, "sdpa_with_lse", "SDPA answered by its own kernel, with the LSE")
    timers.wrap(intercept.indicators, "attention_lse", "attention LSE recomputed from q, k (costly fallback)")
    cpu_plain, cpu_hooked = [], []
    try:
        for _ in range(max(1, args.rounds // 4)):
            cpu_plain.append(bench.run(args.block, False)[1])
            cpu_hooked.append(bench.run(args.block, True)[1])
    finally:
        timers.restore()
        if bench.mon is not None:
            bench.mon.close()
    n = len(cpu_hooked) * args.block
    p_ms, h_ms = statistics.median(cpu_plain) * 1e3, statistics.median(cpu_hooked) * 1e3
    print(f"profile {name} {mode} every=1: plain {p_ms:.1f} ms, hooked {h_ms:.1f} ms CPU per step; inside the hooks:")
    for what, us in sorted(timers.us.items(), key=lambda kv: -kv[1]):
        print(f"  {what:<56} {us / n:8.1f} us/step  {100 * us / n / 1e3 / p_ms:6.2f}% of plain")


def attention_path(args: argparse.Namespace) -> None:
    """The intercepted SDPA call alone (forward + backward, bf16 autocast, causal GQA): plain SDPA,
    the costly path (SDPA + the LSE recomputed from q and k in chunks, what every intercepted call
    did under autocast or on CUDA before issue #11), and the kernel path (the kernel SDPA runs,
    asked for its LSE). Interleaved rounds, medians, ratios to plain; then torch.profiler's top ops."""
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from hyperwatch.hooks import indicators
    from hyperwatch.hooks.intercept import sdpa_with_lse

    dev = args.device
    B, Hq, Hk, L, D = (4, 16, 4, 4096, 64) if args.sizes.preset == "paper" else (4, 8, 4, 1024, 64)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, h, L, D, generator=g).to(dev).requires_grad_() for h in (Hq, Hk, Hk))
    kw: dict[str, Any] = {"is_causal": True, "enable_gqa": True}

    def plain() -> None:
        with torch.autocast(dev, dtype=torch.bfloat16):
            out = F.scaled_dot_product_attention(q, k, v, **kw)
        out.float().sum().backward()

    def recompute() -> None:
        with torch.autocast(dev, dtype=torch.bfloat16):
            out = F.scaled_dot_product_attention(q, k, v, **kw)
            with torch.no_grad():
                indicators.attention_lse(q.bfloat16(), k.bfloat16(), **kw)
        out.float().sum().backward()

    def kernel() -> None:
        with torch.autocast(dev, dtype=torch.bfloat16):
            out, _ = sdpa_with_lse({"query": q, "key": k, "value": v, **kw})
        out.float().sum().backward()

    sides = (plain, recompute, kernel)

    def timed(f: Callable[[], None]) -> float:
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter() if dev == "cuda" else time.process_time()
        f()
        if dev == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() if dev == "cuda" else time.process_time()) - t0

    for f in sides:
        f()
    times: dict[str, list[float]] = {f.__name__: [] for f in sides}
    for r in range(args.rounds):
        for f in sides if r % 2 == 0 else sides[::-1]:
            times[f.__name__].append(timed(f))
    med = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
    print(
        f"intercepted SDPA fwd+bwd on {dev}, bf16 autocast, B={B} heads {Hq}/{Hk} L={L} D={D}, {args.rounds} rounds: "
        f"plain {med['plain']:.2f} ms; recompute (costly path) {med['recompute']:.2f} ms "
        f"= {med['recompute'] / med['plain']:.3f}x; kernel LSE {med['kernel']:.2f} ms "
        f"= {med['kernel'] / med['plain']:.3f}x"
    )
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    key = "self_device_time_total" if dev == "cuda" else "self_cpu_time_total"
    for f in (recompute, kernel):
        with torch_profile(activities=activities) as prof:
            f()
        print(f"profile {f.__name__}:")
        print(prof.key_averages().table(sort_by=key, row_limit=args.profile_top, max_name_column_width=60))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--preset", choices=["tiny", "paper"], help="model sizes (default: paper on cuda, tiny on cpu)")
    ap.add_argument("--depth", type=int, help="layers (default: 8 paper, 2 tiny)")
    ap.add_argument("--rounds", type=int, default=20, help="timed block pairs per figure")
    ap.add_argument("--block", type=int, default=10, help="steps per timed block (a multiple of every)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (pinned)")
    ap.add_argument("--batch", type=int, help="sequences per micro-batch, bundled models (default: 8)")
    ap.add_argument("--llama-batch", type=int, help="sequences per micro-batch, llama (default: 4 paper, 8 tiny)")
    ap.add_argument("--seq", type=int, help="tokens per sequence (default: 4096 paper, 256 tiny)")
    ap.add_argument("--models", default="dense,moe,llama", help="comma list of dense, moe, llama, torch, gpt")
    ap.add_argument("--modes", help="comma list of eager, compiled (default: both on cuda, eager on cpu)")
    ap.add_argument(
        "--compile", action="store_true", help="compiled only (--modes compiled): compiled with hooks / without"
    )
    ap.add_argument("--every", default="1,10", help="comma list of logging intervals")
    ap.add_argument("--profile", action="store_true", help="torch.profiler top ops and hook timers (every=1)")
    ap.add_argument("--profile-steps", type=int, default=3, help="steps per profiled side")
    ap.add_argument("--profile-top", type=int, default=15, help="ops listed per profiled side")
    ap.add_argument("--control", action="store_true", help="also plain against plain: the bench's noise floor")
    ap.add_argument("--attention", action="store_true", help="the intercepted SDPA call alone: costly vs kernel path")
    ap.add_argument("--branch", action="store_true", help="the branch statistics alone: old, eager, compiled, triton")
    ap.add_argument("--branch-shape", default="4x4096x1024", help="branch output shape for --branch")
    ap.add_argument("--output-z", action="store_true", help="output Z of one step's logits alone: torch vs triton")
    ap.add_argument("--output-shape", help="logits shape for --output-z (default 4x4096x32000 cuda, 4x256x32000 cpu)")
    args = ap.parse_args()
    paper = (args.preset or ("paper" if args.device == "cuda" else "tiny")) == "paper"
    args.depth = args.depth or (8 if paper else 2)
    args.seq = args.seq or (4096 if paper else 256)
    args.batch = args.batch or 8
    args.llama_batch = args.llama_batch or (4 if paper else args.batch)
    args.sizes = Sizes("paper" if paper else "tiny", args.depth, args.seq, args.device)
    if args.compile and args.modes not in (None, "compiled"):
        ap.error("--compile measures compiled steps only; drop --modes or pass --modes compiled")
    default_modes = "compiled" if args.compile else "eager,compiled" if args.device == "cuda" else "eager"
    modes = (args.modes or default_modes).split(",")
    everies = [int(e) for e in args.every.split(",")]
    for e in everies:
        if e < 1 or args.block % e:
            ap.error(f"--block {args.block} must be a multiple of every={e} (each block logs the same count)")
    for m in modes:
        if m not in ("eager", "compiled"):
            ap.error(f"--modes: unknown {m!r}; use a comma list of eager, compiled")
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    if args.attention:
        attention_path(args)
        return
    if args.branch:
        branch_path(args)
        return
    if args.output_z:
        output_z_path(args)
        return
    print(f"branch statistics in eager mode on {args.device}: {path_name(torch.device(args.device))}")
    z = args.sizes
    builders: dict[str, Callable[[], Trainee]] = {
        "dense": lambda: bundled(z, False),
        "moe": lambda: bundled(z, True),
        "llama": lambda: hf_llama(z),
        "torch": lambda: torch_encoder(z),
        "gpt": lambda: plain_gpt(z),
    }
    labels = {
        "dense": "bundled dense",
        "moe": "bundled moe",
        "llama": "hf llama sdpa",
        "torch": "torch encoder",
        "gpt": "plain gpt (discovered)",
    }
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    for n in names:
        if n not in builders:
            ap.error(f"--models: unknown {n!r}; use a comma list of {', '.join(builders)}")
    clock = "wall" if args.device == "cuda" else "cpu"
    table: list[tuple[str, str, dict[str, Figure]]] = []
    for n in names:
        for mode in modes:
            if args.profile:
                profile(labels[n], builders[n], args, mode)
                continue
            row: dict[str, Figure] = {}
            runs = ([("control", 1, True)] if args.control else []) + [(f"every={e}", e, False) for e in everies]
            for col, every, control in runs:
                r = measure(builders[n], every, args, mode, control)
                row[col] = r[clock]
                what = "control (no hooks)" if control else "hooks overhead"
                print(
                    f"{what} {labels[n]} {mode} {z.preset} depth={z.depth} seq={z.seq} {col} {args.device} "
                    f"threads={args.threads}, {args.rounds} rounds of {args.block} steps: "
                    f"cpu-time {r['cpu']} | wall {r['wall']}",
                    flush=True,
                )
            table.append((labels[n], mode, row))
    if table:
        cols = (["control"] if args.control else []) + [f"every={e}" for e in everies]
        print(
            f"\n| model ({z.preset}, depth {z.depth}, {args.device}, {clock} time) | mode | " + " | ".join(cols) + " |"
        )
        print("|---|---|" + "---|" * len(cols))
        for label, mode, row in table:
            cells = [f"{row[c].ratio:.4f}x ({row[c].hooked_ms:.1f} vs {row[c].plain_ms:.1f} ms)" for c in cols]
            print(f"| {label} | {mode} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
