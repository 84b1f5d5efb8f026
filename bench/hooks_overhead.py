"""Step time with and without hooks, side by side in one run.

For each model (the bundled tiny dense and MoE presets, a tiny Hugging Face Llama with SDPA
attention, all at the tiny preset's shapes) and each ``every``: one model trains with the
bundled trainer's real step (forward, backward, ``clip_grad_norm_``, the ``hyperp`` arm's
optimizers from ``trainer.optim.build_optimizers``: MuonH + AdamH + AdamW, ``zero_grad``) in
timed blocks of ``--block`` steps that alternate, ABBA, between hooked (monitor armed by its
``every`` schedule, ``mon.step`` with the loss and the clipped norm, as ``trainer.train`` does;
the block ends with ``mon.flush()``, so the emitter thread's work is inside the figure) and
plain (monitor disarmed: no hook registered, capture flags off, no ``mon.step``). Same
weights, memory and batches on both sides; torch threads pinned; warm-up first. Each round
gives one ratio hooked/plain of two adjacent blocks; printed are the median over rounds, its
interquartile range and the median ms per step of each side, by process CPU time (robust on a
shared machine) and by wall time. ``--control`` runs plain against plain (the noise floor).

Targets on CPU (issue #3): <= 1.03x at every=1 and <= 1.01x at every=10.

    python bench/hooks_overhead.py [--models dense,moe,llama,torch] [--every 1,10] [--depth 2]
        [--rounds 20] [--block 10] [--threads 1] [--batch 8] [--seq 256] [--control] [--profile]

``--profile`` instead reports where the hooked step's extra time goes at every=1: the CPU time
spent inside each hook function per step, against the plain step's CPU time.
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
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from hyperwatch import hooks
from hyperwatch.trainer.config import build_config
from hyperwatch.trainer.optim import OptimizerSet, build_optimizers

VOCAB = 257  # the tiny preset's byte tokenizer


@dataclass
class Trainee:
    """One copy of a model with its optimizers and a forward that returns the loss."""

    model: nn.Module
    optim: OptimizerSet
    loss: Callable[[nn.Module, torch.Tensor], torch.Tensor]


def _optimizers(model: nn.Module, depth: int, width: int) -> OptimizerSet:
    return build_optimizers(model, "hyperp", lr=0.02, depth=depth, width=width, tokens=400_000.0, base_depth=2)


def bundled(depth: int, moe: bool, seq: int, device: str) -> Trainee:
    from hyperwatch.trainer.model import Transformer

    sections: dict[str, Any] = {
        "preset": "tiny",
        "model": {"depth": depth, "vocab_size": VOCAB, "seq_len": seq},
        "optim": {"arm": "hyperp_moe" if moe else "hyperp"},
    }
    cfg = build_config(sections).model
    torch.manual_seed(0)
    model = Transformer(cfg).to(device)

    def loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(x, x).loss  # type: ignore[no-any-return]

    return Trainee(model, _optimizers(model, depth, cfg.width), loss)


def hf_llama(depth: int, seq: int, device: str) -> Trainee:
    """The tiny preset's shape (width 32d, 2d heads of 16, 4 KV heads, MLP 4w) as a Hugging Face Llama."""
    from transformers import LlamaConfig, LlamaForCausalLM

    width = 32 * depth
    cfg = LlamaConfig(  # type: ignore[call-arg]
        vocab_size=VOCAB, hidden_size=width, intermediate_size=4 * width, num_hidden_layers=depth,
        num_attention_heads=2 * depth, num_key_value_heads=min(4, 2 * depth), head_dim=16,
        max_position_embeddings=seq, attn_implementation="sdpa", tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model: nn.Module = LlamaForCausalLM(cfg).to(device)  # type: ignore[arg-type]
    roles: dict[str, str] = {}
    for name, p in model.named_parameters():
        if name.endswith("embed_tokens.weight"):
            roles[name] = "embedding"
        elif name.startswith("lm_head."):
            roles[name] = "head"
        else:
            roles[name] = "hidden" if p.ndim >= 2 else "vector"
    model.parameter_roles = lambda: roles  # type: ignore[assignment]  # what build_optimizers reads

    def loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(input_ids=x, labels=x).loss  # type: ignore[no-any-return]

    return Trainee(model, _optimizers(model, depth, width), loss)


def torch_encoder(depth: int, seq: int, device: str) -> Trainee:
    """The tiny preset's shape (width 32d, 2d heads, MLP 4w) from PyTorch's own nn.TransformerEncoderLayer
    (pre-norm, batch_first, causal mask): attention Z recomputed from nn.MultiheadAttention's projections."""
    width = 32 * depth

    class CausalLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, width)
            layer = nn.TransformerEncoderLayer(width, 2 * depth, 4 * width, 0.0, batch_first=True, norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
            self.head = nn.Linear(width, VOCAB, bias=False)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.encoder(self.embed(x), mask=self.mask[: x.shape[1], : x.shape[1]], is_causal=True)
            return nn.functional.cross_entropy(self.head(h)[:, :-1].flatten(0, 1), x[:, 1:].flatten())

        def parameter_roles(self) -> dict[str, str]:
            roles = {n: "hidden" if p.ndim >= 2 else "vector" for n, p in self.named_parameters()}
            return {**roles, "embed.weight": "embedding", "head.weight": "head"}

    torch.manual_seed(0)
    model = CausalLM().to(device)

    def loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(x)  # type: ignore[no-any-return]

    return Trainee(model, _optimizers(model, depth, width), loss)


def train_step(t: Trainee, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The bundled trainer's step (trainer.train.Trainer.train_step with one micro-batch)."""
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


def _batches(args: argparse.Namespace) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (args.batch, args.seq), generator=g).to(args.device) for _ in range(4)]


