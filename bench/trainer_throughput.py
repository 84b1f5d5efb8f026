"""Training throughput of the tiny presets under MuonH (+AdamH) vs plain AdamW, side by side.

Both optimizers train their own copy of the same model on the same batches; their timed blocks
are interleaved round by round so machine noise hits both alike, and the median per side is
reported. One line per figure: what, the ratio, the two sides.

    python bench/trainer_throughput.py [--rounds 5] [--steps 4] [--depth 2] [--device cpu]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from hyperwatch.trainer.config import build_config
from hyperwatch.trainer.data import DataConfig, TokenLoader, load_corpus
from hyperwatch.trainer.model import Transformer
from hyperwatch.trainer.optim import build_optimizers


def make_step(model: Transformer, opt_step: object, zero_grad: object, loader: TokenLoader, device: torch.device):
    def step() -> None:
        x, y = loader.next_batch()
        out = model(x.to(device), y.to(device))
        assert out.loss is not None
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt_step()  # type: ignore[operator]
        zero_grad()  # type: ignore[operator]

    return step


def bench_one(name: str, moe: bool, args: argparse.Namespace, tokens: torch.Tensor) -> None:
    arm = "hyperp_moe" if moe else "hyperp"  # the arm decides whether the MLP is an MoE
    model = {"depth": args.depth, "vocab_size": 257}
    cfg = build_config({"preset": "tiny", "optim": {"arm": arm}, "model": model}).model
    assert cfg.moe == moe
    device = torch.device(args.device)
    torch.manual_seed(0)
    base = Transformer(cfg).to(device)
    muonh_model, adamw_model = base, copy.deepcopy(base)
    muonh = build_optimizers(
        muonh_model, "hyperp", lr=0.02, depth=cfg.depth, width=cfg.width, tokens=2e6, base_depth=cfg.base_depth
    )
    adamw = torch.optim.AdamW(adamw_model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0)
    micro, seq = args.micro_batch, cfg.seq_len
    loaders = [TokenLoader(tokens.numpy(), seq, micro, seed=s) for s in (1, 1)]
    sides = {
        "MuonH": make_step(muonh_model, muonh.step, lambda: muonh.zero_grad(set_to_none=True), loaders[0], device),
        "AdamW": make_step(adamw_model, adamw.step, lambda: adamw.zero_grad(set_to_none=True), loaders[1], device),
    }
    for step in sides.values():  # warm-up (allocator, first-step state)
        step()
        step()
    rates: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(args.rounds):
        for label, step in sides.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            rates[label].append(args.steps * micro * seq / (time.perf_counter() - t0))
    m, a = statistics.median(rates["MuonH"]), statistics.median(rates["AdamW"])
    print(
        f"{name} d={cfg.depth} w={cfg.width}: tokens/s MuonH/AdamW ratio {m / a:.3f} "
        f"(MuonH {m:,.0f} tok/s, AdamW {a:,.0f} tok/s; median of {args.rounds} interleaved rounds)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=4, help="optimizer steps per timed block")
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    if args.rounds < 1 or args.steps < 1 or args.depth < 1 or args.micro_batch < 1:
        p.error("--rounds, --steps, --depth and --micro-batch must be >= 1")
    corpus = load_corpus(DataConfig(max_bytes=1_000_000))
    tokens = torch.from_numpy(corpus.train[:600_000].astype("int64"))
    print(f"# torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}")
    bench_one("tiny-dense", False, args, tokens)
    bench_one("tiny-moe", True, args, tokens)


if __name__ == "__main__":
    main()
