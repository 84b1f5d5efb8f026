"""Step time with and without hooks, side by side in one run.

For each model (the bundled tiny dense and MoE presets, a tiny Hugging Face Llama with SDPA
attention) and each ``every``: two identical copies of the model (same seed, same weights, same
batches) train with the bundled trainer's real step: forward, backward, ``clip_grad_norm_``,
the arm's optimizers (``trainer.optim.build_optimizers``, arm ``hyperp``: MuonH + AdamH +
AdamW) and ``zero_grad``; the hooked copy also calls ``mon.step`` with the loss and the
clipped norm, as ``trainer.train`` does. Blocks of ``--block`` steps alternate between the two
copies (ABBA order), after a warm-up; each round gives one ratio hooked/plain of two adjacent
blocks, so machine noise that lasts longer than a block hits both sides alike. Printed: the
median ratio over rounds, its interquartile range, and the median ms per step of each side.
A hooked block ends with ``mon.flush()`` (the emitter thread's work is inside the figure).

Targets on CPU (issue #3): <= 1.03x at every=1 and <= 1.01x at every=10.

    python bench/hooks_overhead.py [--models dense,moe,llama] [--every 1,10] [--depth 2]
        [--rounds 20] [--block 10] [--threads 1] [--batch 8] [--seq 256] [--profile]

``--profile`` instead profiles ``--block`` hooked steps at every=1 with ``torch.profiler`` and
prints the ops that the hooks add (self CPU time, hooked minus plain), per model.
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

import hooks
from trainer.config import build_config
from trainer.optim import OptimizerSet, build_optimizers

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
    from trainer.model import Transformer

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


def train_step(t: Trainee, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The bundled trainer's step (trainer.train.Trainer.train_step with one micro-batch)."""
    loss = t.loss(t.model, x)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(t.model.parameters(), 1.0)
    t.optim.step()
    t.optim.zero_grad(set_to_none=True)
    return loss.detach(), grad_norm


class Side:
    """A trainee plus its step counter (and monitor on the hooked side)."""

    def __init__(self, trainee: Trainee, mon: Any | None, batches: list[torch.Tensor]) -> None:
        self.t = trainee
        self.mon = mon
        self.batches = batches
        self.step = 0
        self.cuda = next(trainee.model.parameters()).is_cuda

    def run(self, n: int) -> tuple[float, float]:
        """(wall seconds, process CPU seconds) per step over ``n`` steps."""
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            x = self.batches[self.step % len(self.batches)]
            loss, grad_norm = train_step(self.t, x)
            if self.mon is not None:
                self.mon.step(self.step, loss=loss, lr=0.02, tokens=(self.step + 1) * x.numel(), grad_norm=grad_norm)
            self.step += 1
        if self.mon is not None:
            self.mon.flush(60)
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
    """Per clock ("cpu": process CPU time, "wall"): ratios of adjacent blocks and the sides' step times."""
    batches = _batches(args)
    plain = Side(build(), None, batches)
    hooked_t = build()
    mon = hooks.attach(hooked_t.model, run="bench", sink=hooks.MemorySink(), every=every)
    hooked = Side(hooked_t, mon, batches)
    for side in (plain, hooked):
        side.run(max(args.block, 2 * every))  # warm-up (allocator, kernels, optimizer state)
    samples: dict[str, list[tuple[float, float]]] = {"cpu": [], "wall": []}
    for r in range(args.rounds):
        if r % 2 == 0:
            p, h = plain.run(args.block), hooked.run(args.block)
        else:
            h, p = hooked.run(args.block), plain.run(args.block)
        samples["wall"].append((h[0], p[0]))
        samples["cpu"].append((h[1], p[1]))
    mon.close()
    out = {}
    for clock, pairs in samples.items():
        q1, med, q3 = _quartiles([h / p for h, p in pairs])
        out[clock] = Figure(
            med, q1, q3, statistics.median(h for h, _ in pairs) * 1e3, statistics.median(p for _, p in pairs) * 1e3
        )
    return out


def profile(name: str, build: Callable[[], Trainee], args: argparse.Namespace) -> None:
    """Self CPU time per op, hooked minus plain, over ``--block`` steps at every=1."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    batches = _batches(args)
    totals: dict[str, dict[str, tuple[float, int]]] = {}
    for key in ("plain", "hooked"):
        t = build()
        mon = hooks.attach(t.model, run="bench", sink=hooks.MemorySink(), every=1) if key == "hooked" else None
        side = Side(t, mon, batches)
        side.run(args.block)
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            side.run(args.block)
        if mon is not None:
            mon.close()
        totals[key] = {e.key: (e.self_cpu_time_total, e.count) for e in prof.key_averages()}
    ops = set(totals["plain"]) | set(totals["hooked"])
    diff = []
    for op in ops:
        h_us, h_n = totals["hooked"].get(op, (0.0, 0))
        p_us, p_n = totals["plain"].get(op, (0.0, 0))
        diff.append((h_us - p_us, h_n - p_n, op))
    diff.sort(reverse=True)
    plain_total = sum(us for us, _ in totals["plain"].values()) / args.block
    extra = sum(d for d, n, _ in diff if n > 0) / args.block
    print(f"profile {name}: plain {plain_total / 1e3:.2f} ms/step of op self time; ops the hooks add:")
    for d_us, d_n, op in diff[:14]:
        if d_n > 0:
            print(f"  {op:<48} +{d_n / args.block:6.1f} calls/step  +{d_us / args.block:8.1f} us/step")
    print(f"  sum over added calls: {extra:.1f} us/step ({100 * extra / plain_total:.2f}% of plain op time)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=20, help="timed block pairs per figure")
    ap.add_argument("--block", type=int, default=10, help="steps per timed block (a multiple of every)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (pinned)")
    ap.add_argument("--batch", type=int, default=8, help="sequences per micro-batch")
    ap.add_argument("--seq", type=int, default=256, help="tokens per sequence")
    ap.add_argument("--models", default="dense,moe,llama", help="comma list of dense, moe, llama")
    ap.add_argument("--every", default="1,10", help="comma list of logging intervals")
    ap.add_argument("--profile", action="store_true", help="profile the hooks' ops instead of timing")
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
    }
    labels = {"dense": "bundled dense", "moe": "bundled moe", "llama": "hf llama sdpa"}
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
            print(
                f"hooks overhead {labels[n]} depth={args.depth} {args.batch}x{args.seq} every={every} "
                f"{args.device} threads={args.threads}, {args.rounds} rounds of {args.block} steps: "
                f"cpu-time {r['cpu']} | wall {r['wall']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
