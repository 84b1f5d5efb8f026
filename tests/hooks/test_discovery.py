"""What the issue found wrong, one by one: a hook never fails the run, the attention softmax is told
from a gate's, one key/value head broadcast over the query heads, models without blocks or without
attention, every key of a missing branch named, and the residual-stream discovery's own rules."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hyperwatch import hooks
from hyperwatch.hooks import indicators
from hyperwatch.hooks.accumulate import Accumulator
from hyperwatch.hooks.tracer import Tracer
from tests.hooks.support import hf_model
from tests.hooks.test_indicators import explicit_lse
from tests.hooks.test_torch_modules import per_layer


def train_step(model: nn.Module, seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(seed))
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def boom(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError("a bug inside the hooks")


@pytest.mark.parametrize(
    ("target", "keys"),
    [
        ("add_branch", {"attention_rms@0", "attention_outlier_ratio@0", "mlp_rms@0", "mlp_outlier_ratio@0"}),
        ("add_attention_lse", {"attention_z@0", "attention_z@1"}),
        ("add_router_logits", {"router_z@0", "max_vio@0", "router_z@1", "max_vio@1"}),
    ],
)
def test_a_failing_probe_leaves_the_forward_unchanged_and_is_reported_once(
    target: str, keys: set[str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every probe kind fails (branch, attention Z through SDPA, router) on the steps after the traced
    one: the model's loss and gradients are those of the model without hooks, and the failure is
    named in ``unavailable`` for every indicator it hits, with the exception, and logged once."""
    model = hf_model("mixtral")
    ref = [train_step(model, seed) for seed in range(3)]
    sink = hooks.MemorySink()
    mon = hooks.attach(model, run="fails", sink=sink, every=1)
    got = [train_step(model, 0)]
    mon.step(0)
    monkeypatch.setattr(Accumulator, target, boom)
    with caplog.at_level(logging.WARNING, logger="hyperwatch.hooks"):
        for seed in (1, 2):
            got.append(train_step(model, seed))
            mon.step(seed)
    mon.close()
    for (loss, grads), (want_loss, want_grads) in zip(got, ref):
        assert torch.equal(loss, want_loss) and all(torch.equal(a, b) for a, b in zip(grads, want_grads))
    assert keys <= set(mon.unavailable), mon.unavailable
    assert all("RuntimeError: a bug inside the hooks" in mon.unavailable[k] for k in keys)
    # one log line for the failure, although the probe ran on two steps and in several layers
    assert sum("a bug inside the hooks" in r.getMessage() for r in caplog.records) == 1


def test_a_failing_discovery_trace_leaves_the_forward_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    model = hf_model("llama")
    want = train_step(model)
    monkeypatch.setattr(Tracer, "_record", boom)
    mon = hooks.attach(model, run="trace-fails", sink=hooks.MemorySink(), every=1)
    got = train_step(model)
    mon.step(0)
    assert torch.equal(got[0], want[0]) and all(torch.equal(a, b) for a, b in zip(got[1], want[1]))
    assert "a bug inside the hooks" in mon.unavailable["discovery"]
    sink = hooks.MemorySink()  # the adapter's plan by names measures the next steps
    mon.sink = sink
    train_step(model, 1)
    mon.step(1)
    mon.close()
    assert set(per_layer(sink, 1)) == {0, 1}


