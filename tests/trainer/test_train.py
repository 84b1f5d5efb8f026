"""The training loop on real text: loss falls, resume is exact, configs and CLI validate."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from hyperwatch.cli import main
from hyperwatch.trainer.config import ConfigError, load_config
from hyperwatch.trainer.train import Trainer, train


def tiny_run(tmp: Path, cache: Path, *extra: str) -> list[str]:
    return [
        "--preset", "tiny",
        "--optim.arm", "hyperp_moe",
        "--model.depth", "2",
        "--model.seq_len", "64",
        "--train.micro_batch", "4",
        "--train.batch_tokens", "512",
        "--train.tokens", "16384",  # 32 steps
        "--train.eval_every", "8",
        "--train.eval_batches", "4",
        "--train.out_dir", str(tmp),
        "--train.progress", "false",
        "--data.max_bytes", "300000",
        "--data.cache_dir", str(cache),
        *extra,
    ]  # fmt: skip


def test_muonh_hyperp_moe_loss_falls_on_real_text(tmp_path: Path, corpus_cache: Path) -> None:
    result = train(load_config(None, tiny_run(tmp_path, corpus_cache)))
    losses = [v for _, v in result.losses]
    assert result.steps == 32 and len(losses) == 32
    assert losses[0] == pytest.approx(5.55, abs=0.4)  # ~ln(257) at initialisation
    assert sum(losses[-4:]) / 4 < losses[0] - 1.5
    vals = [v for _, v in result.val_losses]
    assert vals[-1] < vals[0] - 0.3
    assert result.attention_kernel == "flash_lse"
    assert (tmp_path / "checkpoint.pt").exists()


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Multi-threaded CPU reductions make the *reported* mean loss jitter in its last bit from run
    to run (the trajectory itself does not change); one thread makes the comparison bit-exact."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_resume_reproduces_the_same_losses(tmp_path: Path, corpus_cache: Path, one_thread: None) -> None:
    straight = train(load_config(None, tiny_run(tmp_path / "a", corpus_cache, "--train.max_steps", "10")))
    first = train(load_config(None, tiny_run(tmp_path / "b", corpus_cache, "--train.max_steps", "5")))
    assert first.steps == 5
    resumed = train(
        load_config(None, tiny_run(tmp_path / "b", corpus_cache, "--train.max_steps", "10", "--train.resume", "true"))
    )
    assert resumed.resumed_from == 5
    assert resumed.losses == straight.losses  # bit-identical, steps 0..9
    assert resumed.val_losses[-1] == straight.val_losses[-1]
    a = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=False)
    b = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name


def test_optimizer_state_with_reference_norms_is_checkpointed(tmp_path: Path, corpus_cache: Path) -> None:
    train(load_config(None, tiny_run(tmp_path, corpus_cache, "--train.max_steps", "2")))
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    flat = json.dumps(state["optimizer"], default=lambda o: "tensor" if hasattr(o, "shape") else str(o))
    assert "c_w" in flat.lower()  # MuonH/AdamH reference norms travel with the checkpoint
    assert state["step"] == 2 and len(state["loader"]) == 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--model.depthh", "2"], "unknown options"),
        (["--model.depth", "two"], "ModelConfig.depth"),
        (["--optim.arm", "adam"], "OptimConfig.arm"),
        (["--train.batch_tokens", "-1"], "batch_tokens"),
        (["--nonsense", "1"], "no section has it"),
        (["--depth"], "missing its value"),
        (["--data.source", "ftp"], "DataConfig.source"),
        (["--train.threads", "-1"], r"TrainConfig\.threads: must be >= 0"),
    ],
)
def test_bad_options_name_themselves(overrides: list[str], message: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=message):
        load_config(None, ["--preset", "tiny", *overrides])


def test_toml_config_and_arm_flag(tmp_path: Path) -> None:
    path = tmp_path / "run.toml"
    path.write_text('preset = "tiny"\n[model]\ndepth = 4\n[optim]\narm = "muon"\nlr = 0.01\n')
    cfg = load_config(path, ["--train.micro_batch", "2"])
    assert cfg.model.depth == 4 and cfg.optim.lr == 0.01 and cfg.train.micro_batch == 2
    assert cfg.model.parameterization == "mup++" and not cfg.model.moe
    assert load_config(path, ["--optim.arm", "hyperp_moe"]).model.moe
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)


def test_batch_must_split_into_micro_batches(tmp_path: Path, corpus_cache: Path) -> None:
    cfg = load_config(None, tiny_run(tmp_path, corpus_cache, "--train.batch_tokens", "500"))
    with pytest.raises(ConfigError, match="multiple of micro_batch"):
        Trainer(cfg)


def test_train_cli_end_to_end(tmp_path: Path, corpus_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["train", *tiny_run(tmp_path, corpus_cache, "--train.max_steps", "3", "--optim.arm", "muon")]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    data = json.loads(printed[printed.index("{") :])
    assert data["steps"] == 3 and data["attention_kernel"] == "flash_lse"
    assert data["final_val_loss"] == data["final_val_loss"]  # a number, not NaN
    assert main(["train", "--preset", "tiny", "--model.depth", "3"]) == 2
    assert "n_kv_heads" in capsys.readouterr().err
    assert main(["train", "--preset", "tiny", "--print-config", "--depth", "4"]) == 0
    assert json.loads(capsys.readouterr().out)["model"]["depth"] == 4


def test_threads_option_sets_this_process_pool(tmp_path: Path, corpus_cache: Path) -> None:
    """Runs side by side (the demo's arms) each take their share of the cores, not one thread per core."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        Trainer(load_config(None, tiny_run(tmp_path, corpus_cache, "--train.threads", "1")))
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        Trainer(load_config(None, tiny_run(tmp_path, corpus_cache)))  # 0, the default: PyTorch's own
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
