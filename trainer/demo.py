"""``hyperwatch demo``: the main job in one command.

Trains a tiny Transformer-Next-MoE under MuonH+HyperP on a real corpus that every machine has
(the Python standard library's own source), streams its indicators to a JSONL folder through
the hooks when they are installed, and prints the loss curve. ``HYPERWATCH_DEMO_FAST=1`` (or
``--fast``) makes a sub-minute version for tests.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from trainer.config import ConfigError, load_config

BARS = " ▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 60) -> str:
    """A one-line chart of ``values`` resampled to ``width`` columns (NaN/Inf shown as '!')."""
    if not values:
        return ""
    step = max(1, len(values) // width)
    pts = [values[i] for i in range(0, len(values), step)]
    finite = [v for v in pts if v == v and abs(v) != float("inf")]
    if not finite:
        return "!" * len(pts)
    lo, hi = min(finite), max(finite)
    span = (hi - lo) or 1.0
    out = []
    for v in pts:
        if v != v or abs(v) == float("inf"):
            out.append("!")
        else:
            out.append(BARS[1 + int((v - lo) / span * (len(BARS) - 2))])
    return "".join(out)


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Train a tiny HyperP MoE model and summarise its loss.")
    p.add_argument("--fast", action="store_true", help="a short version (also HYPERWATCH_DEMO_FAST=1)")
    p.add_argument("--out", default="runs/demo", help="where checkpoints and JSONL indicators go")
    p.add_argument("--depth", type=int, default=2, help="model depth (width = 32 * depth)")
    return p


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    fast = args.fast or os.environ.get("HYPERWATCH_DEMO_FAST", "") not in ("", "0")
    tokens = 81_920 if fast else 819_200
    overrides = [
        "--preset", "tiny",
        "--optim.arm", "hyperp_moe",
        "--optim.lr", "0.02",
        "--model.depth", str(args.depth),
        "--train.tokens", str(tokens),
        "--train.eval_every", "10" if fast else "25",
        "--train.out_dir", f"{args.out}/d{args.depth}",
        "--data.max_bytes", "1000000" if fast else "8000000",
    ]  # fmt: skip
    try:
        import hooks

        if hasattr(hooks, "attach"):
            overrides += ["--log.sink", f"{args.out}/indicators", "--log.every", "5"]
    except ImportError:
        pass
    try:
        cfg = load_config(None, overrides)
        from trainer.train import train

        result = train(cfg)
    except (ConfigError, ValueError) as exc:
        print(f"hyperwatch demo: {exc}", file=sys.stderr)
        return 2
    losses = [v for _, v in result.losses]
    print()
    print(f"run              {result.run}")
    print(
        f"model            depth {cfg.model.depth}, width {cfg.model.width}, "
        f"{result.size.total_params:,} params ({result.size.active_params:,} active)"
    )
    print(f"budget           {result.tokens:,} tokens in {result.steps} steps, {result.size.training_flops:.3g} FLOPs")
    print(f"attention kernel {result.attention_kernel}")
    print(f"throughput       {result.tokens_per_second:,.0f} tokens/s")
    print(f"loss             {losses[0]:.3f} -> {losses[-1]:.3f}   {sparkline(losses)}")
    for step, val in result.val_losses:
        print(f"val_loss @ {step + 1:>4}  {val:.4f}")
    print(json.dumps({"run": result.run, "final_val_loss": result.final_val_loss}))
    return 0
