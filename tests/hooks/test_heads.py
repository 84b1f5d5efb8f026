"""The alerts' indicators: per-head max attention LSE and output_z, against float64 references."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hyperwatch import hooks
from hyperwatch.hooks import heads
from hyperwatch.hooks.accumulate import Accumulator
from hyperwatch.hooks.adapters import discover
from tests.hooks.support import bundled_model


class MaskedAttention(nn.Module):
    """SDPA with a boolean padding mask: some rows of some heads see few keys, none are empty."""

    def __init__(self, width: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.mask: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, C // self.n_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Tiny(nn.Module):
    def __init__(self, width: int = 16, n_heads: int = 4, vocab: int = 40, depth: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.attn = nn.ModuleList(MaskedAttention(width, n_heads) for _ in range(depth))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))
                                 for _ in range(depth))  # fmt: skip
        self.lm_head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for a, m in zip(self.attn, self.mlp):
            x = x + a(x)
            x = x + m(x)
        return self.lm_head(x)


@torch.no_grad()
def _reference(model: Tiny, batches: list[torch.Tensor]) -> tuple[list[list[float]], float]:
    """Per layer, per head: max over every query of LSE(q.k/sqrt(d) + mask); and output Z, in float64."""
    per_head: list[torch.Tensor | None] = [None] * len(model.attn)
    z_sum, z_n = 0.0, 0
    for idx in batches:
        x = model.embed(idx)
        for i, (layer, m) in enumerate(zip(model.attn, model.mlp)):
            a: Any = layer
            B, T, C = x.shape
            q, k, _ = a.qkv(x).view(B, T, 3, a.n_heads, C // a.n_heads).permute(2, 0, 3, 1, 4)
            scores = q @ k.transpose(-1, -2) / math.sqrt(C // a.n_heads)
            assert a.mask is not None
            scores = scores.masked_fill(~a.mask, -math.inf)
            lse = torch.logsumexp(scores, -1)  # (B, H, T)
            got = lse.amax(dim=(0, 2))
            per_head[i] = got if per_head[i] is None else torch.maximum(per_head[i], got)  # type: ignore[arg-type]
            x = x + a(x)
            x = x + m(x)
        lse_out = torch.logsumexp(model.lm_head(x), -1)
        z_sum += float(lse_out.square().sum())
        z_n += lse_out.numel()
    return [h.tolist() for h in per_head if h is not None], z_sum / z_n


def test_per_head_lse_max_and_output_z_match_float64_references() -> None:
    torch.manual_seed(0)
    model = Tiny().double()
    with torch.no_grad():  # one head of layer 1 with large logits: its ceiling must stand out
        first: Any = model.attn[1]
        first.qkv.weight[:4] *= 30.0
    T = 10
    mask = torch.ones(2, 1, T, T, dtype=torch.bool).tril()
    mask[1, :, :, 6:] = False  # the second sequence is padded after 6 tokens
    for a in model.attn:
        a.mask = mask
    sink = hooks.MemorySink()
    mon = hooks.attach(model, run="heads", sink=sink, every=1, attention="attn.*", mlp="mlp.*")
    batches = [torch.randint(0, 40, (2, T)) for _ in range(2)]  # two micro-batches of one logged step
    for idx in batches:
        model(idx).sum().backward()
    mon.step(0)
    mon.close()
    want_heads, want_z = _reference(model, batches)
    got = {(p.name, p.layer): p.value for p in sink.points}
    for layer, per_head in enumerate(want_heads):
        for h, value in enumerate(per_head):
            assert got[(heads.head_name(h), layer)] == pytest.approx(value, rel=1e-5), (layer, h)
        assert got[("attention_lse_max", layer)] == pytest.approx(max(per_head), rel=1e-5)
        assert (heads.head_name(len(per_head)), layer) not in got  # no slot beyond the model's heads
    assert got[("output_z", None)] == pytest.approx(want_z, rel=1e-12)
    assert max(want_heads[1]) > 2 * max(want_heads[0])  # the scaled head is the one that shows


def test_heads_keep_nan_leave_out_fully_masked_heads_and_fold_beyond_the_slots() -> None:
    acc = Accumulator(2, [0, 0], torch.device("cpu"))
    lse = torch.tensor([[[1.0, 3.0], [-math.inf, -math.inf], [2.0, math.nan]]])  # (B=1, H=3, T=2)
    acc.add_attention_lse(0, lse)
    many = torch.arange(heads.MAX_HEADS + 5, dtype=torch.float32).reshape(1, -1, 1)  # more heads than slots
    acc.add_head_lse_max(1, many)
    acc.pack()
    host, _ = acc.take()
    layers = acc.unpack(host.numpy())
    h0 = layers[0].head_lse_max
    assert h0[0] == 3.0 and h0[1] is None and h0[2] is not None and math.isnan(h0[2])
    assert layers[0].attention_lse_max is not None and math.isnan(layers[0].attention_lse_max)  # NaN, never dropped
    h1 = layers[1].head_lse_max
    assert len(h1) == heads.MAX_HEADS and h1[-1] == heads.MAX_HEADS + 4  # the folded heads' max
    assert layers[1].attention_lse_max == heads.MAX_HEADS + 4
    again = acc.unpack(acc.take()[0].numpy())  # take() reset the maxima: nothing is carried over
    assert again[0].head_lse_max == [] and again[0].attention_lse_max is None


def test_output_head_found_on_bundled_model_and_absent_without_one() -> None:
    model: Any = bundled_model(moe=False)
    sink = hooks.MemorySink()
    captured: list[torch.Tensor] = []
    model.lm_head.register_forward_hook(lambda m, a, o: captured.append(o.detach().double()))
    mon = hooks.attach(model, run="b", sink=sink, every=1)
    x = torch.randint(0, 64, (2, 16))
    model(x, x).loss.backward()
    mon.step(0)
    mon.close()
    assert mon.plan.output is model.lm_head
    want = float(torch.logsumexp(captured[0], -1).square().mean())
    got = [p.value for p in sink.points if p.name == "output_z"]
    assert got == [pytest.approx(want, rel=1e-5)]
    assert all(hooks_name in {p.name for p in sink.points if p.layer == 0}
               for hooks_name in ("attention_lse_max", "attention_lse_max.h0"))  # fmt: skip

    bare = nn.Sequential(nn.Linear(4, 4))
    assert discover(bare).output is None
    assert heads.head_of("attention_lse_max.h12") == 12 and heads.head_of("attention_lse_max") is None


def test_unpack_heads_reads_only_seen_slots() -> None:
    flat = np.full(heads.MAX_HEADS * 2, -np.inf)
    flat[heads.MAX_HEADS + 2] = 7.5
    values, top = heads.unpack_heads(flat, 0, 1)
    assert values == [None, None, 7.5] and top == 7.5
    assert heads.unpack_heads(flat, 0, 0) == ([], None)


def test_output_z_survives_discovery_on_a_hugging_face_model() -> None:
    """A discovered plan (HF Llama: its first logged forward is traced) keeps the LM head's probe."""
    from tests.hooks.support import hf_model

    model: Any = hf_model("llama")
    captured: list[torch.Tensor] = []
    model.lm_head.register_forward_hook(lambda m, a, o: captured.append(o.detach().double()))
    sink = hooks.MemorySink()
    mon = hooks.attach(model, run="hf", sink=sink, every=1)
    for step in range(2):  # the traced first step, then a step on the refined plan
        x = torch.randint(0, 96, (2, 12))
        model(input_ids=x, labels=x).loss.backward()
        mon.step(step)
    mon.close()
    got = {p.step: p.value for p in sink.points if p.name == "output_z"}
    want = [float(torch.logsumexp(c, -1).square().mean()) for c in captured]
    assert got == {0: pytest.approx(want[0], rel=1e-5), 1: pytest.approx(want[1], rel=1e-5)}


def test_output_z_sums_in_slices_match_float64_and_keep_nonfinite_rows() -> None:
    torch.manual_seed(3)
    logits = torch.randn(3, 700, 257) * 20  # more rows than one slice holds: several slices
    total, n = heads.output_z_sums(logits)
    want = torch.logsumexp(logits.double(), -1).square().sum()
    assert n == 2100 and float(total[0]) == pytest.approx(float(want), rel=1e-6)
    half, _ = heads.output_z_sums(logits.bfloat16())  # fp32 arithmetic on the bf16 values
    assert float(half[0]) == pytest.approx(
        float(torch.logsumexp(logits.bfloat16().double(), -1).square().sum()), rel=1e-5
    )
    bad = logits[0, :4].clone()
    bad[1, 5] = math.nan
    bad[2, 7] = math.inf
    sums, _ = heads.output_z_sums(bad)
    assert not math.isfinite(float(sums[0]))  # a diverged row is a training fact, never dropped
