"""PyTorch's own transformer modules, with no pattern given: every indicator of every layer,
checked against a naive re-implementation of the layer (scores, softmax, branches, norms)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hyperwatch import hooks
from hyperwatch.hooks import mha as mha_module
from hyperwatch.hooks.adapters import AdapterError, discover

E, H, FF, B, L, S = 64, 4, 96, 2, 7, 5
INDICATORS = {"attention_z", "attention_rms", "attention_outlier_ratio", "mlp_rms", "mlp_outlier_ratio"}


def with_outliers(layer: nn.Module) -> None:
    """One hidden channel far out in each branch, so 5-sigma outliers exist (E=64 allows them)."""
    with torch.no_grad():
        layer.self_attn.out_proj.bias[5] = 40.0
        layer.linear2.bias[7] = 40.0


def naive_attention(
    mha: nn.MultiheadAttention, q_in: torch.Tensor, kv_in: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output (B, L, E), LSE (B, H, L)) from the weights, inputs batch-major; ``mask`` additive."""
    wq, wk, wv = mha.in_proj_weight.chunk(3)
    bq, bk, bv = mha.in_proj_bias.chunk(3)
    hd = E // H

    def heads(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], x.shape[1], H, hd).transpose(1, 2)

    q, k, v = heads(q_in @ wq.T + bq), heads(kv_in @ wk.T + bk), heads(kv_in @ wv.T + bv)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    if mask is not None:
        scores = scores + mask
    lse = torch.logsumexp(scores, dim=-1)
    o = (scores.softmax(-1) @ v).transpose(1, 2).reshape(q_in.shape[0], q_in.shape[1], E)
    return F.linear(o, mha.out_proj.weight, mha.out_proj.bias), lse