class GatedAttention(nn.Module):
    """A hand-written attention that calls a 4-D softmax (a gate over heads) before the attention's."""

    def __init__(self, width: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.gate = nn.Linear(width, heads)
        self.out = nn.Linear(width, width)
        self.scores: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        gate = F.softmax(self.gate(x).transpose(1, 2).unsqueeze(-1) * 3.0, dim=-1)  # (B, H, T, 1): a 4-D softmax
        scores = q @ k.transpose(-1, -2) / math.sqrt(C // self.heads)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
        self.scores.append(scores.detach())
        y = F.dropout(F.softmax(scores, dim=-1), 0.0, self.training) @ v
        return self.out((y * gate).transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.attn = attention
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x)
        return x + self.mlp(x)


def test_the_attention_softmax_is_the_one_that_multiplies_the_values() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(Block(GatedAttention()), Block(GatedAttention()))
    sink = hooks.MemorySink()
    mon = hooks.attach(model, run="gated", sink=sink, every=1)
    for step in range(2):  # the traced forward, then the hooks
        model(torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(step))).square().mean().backward()
        mon.step(step)
    mon.close()
    assert mon.unavailable == {}
    for step in range(2):
        for layer, block in enumerate(model):
            want = float(torch.logsumexp(block.attn.scores[step].double(), -1).square().mean())
            assert per_layer(sink, step)[layer]["attention_z"] == pytest.approx(want, rel=1e-6)


def test_one_key_value_head_broadcasts_over_every_query_head() -> None:
    """Multi-query attention as plain SDPA accepts it (k and v with one head, no enable_gqa)."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 9, 8, generator=g), torch.randn(2, 1, 9, 8, generator=g)
    got = indicators.attention_lse(q, k, is_causal=True, chunk_elements=37)
    ref = explicit_lse(q, k.expand(2, 4, 9, 8), is_causal=True)
    torch.testing.assert_close(got.double(), ref, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="enable_gqa"):
        indicators.attention_lse(q, torch.randn(2, 3, 9, 8))


class Mixer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


def test_a_model_without_blocks_is_monitored_with_what_exists() -> None:
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    sink = hooks.MemorySink()
    with hooks.attach(model, run="no-blocks", sink=sink, every=1) as mon:
        model(torch.randn(4, 16)).square().mean().backward()
        mon.step(0, loss=0.5)
    assert set(mon.unavailable) == {
        "attention_z",
        "attention_rms",
        "attention_outlier_ratio",
        "mlp_rms",
        "mlp_outlier_ratio",
    }
    assert "found no blocks" in mon.unavailable["mlp_rms"]
    assert sink.values("loss") == {0: 0.5} and sink.values("grad_norm")[0] > 0
    assert not any(p.layer is not None for p in sink.points)


def test_every_key_of_a_branch_without_a_glob_is_named() -> None:
    model = nn.Sequential(Block(GatedAttention()), Block(GatedAttention()))
    with hooks.attach(model, run="mlp-only", sink=hooks.MemorySink(), adapter="pattern", mlp="*.mlp") as mon:
        pass
    assert {"attention_z", "attention_rms", "attention_outlier_ratio"} <= set(mon.unavailable)


class ScaledBlock(nn.Module):
    """A residual add of a scaled branch (x 0.5) and of a parallel sum (attention + MLP)."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = GatedAttention()
        self.feed = Mixer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.layer_norm(x, (32,))
        return x + 0.5 * (self.attention(h) + nn.functional.pad(self.feed(h[..., :16]), (0, 16)))


def test_a_branch_that_is_no_module_output_is_named_with_the_reason() -> None:
    torch.manual_seed(1)
    model = nn.Sequential(ScaledBlock(), ScaledBlock())
    outputs: list[torch.Tensor] = []
    model[1].attention.register_forward_hook(lambda m, a, o: outputs.append(o.detach().double()))
    sink = hooks.MemorySink()
    with hooks.attach(model, run="padded", sink=sink, every=1) as mon:
        model(torch.randn(2, 5, 32)).sum().backward()
        mon.step(0)
    # the attention part is found (x 0.5); the MLP part goes through a pad: not a module's output
    assert [s.attention_output for s in mon.plan.layers] == [b.attention for b in model]
    assert [s.attention_scale for s in mon.plan.layers] == [0.5, 0.5]
    assert set(mon.unavailable) == {"mlp_rms", "mlp_outlier_ratio"}
    assert "result of pad" in mon.unavailable["mlp_rms"]
    got = per_layer(sink)
    heads = {n for n in got[0] if n.startswith("attention_lse_max")}  # the per-head ceilings (issue 21)
    assert set(got[0]) - heads == {"attention_z", "attention_rms", "attention_outlier_ratio"}
    assert "attention_lse_max" in heads and "attention_lse_max.h0" in heads
    want = float((0.5 * outputs[0]).square().mean().sqrt())  # what the residual receives of it
    assert got[1]["attention_rms"] == pytest.approx(want, rel=1e-6)