def measure(build: Callable[[], Trainee], every: int, args: argparse.Namespace) -> dict[str, Figure]:
    """Per clock ("cpu": process CPU time, "wall"): ratios of adjacent blocks and the sides' step times.

    ``args.control``: no monitor at all (plain against plain: the bench's own noise and bias).
    """
    t = build()
    mon = None if args.control else hooks.attach(t.model, run="bench", sink=hooks.MemorySink(), every=every)
    bench = Bench(t, mon, every, _batches(args))
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
    if mon is not None:
        mon.close()
    out = {}
    for clock, pairs in samples.items():
        q1, med, q3 = _quartiles([h / p for h, p in pairs])
        out[clock] = Figure(
            med, q1, q3, statistics.median(h for h, _ in pairs) * 1e3, statistics.median(p for _, p in pairs) * 1e3
        )
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


def profile(name: str, build: Callable[[], Trainee], args: argparse.Namespace) -> None:
    """Where the hooks' time goes at every=1: CPU time inside each hook function per step."""
    from hyperwatch.hooks import accumulate, intercept, monitor

    t = build()
    mon = hooks.attach(t.model, run="bench", sink=hooks.MemorySink(), every=1)
    bench = Bench(t, mon, 1, _batches(args))
    for hooked in (False, True):
        bench.run(args.block, hooked)
    timers = HookTimers()
    acc = accumulate.Accumulator
    timers.wrap(acc, "add_branch", "branch RMS + outliers (add_branch)")
    timers.wrap(acc, "add_attention_lse", "attention Z from an LSE (add_attention_lse)")
    for fn in ("add_router_logits", "add_expert_counts", "add_aux_loss"):
        timers.wrap(acc, fn, "router Z, expert counts, aux")
    timers.wrap(monitor.Monitor, "step", "mon.step (all-reduce/pack, copy, re-arm)")
    timers.wrap(monitor.Monitor, "_emit", "emitter thread (points, sink)")
    timers.wrap(intercept, "cpu_flash_with_lse", "SDPA answered by the flash kernel (replaces the call)")
    timers.wrap(intercept.indicators, "attention_lse", "attention LSE recomputed from q, k (fallback)")
    cpu_plain, cpu_hooked = [], []
    try:
        for _ in range(max(1, args.rounds // 4)):
            cpu_plain.append(bench.run(args.block, False)[1])
            cpu_hooked.append(bench.run(args.block, True)[1])
    finally:
        timers.restore()
        mon.close()
    steps = len(cpu_hooked) * args.block
    p_ms, h_ms = statistics.median(cpu_plain) * 1e3, statistics.median(cpu_hooked) * 1e3
    print(f"profile {name} every=1: plain {p_ms:.1f} ms, hooked {h_ms:.1f} ms CPU per step; inside the hooks:")
    for key, us in sorted(timers.us.items(), key=lambda kv: -kv[1]):
        print(f"  {key:<56} {us / steps:8.1f} us/step  {100 * us / steps / 1e3 / p_ms:6.2f}% of plain")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=20, help="timed block pairs per figure")
    ap.add_argument("--block", type=int, default=10, help="steps per timed block (a multiple of every)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (pinned)")
    ap.add_argument("--batch", type=int, default=8, help="sequences per micro-batch")
    ap.add_argument("--seq", type=int, default=256, help="tokens per sequence")
    ap.add_argument("--models", default="dense,moe,llama", help="comma list of dense, moe, llama, torch")
    ap.add_argument("--every", default="1,10", help="comma list of logging intervals")
    ap.add_argument("--profile", action="store_true", help="time the hooks' functions instead (every=1)")
    ap.add_argument("--control", action="store_true", help="plain against plain: the bench's noise floor")
    args = ap.parse_args()
    everies = [int(e) for e in args.every.split(",")]
    for e in everies:
        if e < 1 or args.block % e:
            ap.error(f"--block {args.block} must be a multiple of every={e} (each block logs the same count)")
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    builders: dict[str, Callable[[], Trainee]] = {
        "dense": lambda: bundled(args.depth, False, args.seq, args.device),
        "moe": lambda: bundled(args.depth, True, args.seq, args.device),
        "llama": lambda: hf_llama(args.depth, args.seq, args.device),
        "torch": lambda: torch_encoder(args.depth, args.seq, args.device),
    }
    labels = {"dense": "bundled dense", "moe": "bundled moe", "llama": "hf llama sdpa", "torch": "torch encoder"}
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    for n in names:
        if n not in builders:
            ap.error(f"--models: unknown {n!r}; use a comma list of {', '.join(builders)}")
    for n in names:
        if args.profile:
            profile(labels[n], builders[n], args)
            continue
        for every in everies:
            r = measure(builders[n], every, args)
            what = "control (no hooks)" if args.control else "hooks overhead"
            print(
                f"{what} {labels[n]} depth={args.depth} {args.batch}x{args.seq} every={every} "
                f"{args.device} threads={args.threads}, {args.rounds} rounds of {args.block} steps: "
                f"cpu-time {r['cpu']} | wall {r['wall']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
