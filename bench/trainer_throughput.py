"""Training throughput of the bundled trainer: dense and MoE, eager and compiled, MuonH vs AdamW.

For each model (dense, MoE) and mode (eager; compiled where CUDA runs it) the sides below train
on the same batches; their timed blocks are interleaved round by round so machine noise hits all
alike, and the median per side is reported with tokens/s, MFU and the ratios:

* ``MuonH``       -- the hyperp arm as the trainer runs it (batched MuonH + AdamH + AdamW);
* ``AdamW``       -- the same model under plain AdamW (fused on CUDA), its own copy;
* eager only, sharing the MuonH model (so no extra memory): ``MuonH per-matrix`` (the optimizers'
  ``foreach=False`` reference path) and, for the MoE, the other expert kernel (``loop`` where
  ``auto`` takes ``grouped``, i.e. on CUDA; ``grouped`` on CPU, where ``auto`` takes the loop).

MFU = 3 x forward FLOPs per token (trainer.sizes) x tokens/s / peak; ``--peak-tflops`` defaults
to 989 (H100 SXM bf16 dense). Compile warm-up (first steps, graph capture + codegen) is printed.

    python bench/trainer_throughput.py                                   # CPU, tiny preset, d=2
    python bench/trainer_throughput.py --device cuda --preset paper --depth 8   # the GPU figures
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import torch

from hyperwatch.trainer.config import ModelConfig, build_config
from hyperwatch.trainer.data import DataConfig, TokenLoader, load_corpus
from hyperwatch.trainer.model import Transformer
from hyperwatch.trainer.moe import MoE
from hyperwatch.trainer.optim import build_optimizers
from hyperwatch.trainer.sizes import forward_flops_per_token

Step = Callable[[], None]


def make_step(
    model: torch.nn.Module, opt: object, loader: TokenLoader, device: torch.device, before: Callable[[], None]
) -> Step:
    bf16 = device.type == "cuda"

    def step() -> None:
        before()
        x, y = loader.next_batch()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            out = model(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
        assert out.loss is not None
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()  # type: ignore[attr-defined]
        opt.zero_grad(set_to_none=True)  # type: ignore[attr-defined]

    return step


def _set_foreach(opt: object, on: bool) -> Callable[[], None]:
    def apply() -> None:
        for group in opt.param_groups:  # type: ignore[attr-defined]
            if "foreach" in group and group.get("role") in ("hidden", "head"):
                group["foreach"] = on

    return apply


def _set_kernel(model: Transformer, kernel: str) -> Callable[[], None]:
    def apply() -> None:
        for m in model.modules():
            if isinstance(m, MoE):
                m.experts.kernel = kernel

    return apply


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def build_sides(
    cfg: ModelConfig, args: argparse.Namespace, tokens: torch.Tensor, compiled: bool
) -> tuple[dict[str, Step], float]:
    """The sides of one (model, mode) and the compile warm-up in seconds (0 when eager)."""
    device = torch.device(args.device)
    torch.manual_seed(0)
    muonh_model = Transformer(cfg).to(device)
    adamw_model = copy.deepcopy(muonh_model)
    muonh = build_optimizers(
        muonh_model, "hyperp", lr=0.02, depth=cfg.depth, width=cfg.width, tokens=2e9, base_depth=cfg.base_depth
    )
    fused = {"fused": True} if device.type == "cuda" else {}
    adamw = torch.optim.AdamW(adamw_model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0, **fused)
    run_m: torch.nn.Module = torch.compile(muonh_model) if compiled else muonh_model  # type: ignore[assignment]
    run_a: torch.nn.Module = torch.compile(adamw_model) if compiled else adamw_model  # type: ignore[assignment]
    loaders = [TokenLoader(tokens.numpy(), cfg.seq_len, args.micro_batch, seed=1) for _ in range(2)]
    noop: Callable[[], None] = lambda: None  # noqa: E731
    batched_on = _set_foreach(muonh, True)
    kernel, other, other_ok = "auto", "loop", False
    sides: dict[str, Step] = {}
    if cfg.moe and not compiled:
        probe = next(m for m in muonh_model.modules() if isinstance(m, MoE))
        x = torch.zeros(1, cfg.width, device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            auto_grouped = probe.experts.use_grouped(x)
        other = "loop" if auto_grouped else "grouped"
        probe.experts.kernel = other
        try:
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                probe.experts.use_grouped(x)
            other_ok = True
        except RuntimeError:
            other_ok = False
        probe.experts.kernel = "auto"
        kernel = "grouped" if auto_grouped else "loop"
    auto_kernel = _set_kernel(muonh_model, "auto")

    def as_trained() -> None:
        batched_on()
        auto_kernel()

    sides["MuonH"] = make_step(run_m, muonh, loaders[0], device, as_trained)
    sides["AdamW"] = make_step(run_a, adamw, loaders[1], device, noop)
    if not compiled:
        per_matrix = _set_foreach(muonh, False)
        sides["MuonH per-matrix"] = make_step(run_m, muonh, loaders[0], device, per_matrix)
        if cfg.moe and other_ok:
            switch = _set_kernel(muonh_model, other)

            def other_kernel() -> None:
                batched_on()
                switch()

            sides[f"MuonH, {other} experts (auto: {kernel})"] = make_step(
                run_m, muonh, loaders[0], device, other_kernel
            )
    _sync(device)
    t0 = time.perf_counter()
    for step in sides.values():  # warm-up: allocator, first-step state, and the compile
        for _ in range(args.warmup):
            step()
    _sync(device)
    return sides, (time.perf_counter() - t0 if compiled else 0.0)


def bench(name: str, cfg: ModelConfig, args: argparse.Namespace, tokens: torch.Tensor, compiled: bool) -> None:
    device = torch.device(args.device)
    sides, warmup = build_sides(cfg, args, tokens, compiled)
    rates: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(args.rounds):
        for label, step in sides.items():
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            _sync(device)
            rates[label].append(args.steps * args.micro_batch * cfg.seq_len / (time.perf_counter() - t0))
    flops = 3 * forward_flops_per_token(cfg)
    mode = "compiled" if compiled else "eager"
    head = f"{name} {mode} d={cfg.depth} w={cfg.width} seq={cfg.seq_len} micro={args.micro_batch}"
    if compiled:
        head += f" (compile warm-up {warmup:.1f} s for {args.warmup} steps x {len(sides)} sides)"
    print(head)
    med = {k: statistics.median(v) for k, v in rates.items()}
    for label, rate in med.items():
        mfu = 100.0 * rate * flops / (args.peak_tflops * 1e12)
        print(f"  {label:<34} {rate:>12,.0f} tok/s  MFU {mfu:6.2f}%  x{rate / med['MuonH']:.3f} of MuonH")
    print(f"  ratio MuonH/AdamW {med['MuonH'] / med['AdamW']:.3f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--preset", default="tiny", help="tiny (default, CPU sizes) or paper")
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=0, help="0 = the preset's")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=4, help="optimizer steps per timed block")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per side first (compile happens here)")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="peak for MFU (H100 SXM bf16 dense: 989)")
    p.add_argument("--compile", choices=("auto", "on", "off"), default="auto", help="auto: also compiled on CUDA")
    p.add_argument("--only", choices=("both", "dense", "moe"), default="both")
    args = p.parse_args()
    for name in ("depth", "micro_batch", "rounds", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda: CUDA is not available here")
    corpus = load_corpus(DataConfig(max_bytes=4_000_000))
    tokens = torch.from_numpy(corpus.train.astype("int64"))
    modes = [False] + ([True] if args.compile == "on" or (args.compile == "auto" and args.device != "cpu") else [])
    print(f"# torch {torch.__version__}, device {args.device}, threads {torch.get_num_threads()}")
    for name, arm in (("dense", "hyperp"), ("moe", "hyperp_moe")):
        if args.only not in ("both", name):
            continue
        model = {"depth": args.depth, "vocab_size": 32000 if args.preset == "paper" else 257}
        if args.seq_len:
            model["seq_len"] = args.seq_len
        cfg = build_config({"preset": args.preset, "optim": {"arm": arm}, "model": model}).model
        for compiled in modes:
            bench(name, cfg, args, tokens, compiled)
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
