"""`hyperwatch size`: formulas agree with the meta model, budgets and FLOPs by hand."""

from __future__ import annotations

import json

import pytest
import torch

from hyperwatch.cli import main
from hyperwatch.trainer.config import ModelConfig
from hyperwatch.trainer.model import Transformer
from hyperwatch.trainer.sizes import forward_flops_per_token, model_size, param_counts


def meta_counts(cfg: ModelConfig) -> tuple[int, int]:
    with torch.device("meta"):
        model = Transformer(cfg)
    total = sum(p.numel() for p in model.parameters())
    moe = model.moe_layers
    if not moe:
        return total, total
    m = moe[0]
    per_expert = sum(w[0].numel() for w in (m.experts.w1, m.experts.w3, m.experts.w2))
    inactive = len(moe) * (m.n_experts - m.top_k) * per_expert
    return total, total - inactive


@pytest.mark.parametrize(
    "cfg",
    [
        ModelConfig(depth=8),
        ModelConfig(depth=12),
        ModelConfig(depth=8, moe=True),
        ModelConfig(depth=4, moe=True, moe_sparsity=4, moe_granularity=2, shared_expert=False),
        ModelConfig(depth=2, alpha=32, head_dim=16, vocab_size=257, seq_len=256, qk_norm=False, gated_attention=False),
    ],
    ids=["d8", "d12", "d8-moe", "d4-moe-noshared", "tiny-bare"],
)
def test_formulas_match_the_meta_model(cfg: ModelConfig) -> None:
    total, active, _ = param_counts(cfg)
    assert (total, active) == meta_counts(cfg)


def test_reference_budget_is_reproduced() -> None:
    size = model_size(ModelConfig(depth=8), tpp=50)
    assert size.total_params == 208_292_864
    assert size.tokens == pytest.approx(10.4e9, rel=0.002)  # the reference runs' T_0
    assert model_size(ModelConfig(depth=12)).total_params == pytest.approx(570e6, rel=0.002)


def test_flops_by_hand_for_a_small_config() -> None:
    cfg = ModelConfig(
        depth=1, alpha=8, head_dim=4, n_kv_heads=2, vocab_size=10, seq_len=6, qk_norm=False, gated_attention=True
    )
    W, H, K, D, T, V = 8, 2, 2, 4, 6, 10
    attn = 2 * W * (H * D + 2 * K * D) + 2 * W * H + 2 * T * H * D + 3 * H * T + 2 * T * H * D + 2 * H * D * W
    mlp = 2 * 3 * W * 4 * W
    assert forward_flops_per_token(cfg) == 2 * V * W + attn + mlp + 2 * W * V
    size = model_size(cfg, tokens=1000)
    assert size.training_flops == 3 * forward_flops_per_token(cfg) * 1000


def test_moe_flops_count_visited_experts_only() -> None:
    dense = ModelConfig(depth=8)
    moe = ModelConfig(depth=8, moe=True)  # k=8: 7 routed + 1 shared of 4w/8 = the dense MLP's FLOPs
    router = 2 * moe.width * moe.n_routed_experts * moe.depth
    assert forward_flops_per_token(moe) == forward_flops_per_token(dense) + router


def test_cli_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["size", "--depth", "8", "--moe-sparsity", "8", "--moe-granularity", "8", "--tokens", "1e9"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == 1_000_000_000
    assert out["moe"]["routed_experts"] == 63 and out["moe"]["top_k"] == 7
    assert out["total_params"] > out["active_params"]
    assert out["training_flops"] == pytest.approx(3 * out["forward_flops_per_token"] * 1e9)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--depth", "3"], "n_kv_heads"),
        (["--depth", "8", "--moe-sparsity", "8"], "both"),
        (["--depth", "8", "--tokens", "-5"], "--tokens"),
    ],
)
def test_cli_rejects_bad_input(argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        main(["size", *argv])