def naive_layer(
    layer: nn.Module, x: torch.Tensor, mask: torch.Tensor | None, memory: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(layer output, attention branch, MLP branch, self-attention LSE), all batch-major."""

    def ff(h: torch.Tensor) -> torch.Tensor:
        return layer.linear2(layer.activation(layer.linear1(h)))

    decoder = memory is not None
    norm_mlp = layer.norm3 if decoder else layer.norm2
    if layer.norm_first:
        a, lse = naive_attention(layer.self_attn, layer.norm1(x), layer.norm1(x), mask)
        x = x + a
        if decoder:
            h = layer.norm2(x)
            x = x + naive_attention(layer.multihead_attn, h, memory, None)[0]
        m = ff(norm_mlp(x))
        x = x + m
    else:
        a, lse = naive_attention(layer.self_attn, x, x, mask)
        x = layer.norm1(x + a)
        if decoder:
            x = layer.norm2(x + naive_attention(layer.multihead_attn, x, memory, None)[0])
        m = ff(x)
        x = norm_mlp(x + m)
    return x, a, m, lse


def naive_indicators(a: torch.Tensor, m: torch.Tensor, lse: torch.Tensor) -> dict[str, float]:
    def outliers(t: torch.Tensor) -> float:
        t = t.double()
        mean = t.mean(-1, keepdim=True)
        std = t.std(-1, correction=0, keepdim=True)
        return float(((t - mean).abs() > 5 * std).double().mean())

    finite = lse[lse > -1e30]
    return {
        "attention_z": float(finite.double().square().mean()),
        "attention_rms": float(a.double().square().mean().sqrt()),
        "attention_outlier_ratio": outliers(a),
        "mlp_rms": float(m.double().square().mean().sqrt()),
        "mlp_outlier_ratio": outliers(m),
    }


def per_layer(sink: hooks.MemorySink, step: int = 0) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for p in sink.points:
        if p.step == step and p.layer is not None:
            out.setdefault(p.layer, {})[p.name] = p.value
    return out


def causal(n: int) -> torch.Tensor:
    return nn.Transformer.generate_square_subsequent_mask(n)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_every_indicator_of_every_layer_matches_a_naive_reference(
    kind: str, norm_first: bool, batch_first: bool
) -> None:
    torch.manual_seed(0)
    cls = nn.TransformerEncoderLayer if kind == "encoder" else nn.TransformerDecoderLayer
    proto = cls(E, H, FF, dropout=0.0, batch_first=batch_first, norm_first=norm_first)
    stack: nn.Module = (
        nn.TransformerEncoder(proto, 3, enable_nested_tensor=False)
        if kind == "encoder"
        else nn.TransformerDecoder(proto, 3)
    )
    for layer in stack.layers:
        with_outliers(layer)
    x = torch.randn(B, L, E)
    memory = torch.randn(B, S, E) if kind == "decoder" else None
    mask = causal(L)

    def io(t: torch.Tensor | None) -> torch.Tensor | None:
        return t if t is None or batch_first else t.transpose(0, 1)

    sink = hooks.MemorySink()
    mon = hooks.attach(stack, run=f"{kind}-{norm_first}-{batch_first}", sink=sink, every=1)  # no pattern
    if kind == "encoder":
        y = stack(io(x), mask=mask, is_causal=True)
    else:
        y = stack(io(x), io(memory), tgt_mask=mask, tgt_is_causal=True)
    y.square().mean().backward()
    mon.step(0, loss=1.0)
    mon.close()

    got = per_layer(sink)
    assert sorted(got) == [0, 1, 2]
    h = x
    with torch.no_grad():
        for i, layer in enumerate(stack.layers):
            h, a, m, lse = naive_layer(layer, h, mask, memory)
            want = naive_indicators(a, m, lse)
            assert set(got[i]) >= INDICATORS, INDICATORS - set(got[i])
            for name, value in want.items():
                assert got[i][name] == pytest.approx(value, rel=1e-4, abs=1e-7), (i, name)
            assert got[i]["attention_outlier_ratio"] > 0 and got[i]["mlp_outlier_ratio"] > 0
        out = y if batch_first else y.transpose(0, 1)
        torch.testing.assert_close(out, h, rtol=1e-4, atol=1e-4)  # the reference is the layer itself
    if kind == "encoder":
        assert mon.unavailable == {}
    else:
        assert set(mon.unavailable) == {"cross_attention"}
        assert "attention='*.multihead_attn'" in mon.unavailable["cross_attention"]
    assert sink.runs[0].config["_hyperwatch"]["hooks_adapter"] == "torch"
    assert "recomputed" in sink.runs[0].config["_hyperwatch"]["attention_z_source"]


@pytest.mark.parametrize("path", ["cpu flash kernel", "chunked scores (CUDA, autocast)"])
@pytest.mark.parametrize("padded", [True, False])
def test_padding_masks_and_boolean_masks_follow_multihead_attention_semantics(
    path: str, padded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Boolean masks are True where attention is NOT allowed (the opposite of SDPA); both ways to
    the LSE agree with the naive scores (the fallback is what runs where the CPU kernel cannot)."""
    if path.startswith("chunked"):
        monkeypatch.setattr(mha_module, "cpu_flash_with_lse", lambda a: None)
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(E, H, FF, dropout=0.0, batch_first=True)
    x = torch.randn(B, L, E)
    pad = torch.zeros(B, L, dtype=torch.bool)
    pad[0, -3:] = padded  # the last three keys of sample 0 are padding (or nothing is)
    bool_causal = torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1)
    sink = hooks.MemorySink()
    mon = hooks.attach(layer, run="masks", sink=sink, every=1)
    layer(x, src_mask=bool_causal, src_key_padding_mask=pad if padded else None).sum().backward()
    mon.step(0)
    mon.close()
    additive = causal(L).expand(B, 1, L, L) + torch.zeros(B, 1, 1, L).masked_fill(pad[:, None, None, :], -math.inf)
    with torch.no_grad():
        _, a, m, lse = naive_layer(layer, x, additive, None)
    want = naive_indicators(a, m, lse)
    got = per_layer(sink)[0]
    assert got["attention_z"] == pytest.approx(want["attention_z"], rel=1e-4)
    assert got["attention_rms"] == pytest.approx(want["attention_rms"], rel=1e-4)
    assert mha_module._is_causal_mask(bool_causal) and mha_module._is_causal_mask(causal(L))
    assert not mha_module._is_causal_mask(causal(L).T) and not mha_module._is_causal_mask(~bool_causal)


