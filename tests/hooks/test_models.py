"""Adapters on real models: every indicator, every layer; bit-identical training; clean detach."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hyperwatch import hooks
from hyperwatch.hooks.probes import RECOMPUTED_KEY
from tests.hooks.support import HF_FAMILIES, MOE_FAMILIES, bundled_model, hf_model

ATTN = {"attention_z", "attention_rms", "attention_outlier_ratio"}
MLP = {"mlp_rms", "mlp_outlier_ratio"}
MOE = {"router_z", "max_vio"}


def hf_step(model: nn.Module, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    x = torch.randint(0, 96, (2, 12))
    out = model(input_ids=x, labels=x)
    out.loss.backward()
    return out.loss.detach()


def per_layer(sink: hooks.MemorySink, step: int) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for p in sink.points:
        if p.step == step and p.layer is not None:
            out.setdefault(p.layer, {})[p.name] = p.value
    return out


def same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Both missing, or bit-identical."""
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


def hook_count(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.mark.parametrize("family", HF_FAMILIES)
def test_hf_models_report_every_indicator_for_every_layer(family: str) -> None:
    got = {}
    for attn in ("eager", "sdpa"):
        model = hf_model(family, attn)
        sink = hooks.MemorySink()
        mon = hooks.attach(model, run=f"{family}-{attn}", sink=sink, every=1)
        loss = hf_step(model)
        mon.step(0, loss=loss, lr=1e-3, tokens=24)
        mon.close()
        layers = per_layer(sink, 0)
        expected = ATTN | MLP | (MOE if family in MOE_FAMILIES else set())
        assert sorted(layers) == [0, 1]
        for values in layers.values():
            assert expected <= set(values), expected - set(values)
            assert all(math.isfinite(v) for v in values.values())
        assert sink.values("loss")[0] == pytest.approx(float(loss))
        # GPT-2 trains with attention dropout: on CPU SDPA itself runs the math backend, so the
        # LSE is recomputed (the costly path), and that is reported.
        costly = family == "gpt2" and attn == "sdpa"
        assert mon.unavailable == {}
        assert (RECOMPUTED_KEY in mon.notes) == costly, mon.notes
        assert sink.runs[0].name == f"{family}-{attn}" and sink.statuses == ["finished"]
        got[attn] = layers
    # Two independent paths to attention Z: LSE of the eager softmax input vs chunked SDPA scores.
    for layer in (0, 1):
        assert got["eager"][layer]["attention_z"] == pytest.approx(got["sdpa"][layer]["attention_z"], rel=1e-4)


@pytest.mark.parametrize("family", ["llama", "mixtral"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_outputs_and_gradients_bit_identical_and_detach_removes_every_hook(family: str, attn: str) -> None:
    model = hf_model(family, attn)
    before = hook_count(model)
    loss_ref = hf_step(model)
    grads_ref = [p.grad for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    mon = hooks.attach(model, run="bits", sink=hooks.MemorySink(), every=1)
    assert hook_count(model) > before
    loss = hf_step(model)
    assert torch.equal(loss, loss_ref)
    for p, g in zip(model.parameters(), grads_ref):
        assert same(p.grad, g)
    mon.step(0, loss=loss)
    mon.close()
    assert hook_count(model) == before


def test_bundled_models_bit_identical_and_detach_restores_flags() -> None:
    for moe in (False, True):
        model: Any = bundled_model(moe=moe)
        x = torch.randint(0, 64, (2, 16))
        ref = model(x, x).loss
        ref.backward()
        grads = [p.grad for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        mon = hooks.attach(model, run="b", sink=hooks.MemorySink(), every=1)
        assert model.blocks[0].attn.capture_lse
        out = model(x, x).loss
        out.backward()
        assert torch.equal(out, ref)
        assert all(same(p.grad, g) for p, g in zip(model.parameters(), grads))
        mon.close()
        assert hook_count(model) == 0
        assert not model.blocks[0].attn.capture_lse
        assert not getattr(model.blocks[0].mlp, "capture", False)


def test_bundled_indicators_equal_naive_references() -> None:
    model: Any = bundled_model(moe=True)
    captured: dict[str, list[torch.Tensor]] = {"attn": [], "mlp": [], "logits": [], "counts": []}
    model.blocks[1].attn.register_forward_hook(lambda m, a, o: captured["attn"].append(o.detach()))
    model.blocks[1].mlp.register_forward_hook(lambda m, a, o: captured["mlp"].append(o.detach()))

    def keep(m: Any, a: object, o: object) -> None:
        captured["logits"].append(m.router_logits)
        captured["counts"].append(m.counts)

    model.blocks[1].mlp.register_forward_hook(keep)
    sink = hooks.MemorySink()
    mon = hooks.attach(model, run="b", sink=sink, every=1)
    torch.manual_seed(0)
    for _ in range(2):  # two micro-batches of one logged step
        x = torch.randint(0, 64, (2, 16))
        model(x, x).loss.backward()
    mon.step(0)
    mon.close()
    got = per_layer(sink, 0)[1]
    a, m = torch.cat(captured["attn"]).double(), torch.cat(captured["mlp"]).double()
    assert got["attention_rms"] == pytest.approx(float(a.square().mean().sqrt()), rel=1e-5)
    assert got["mlp_rms"] == pytest.approx(float(m.square().mean().sqrt()), rel=1e-5)
    for name, t in (("attention_outlier_ratio", a), ("mlp_outlier_ratio", m)):
        mu, sd = t.mean(-1, keepdim=True), t.std(-1, correction=0, keepdim=True)
        assert got[name] == pytest.approx(float(((t - mu).abs() > 5 * sd).double().mean()), abs=1e-12)
    logits = torch.cat(captured["logits"]).double()
    assert got["router_z"] == pytest.approx(float(torch.logsumexp(logits, -1).square().mean()), rel=1e-5)
    from hyperwatch.trainer.moe import max_vio

    assert got["max_vio"] == pytest.approx(float(max_vio(torch.stack(captured["counts"]).sum(0))), rel=1e-6)


def test_bundled_kernel_lse_equals_intercepted_sdpa_scores() -> None:
    """Attention Z from the kernel's own LSE equals the intercepted SDPA path's, both when the CPU
    flash kernel answers the call and when the math backend runs (the LSE recomputed from q, k)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    patterns = {"attention": "blocks.*.attn", "mlp": "blocks.*.mlp"}
    runs: list[tuple[str, dict[str, Any], SDPBackend | None]] = [
        ("auto", {}, None),
        ("sdpa", patterns, None),
        ("sdpa", patterns, SDPBackend.MATH),
    ]
    results = []
    for kernel, kwargs, backend in runs:
        model: Any = bundled_model(kernel=kernel)
        sink = hooks.MemorySink()
        mon = hooks.attach(model, run="k", sink=sink, every=1, **kwargs)
        x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
        if backend is None:
            model(x, x).loss.backward()
        else:
            with sdpa_kernel(backend):
                model(x, x).loss.backward()
        mon.step(0)
        mon.close()
        results.append(per_layer(sink, 0))
    assert model.blocks[0].attn.kernel_path == "sdpa_fallback"
    for layer in (0, 1):
        for other in results[1:]:
            assert results[0][layer]["attention_z"] == pytest.approx(other[layer]["attention_z"], rel=1e-4)


class HandAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class HandModel(nn.Module):
    """A hand-written GPT whose modules follow no known naming."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 32)
        self.mixers = nn.ModuleList(HandAttention(32, 4) for _ in range(3))
        self.convs = nn.ModuleList(nn.Linear(32, 32) for _ in range(3))
        self.head = nn.Linear(32, 50)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for mix, ff in zip(self.mixers, self.convs):
            x = x + mix(x)
            x = x + ff(x)
        return self.head(x)


def test_pattern_adapter_on_a_hand_written_sdpa_model_and_unavailable_report() -> None:
    model = HandModel()
    # No names to go by: the sibling lists are zipped into layers, and what each residual add
    # receives (a mixer's or a conv's output, added in the model's own forward) is discovered.
    sink = hooks.MemorySink()
    mon = hooks.attach(model, run="h", sink=sink, every=1)
    idx = torch.randint(0, 50, (2, 10))
    model(idx).sum().backward()
    mon.step(0)
    mon.close()
    found = per_layer(sink, 0)
    assert sorted(found) == [0, 1, 2] and all(set(v) >= ATTN | MLP for v in found.values()), found
    assert mon.unavailable == {}
    assert [s.attention for s in mon.plan.layers] == list(model.mixers)
    assert [s.mlp for s in mon.plan.layers] == list(model.convs)
    with pytest.raises(hooks.AdapterError, match="matches no module"):
        hooks.attach(model, run="h", sink=hooks.MemorySink(), attention="*.attn")
    sink = hooks.MemorySink()
    mon = hooks.attach(model, run="h", sink=sink, every=1, attention="mixers.*", mlp="convs.*")
    model(idx).sum().backward()
    mon.step(0)
    mon.close()
    layers = per_layer(sink, 0)
    assert layers.keys() == found.keys()  # the globs name the same modules
    for layer, values in layers.items():
        assert values == pytest.approx(found[layer], rel=1e-7)
    # A module that calls no attention function: attention Z is reported unavailable, once per layer.
    sink = hooks.MemorySink()
    mon = hooks.attach(model, run="h", sink=sink, every=1, attention="convs.*")
    model(idx).sum().backward()
    mon.step(0)
    mon.close()
    assert set(mon.unavailable) == {"attention_z@0", "attention_z@1", "attention_z@2"}
    assert [s.attention for s in mon.plan.layers] == list(model.convs)  # the glob stands
    assert "attention_z" not in {p.name for p in sink.points}


def test_disarmed_steps_emit_nothing_and_eval_forwards_are_not_counted() -> None:
    model = hf_model("llama")
    sink = hooks.MemorySink()
    mon = hooks.attach(model, run="e", sink=sink, every=3, weights=True)
    for step in range(7):
        hf_step(model, seed=step)
        with torch.no_grad():  # a validation pass between steps is not training
            model(input_ids=torch.randint(0, 96, (1, 8)))
        mon.step(step, loss=1.0, tokens=24 * (step + 1))
        if step == 4:
            mon.log(step, {"val_loss": 2.5, "user.bleu": math.nan}, tokens=120)
    mon.close()
    steps = sorted({p.step for p in sink.points if p.name == "attention_z"})
    assert steps == [0, 3, 6]
    assert sink.values("val_loss")[4] == 2.5 and math.isnan(sink.values("user.bleu")[4])
    assert sink.values("tokens")[3] == 96.0
    assert any(p.name.startswith("weight_norm.attention.q_proj") for p in sink.points)
    # the weights are snapshotted before every logged step (at attach for the first one)
    ratios = [p for p in sink.points if p.name.startswith("update_ratio.")]
    assert ratios and {p.step for p in ratios} == {0, 3, 6}
    assert all(p.value == 0.0 for p in ratios)  # no optimizer here: the weights did not move


@pytest.mark.parametrize("moe", [False, True])
def test_hooks_exist_only_on_logged_steps(moe: bool) -> None:
    """Disarmed steps run the model's hook-free path: no hook registered, no capture flag set."""
    model: Any = bundled_model(moe=moe)
    mon = hooks.attach(model, run="d", sink=hooks.MemorySink(), every=3)
    x = torch.randint(0, 64, (2, 16))
    armed = []
    for step in range(7):
        armed.append((hook_count(model) > 0, model.blocks[0].attn.capture_lse))
        model(x, x).loss.backward()
        mon.step(step)
    mon.close()
    assert armed == [(s % 3 == 0, s % 3 == 0) for s in range(7)]
    assert not getattr(model.blocks[1].mlp, "capture", False)


def test_attach_validates_its_arguments() -> None:
    model = hf_model("llama")
    with pytest.raises(ValueError, match="every"):
        hooks.attach(model, run="x", sink=hooks.MemorySink(), every=0)
    with pytest.raises(hooks.SchemaError, match="run"):
        hooks.attach(model, run="bad name!", sink=hooks.MemorySink())
    with pytest.raises(hooks.SinkError, match="unknown"):
        hooks.attach(model, run="x", sink=hooks.MemorySink(), colour="red")
    with pytest.raises(hooks.SinkError, match="not a sink"):
        hooks.attach(model, run="x", sink=42)  # type: ignore[arg-type]
    mon = hooks.attach(model, run="x", sink=hooks.MemorySink())
    with pytest.raises(ValueError, match="step"):
        mon.step(-1)
    with pytest.raises(hooks.SchemaError, match="unknown metric"):
        mon.log(0, {"vall_loss": 1.0})
    mon.close()
    assert hook_count(model) == 0
