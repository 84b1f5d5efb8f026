"""Fixtures: tiny models from configs and a small real-text corpus (the stdlib's own source)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from hyperwatch.trainer.config import ModelConfig, preset


def tiny_model_config(**overrides: object) -> ModelConfig:
    cfg = preset("tiny", depth=2).model
    return dataclasses.replace(cfg, vocab_size=64, seq_len=32, **overrides)  # type: ignore[arg-type]


@pytest.fixture
def tiny_cfg() -> ModelConfig:
    return tiny_model_config()


@pytest.fixture(scope="session")
def corpus_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data_cache")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
