"""Run by torchrun in test_distributed.py: a few DDP steps of a tiny MoE, then a JSON report per rank."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from hyperwatch.trainer.config import load_config
from hyperwatch.trainer.train import Trainer


def main(out_dir: str, cache: str) -> None:
    cfg = load_config(
        None,
        [
            "--preset", "tiny",
            "--optim.arm", "hyperp_moe",
            "--model.depth", "2",
            "--model.seq_len", "32",
            "--train.micro_batch", "2",
            "--train.batch_tokens", "256",  # 2 ranks x 2 micro-batches x 2 x 32
            "--train.tokens", "1024",
            "--train.eval_every", "2",
            "--train.eval_batches", "2",
            "--train.out_dir", out_dir,
            "--train.progress", "false",
            "--data.max_bytes", "200000",
            "--data.cache_dir", cache,
        ],
    )  # fmt: skip
    trainer = Trainer(cfg)
    result = trainer.fit()
    rank = dist.get_rank()
    moe = trainer.model.moe_layers[0]
    x, y = trainer.loader.next_batch()  # a different batch on each rank
    trainer.model(x, y)
    local_counts = moe.counts.clone()  # type: ignore[union-attr]
    global_counts = local_counts.clone()
    dist.all_reduce(global_counts)
    report = {
        "rank": rank,
        "world": dist.get_world_size(),
        "accum": trainer.accum,
        "losses": result.losses,
        "val_losses": result.val_losses,
        "param_sum": float(sum(p.double().sum() for p in trainer.model.parameters())),
        "aux_loss": float(moe.aux_loss),  # type: ignore[arg-type]
        "local_counts": local_counts.tolist(),
        "global_counts": global_counts.tolist(),
        "first_tokens": x[0, :8].tolist(),
    }
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(report, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1], sys.argv[2])
