"""Run directly (one process) or by torchrun (2 or 4 gloo ranks) in test_fsdp.py; writes a JSON report.

Every world size must see the same global batches, so the trainer's sampler (which draws each
rank's windows from its own part of the corpus) is replaced by one that cuts a fixed global
micro-batch of ``GLOBAL_MICRO`` windows into per-rank slices: one process with micro_batch 4,
two with 2, four with 1 then train on identical data and their losses must agree.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import hyperwatch.trainer.train as train_mod
from hyperwatch.trainer.config import load_config
from hyperwatch.trainer.moe import max_vio
from hyperwatch.trainer.optim.batched import is_sharded
from hyperwatch.trainer.parallel import full_state

GLOBAL_MICRO = 4
SEQ = 32


class GlobalBatchSlices:
    """TokenLoader's interface: micro-batch ``k`` is rank ``r``'s slice of global batch ``k``."""

    def __init__(self, tokens: np.ndarray, seq_len: int, micro_batch: int, *, seed: int, rank: int, world_size: int):
        assert micro_batch * world_size == GLOBAL_MICRO
        self.tokens, self.seq_len, self.micro, self.seed, self.rank = tokens, seq_len, micro_batch, seed, rank
        self.k = 0

    def batch(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([self.seed, k])
        starts = rng.integers(0, len(self.tokens) - self.seq_len - 1, GLOBAL_MICRO)
        w = np.stack([self.tokens[s : s + self.seq_len + 1] for s in starts]).astype(np.int64)
        w = w[self.rank * self.micro : (self.rank + 1) * self.micro]
        return torch.from_numpy(w[:, :-1].copy()), torch.from_numpy(w[:, 1:].copy())

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.k += 1
        return self.batch(self.k - 1)

    def state_dict(self) -> dict[str, Any]:
        return {"k": self.k}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.k = int(state["k"])


def main(out_path: str, cache: str, run_dir: str, parallel: str, max_steps: str, resume: str) -> None:
    train_mod.TokenLoader = GlobalBatchSlices  # type: ignore[assignment,misc]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg = load_config(
        None,
        [
            "--preset", "tiny",
            "--optim.arm", "hyperp_moe",
            "--model.depth", "2",
            "--model.seq_len", str(SEQ),
            "--model.moe_sparsity", "2",
            "--model.moe_granularity", "4",
            "--train.micro_batch", str(GLOBAL_MICRO // world),
            "--train.batch_tokens", str(2 * GLOBAL_MICRO * SEQ),  # 2 micro-batches per step
            "--train.tokens", str(5 * 2 * GLOBAL_MICRO * SEQ),  # 5 steps of budget
            "--train.max_steps", max_steps,
            "--train.eval_every", "0",
            "--train.eval_batches", "1",
            "--train.parallel", parallel,
            "--train.resume", resume,
            "--train.out_dir", run_dir,
            "--train.progress", "false",
            "--data.max_bytes", "200000",
            "--data.cache_dir", cache,
        ],
    )  # fmt: skip
    trainer = train_mod.Trainer(cfg)
    result = trainer.fit()
    report = _report(trainer, result, world)
    if trainer.dist.rank == 0:
        with open(out_path, "w") as f:
            json.dump(report, f)
    # No retry around this in test_fsdp.py: the run must end cleanly on every rank (barrier, model
    # and optimizers released, process group destroyed), as ``hyperwatch train`` ends.
    trainer.close()


def _report(trainer: train_mod.Trainer, result: train_mod.TrainResult, world: int) -> dict[str, Any]:
    """What the test compares; its modules and tensors are this function's locals, gone on return."""
    sharded = is_sharded(next(trainer.model.parameters()))
    params = {k: v.double().sum().item() for k, v in full_state(trainer.model.state_dict()).items()}
    # One more forward on a fixed global batch: the global aux loss and MaxVio of layer 0.
    loader = GlobalBatchSlices(
        trainer.corpus.train, SEQ, GLOBAL_MICRO // world, seed=99, rank=trainer.dist.rank, world_size=world
    )
    x, y = loader.batch(0)
    with torch.no_grad():
        trainer.model(x, y)
    moe = trainer.model.moe_layers[0]
    counts = moe.counts.clone()  # type: ignore[union-attr]
    if world > 1:
        dist.all_reduce(counts)
    return {
        "world": world,
        "losses": result.losses,
        "resumed_from": result.resumed_from,
        "aux_loss": float(moe.aux_loss),  # type: ignore[arg-type]
        "max_vio": float(max_vio(counts)),
        "counts": counts.tolist(),
        "params": params,
        "sharded": sharded,
    }


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(*sys.argv[1:7])
