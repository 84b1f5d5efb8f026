"""The Hugging Face Trainer and Lightning callbacks, each in one line, with the real library on a
tiny model: the monitor steps once per optimizer step (gradient accumulation included), logs
every indicator of every layer on the logged steps with the step's loss, and finishes the run."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from hyperwatch import hooks
from tests.hooks.support import hf_model

INDICATORS = {"attention_z", "attention_rms", "attention_outlier_ratio", "mlp_rms", "mlp_outlier_ratio"}


class Tokens(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int = 16) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, 96, (n, 12), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def layer_steps(sink: hooks.MemorySink) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for p in sink.points:
        if p.layer is not None:
            out.setdefault(p.step, set()).add(p.name)
    return out


def test_hugging_face_trainer_callback(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from hyperwatch.hooks.integrations.hf import HyperWatchCallback

    sink = hooks.MemorySink()
    losses: list[float] = []

    class Losses(transformers.TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "loss" in logs:
                losses.append(logs["loss"])

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=4,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        learning_rate=1e-3,
        max_grad_norm=1.0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=hf_model("llama"),
        args=args,
        train_dataset=Tokens(),
        callbacks=[HyperWatchCallback(sink=sink, run="hf-trainer", every=2), Losses()],  # the one line
    )
    trainer.train()
    steps = layer_steps(sink)
    # Steps numbered as the Trainer's logs number them (from 1); every=2: the first step, then 2, 4.
    assert sorted(steps) == [1, 2, 4] and all(names >= INDICATORS for names in steps.values())
    assert sorted(sink.values("loss")) == [1, 2, 4]
    # The step's loss: the mean over its two micro-batches, as the Trainer logs it (logging_steps=1).
    assert [sink.values("loss")[s] for s in (1, 2, 4)] == pytest.approx([losses[0], losses[1], losses[3]], rel=1e-5)
    # Clipping is on: grad_norm is the Trainer's own (before clipping), at every logging step.
    assert sorted(sink.values("grad_norm")) == [1, 2, 3, 4] and all(v > 0 for v in sink.values("grad_norm").values())
    trainer_steps = {e["step"]: e["grad_norm"] for e in trainer.state.log_history if "grad_norm" in e}
    assert sink.values("grad_norm") == pytest.approx(trainer_steps)
    assert sink.values("lr")[1] == pytest.approx(1e-3, rel=0.3)
    assert sink.runs[0].name == "hf-trainer" and sink.statuses == ["finished"]
    assert sink.runs[0].config["training_args"]["max_steps"] == 4
    # The budget: 4 steps of 2 micro-batches of 2 x 12 tokens, counted from the inputs.
    assert sink.runs[0].fields["total_steps"] == 4
    assert sink.values("tokens") == {1: 48, 2: 96, 4: 192}
    learned = {k: v for u in sink.updates for k, v in u.items() if k in ("tokens", "flops")}
    assert learned["tokens"] == 4 * 48 and learned["flops"] > 0


def trainer_args(transformers: Any, tmp_path: Path, **kwargs: Any) -> Any:
    return transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=2,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        learning_rate=1e-3,
        dataloader_num_workers=0,
        disable_tqdm=True,
        **kwargs,
    )


def test_hugging_face_steps_match_the_trainers_logs(tmp_path: Path) -> None:
    """logging_steps=5 (every defaults to it): the loss and the Trainer's grad_norm land on the
    same steps, the ones the Trainer's own logs carry (5, 10), not 5, 10 and 4, 9."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from hyperwatch.hooks.integrations.hf import HyperWatchCallback

    sink = hooks.MemorySink()
    args = trainer_args(transformers, tmp_path, max_steps=10, logging_steps=5, include_num_input_tokens_seen=True)
    trainer = transformers.Trainer(
        model=hf_model("llama"), args=args, train_dataset=Tokens(), callbacks=[HyperWatchCallback(sink=sink)]
    )
    trainer.train()
    logged = {e["step"]: e for e in trainer.state.log_history if "loss" in e}
    assert sorted(logged) == [5, 10]
    assert sorted(sink.values("grad_norm")) == [5, 10]
    assert sink.values("grad_norm") == pytest.approx({s: e["grad_norm"] for s, e in logged.items()})
    assert sorted(sink.values("loss")) == [1, 5, 10]  # and the first step, as every run's
    assert sorted(layer_steps(sink)) == [1, 5, 10]
    # The Trainer counts the tokens (include_num_input_tokens_seen): its count, at its steps.
    assert sink.values("tokens") == {1: 24, 5: 120, 10: 240}
    assert logged[10]["num_input_tokens_seen"] == 240
    assert sink.runs[0].fields["total_steps"] == 10
    learned = {k: v for u in sink.updates for k, v in u.items() if k in ("tokens", "flops")}
    assert learned["tokens"] == 240  # 10 steps x 2 sequences x 12 tokens
    n_params = sink.runs[0].fields["total_params"]
    assert learned["flops"] == pytest.approx(6 * n_params * 240)