def test_full_nn_transformer_numbers_encoder_then_decoder_layers() -> None:
    torch.manual_seed(2)
    model = nn.Transformer(E, H, num_encoder_layers=2, num_decoder_layers=3, dim_feedforward=FF, batch_first=True)
    sink = hooks.MemorySink()
    mon = hooks.attach(model, run="seq2seq", sink=sink, every=1)
    out = model(torch.randn(B, S, E), torch.randn(B, L, E), tgt_mask=causal(L))
    out.sum().backward()
    mon.step(0)
    mon.close()
    got = per_layer(sink)
    assert sorted(got) == [0, 1, 2, 3, 4]
    for values in got.values():
        assert set(values) >= INDICATORS
        assert all(math.isfinite(v) for v in values.values())
    assert set(mon.unavailable) == {"cross_attention"}


def test_a_glob_for_one_branch_leaves_the_others_auto_detected() -> None:
    torch.manual_seed(3)
    stack = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, FF, dropout=0.0), 2, enable_nested_tensor=False)
    plan = discover(stack, mlp="*.linear2")
    assert plan.family == "torch+pattern"
    assert [s.mlp for s in plan.layers] == [layer.linear2 for layer in stack.layers]
    assert [s.attention for s in plan.layers] == [layer.self_attn for layer in stack.layers]
    sink = hooks.MemorySink()
    mon = hooks.attach(stack, run="glob-mlp", sink=sink, every=1, mlp="*.linear2")
    stack(torch.randn(L, B, E)).sum().backward()
    mon.step(0)
    mon.close()
    got = per_layer(sink)
    assert sorted(got) == [0, 1]
    for values in got.values():
        assert set(values) >= INDICATORS  # attention Z and RMS still there: auto-detected
    assert mon.unavailable == {}
    # The cross-attention named by a glob replaces the self-attention, and the note goes away.
    dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(E, H, FF), 2)
    plan = discover(dec, attention="*.multihead_attn")
    assert [s.attention for s in plan.layers] == [layer.multihead_attn for layer in dec.layers]
    assert all(s.mha and s.attention_output is None for s in plan.layers)
    assert plan.unavailable == {}


def test_a_glob_matching_the_wrong_number_of_modules_says_so() -> None:
    stack = nn.TransformerEncoder(nn.TransformerEncoderLayer(E, H, FF), 3, enable_nested_tensor=False)
    with pytest.raises(AdapterError, match=r"mlp='layers.0.linear2' matches 1 modules .* found 3 layers"):
        discover(stack, mlp="layers.0.linear2")


def test_bare_multihead_attention_in_a_hand_written_block() -> None:
    """need_weights=True (MultiheadAttention's default) takes another path inside torch; same Z."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = nn.MultiheadAttention(E, H, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(E, FF), nn.GELU(), nn.Linear(FF, E))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(x, x, x, attn_mask=causal(x.shape[1]))[0]
            return x + self.mlp(x)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([Block() for _ in range(2)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return x

    torch.manual_seed(4)
    model = Model()
    sink = hooks.MemorySink()
    mon = hooks.attach(model, run="bare-mha", sink=sink, every=1)
    x = torch.randn(B, L, E)
    model(x).sum().backward()
    mon.step(0)
    mon.close()
    got = per_layer(sink)
    with torch.no_grad():
        _, lse = naive_attention(model.blocks[0].attn, x, x, causal(L))
    assert got[0]["attention_z"] == pytest.approx(float(lse.double().square().mean()), rel=1e-4)
    assert set(got[1]) >= INDICATORS
    assert mon.unavailable == {}


def test_outputs_and_gradients_are_bit_identical_and_detach_removes_every_hook() -> None:
    torch.manual_seed(5)
    stack = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(E, H, FF, dropout=0.0, batch_first=True, norm_first=True),
        2,
        enable_nested_tensor=False,
    )
    x = torch.randn(B, L, E)

    def run() -> tuple[torch.Tensor, list[torch.Tensor]]:
        stack.zero_grad(set_to_none=True)
        y = stack(x, mask=causal(L), is_causal=True)
        y.square().mean().backward()
        return y.detach(), [p.grad.clone() for p in stack.parameters() if p.grad is not None]

    y_ref, g_ref = run()
    mon = hooks.attach(stack, run="bits", sink=hooks.MemorySink(), every=1)
    y, g = run()
    assert torch.equal(y, y_ref) and all(torch.equal(a, b) for a, b in zip(g, g_ref))
    mon.step(0)
    mon.close()
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in stack.modules()) == 0
