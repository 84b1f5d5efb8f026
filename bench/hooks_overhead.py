"""Step time with and without hooks, side by side in one run.

For each model (the bundled tiny dense and MoE presets, a tiny Hugging Face Llama) and each
``every`` (1 and 10): two identical copies train in alternation, step for step (forward,
backward, SGD update, and ``mon.step`` on the hooked copy), and the ratio of median step times
is printed. Targets on CPU: <= 1.03x at every=1, <= 1.01x at every=10.

    python bench/hooks_overhead.py [--device cuda] [--depth 8] [--steps 40]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import hooks


def bundled(depth: int, moe: bool, device: str) -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    from trainer.model import ModelConfig, Transformer

    cfg = ModelConfig(
        depth=depth, alpha=32, head_dim=16, vocab_size=256, seq_len=256, base_depth=2, moe=moe,
        moe_sparsity=4, moe_granularity=4,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Transformer(cfg).to(device)
    x = torch.randint(0, 256, (8, 256), device=device)

    def step(m: nn.Module) -> torch.Tensor:
        loss = m(x, x).loss
        loss.backward()
        return loss

    return model, step


def hf_llama(depth: int, device: str) -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(  # type: ignore[call-arg]
        vocab_size=256, hidden_size=32 * depth, intermediate_size=128 * depth, num_hidden_layers=depth,
        num_attention_heads=2 * depth, num_key_value_heads=2, max_position_embeddings=256,
        attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    model: nn.Module = LlamaForCausalLM(cfg).to(device)  # type: ignore[arg-type]
    x = torch.randint(0, 256, (8, 256), device=device)

    def step(m: nn.Module) -> torch.Tensor:
        loss = m(input_ids=x, labels=x).loss
        loss.backward()
        return loss

    return model, step


def measure(
    build: Callable[[], tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]], every: int, steps: int
) -> tuple[float, float]:
    plain, fn = build()
    hooked, _ = build()
    mon = hooks.attach(hooked, run="bench", sink=hooks.MemorySink(), every=every)
    cuda = next(plain.parameters()).is_cuda
    times: dict[str, list[float]] = {"plain": [], "hooked": []}

    def one(model: nn.Module, key: str, i: int) -> None:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = fn(model)
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p.add_(p.grad, alpha=-1e-4)
                    p.grad = None
        if key == "hooked":
            mon.step(i, loss=loss, lr=1e-4, tokens=i)
        if cuda:
            torch.cuda.synchronize()
        if i >= 3:  # warm-up
            times[key].append(time.perf_counter() - t0)

    for i in range(steps + 3):
        order = [(plain, "plain"), (hooked, "hooked")] if i % 2 == 0 else [(hooked, "hooked"), (plain, "plain")]
        for model, key in order:
            one(model, key, i)
    mon.close()
    return statistics.median(times["plain"]), statistics.median(times["hooked"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    models: dict[str, Callable[[], tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]]] = {
        "bundled dense": lambda: bundled(args.depth, False, args.device),
        "bundled moe": lambda: bundled(args.depth, True, args.device),
        "hf llama sdpa": lambda: hf_llama(args.depth, args.device),
    }
    for name, build in models.items():
        for every in (1, 10):
            plain, hooked = measure(build, every, args.steps)
            print(
                f"hooks overhead {name} depth={args.depth} every={every} {args.device}: "
                f"{hooked / plain:.3f}x (hooked {hooked * 1e3:.1f} ms vs plain {plain * 1e3:.1f} ms per step)"
            )


if __name__ == "__main__":
    main()