class Ragged(IterableDataset[dict[str, torch.Tensor]]):
    """Sequences of 4, 5, 6... tokens, in order (one sequence per micro-batch: no padding)."""

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for i in range(8):
            x = torch.arange(4 + i) % 96
            yield {"input_ids": x, "labels": x}


def test_hugging_face_tokens_from_ragged_inputs(tmp_path: Path) -> None:
    """One process from step 0: the tokens counted from the inputs are exact whatever their shapes;
    the budget is extrapolated to the Trainer's last step (max_steps, steps counted from 1)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from hyperwatch.hooks.integrations.hf import HyperWatchCallback

    sink = hooks.MemorySink()
    args = trainer_args(transformers, tmp_path, max_steps=4, logging_steps=1)
    args.per_device_train_batch_size = 1
    trainer = transformers.Trainer(
        model=hf_model("llama"), args=args, train_dataset=Ragged(), callbacks=[HyperWatchCallback(sink=sink, every=1)]
    )
    trainer.train()
    assert sink.values("tokens") == {1: 4, 2: 9, 3: 15, 4: 22}
    learned = {k: v for u in sink.updates for k, v in u.items() if k == "tokens"}
    assert learned["tokens"] == 9 + 5 * (4 - 2)  # steps 1 and 2: 5 tokens a step, 2 steps to go
    assert sink.runs[0].fields["total_steps"] == 4


def test_lightning_callback(tmp_path: Path) -> None:
    L = pytest.importorskip("lightning.pytorch")
    from hyperwatch.hooks.integrations.lightning import LightningCallback

    class Module(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.model = hf_model("qwen2_moe")
            self.seen: list[float] = []

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            loss = self.model(**batch).loss
            self.seen.append(float(loss.detach()))
            return loss  # type: ignore[no-any-return]

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    sink = hooks.MemorySink()
    module = Module()
    trainer = L.Trainer(
        max_steps=4,
        accumulate_grad_batches=2,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        callbacks=[LightningCallback(sink=sink, run="lightning", every=2)],  # the one line
    )
    trainer.fit(module, torch.utils.data.DataLoader(Tokens(), batch_size=2))
    steps = layer_steps(sink)
    assert sorted(steps) == [0, 2]
    assert all(names >= INDICATORS | {"router_z", "max_vio"} for names in steps.values())
    # one optimizer step = two micro-batches; the step's loss is their mean
    for step in (0, 2):
        assert sink.values("loss")[step] == pytest.approx(sum(module.seen[2 * step : 2 * step + 2]) / 2, rel=1e-6)
    assert sorted(sink.values("grad_norm")) == [0, 2] and all(
        math.isfinite(v) for v in sink.values("grad_norm").values()
    )
    assert sink.values("lr")[2] == 0.01
    assert sink.runs[0].name == "lightning" and sink.statuses == ["finished"]
