"""Sixteen model families (dense, MoE, encoder, encoder-decoder, vision, no attention) with the three
README lines and nothing else: every indicator of every layer equals a float64 reference taken
independently of the hooks (within 1e-6 relative), or is listed in ``unavailable`` with its reason;
training is bit-identical with and without the hooks.

The reference: the same model in float64, its branch outputs read by plain forward hooks on the
modules each architecture's source says the residual adds (``tests/hooks/families.py``), the
attention scores read from the eager attention's softmax input (one forward without the monitor),
the router logits from the router. The monitored forward runs the family's own attention
implementation (SDPA where the family has it), also in float64.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hyperwatch import hooks
from tests.hooks.families import ATTENTION_KEYS, HIDDEN, Family, families

FAMILIES = families()
KINDS = {"dense", "moe", "encoder", "encoder-decoder", "vision", "no-attention"}


def test_the_families_cover_every_kind() -> None:
    assert len(FAMILIES) >= 15 and {f.kind for f in FAMILIES.values()} == KINDS


def build(name: str, attn: str | None = None) -> nn.Module:
    family = FAMILIES[name]
    torch.manual_seed(0)
    model = family.build(attn or family.attn)
    with torch.no_grad():  # one channel far out of every branch, so that 5-sigma outliers exist
        for block in family.blocks(model):
            for m in block.modules():
                if isinstance(m, nn.Linear) and m.out_features == HIDDEN:
                    m.weight[5] *= 40.0
                elif type(m).__name__ == "Conv1D" and m.weight.shape[1] == HIDDEN:  # GPT-2's (in, out) linear
                    m.weight[:, 5] *= 40.0
    return model.train()


def outlier_ratio(t: torch.Tensor) -> float:
    mean, std = t.mean(-1, keepdim=True), t.std(-1, correction=0, keepdim=True)
    return float(((t - mean).abs() > 5 * std).double().mean())


def inputs(family: Family, seed: int, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    batch = family.inputs(torch.Generator().manual_seed(seed))
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.items()}


def first(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output


def reference(name: str) -> dict[int, dict[str, float]]:
    """Per layer, every indicator from a float64 forward of the family's eager attention."""
    family = FAMILIES[name]
    model = build(name, "eager").double()
    blocks = family.blocks(model)
    taken: dict[int, dict[str, list[torch.Tensor]]] = {i: {} for i in range(len(blocks))}
    current = [0]
    handles = []

    def keep(layer: int, what: str, scale: float) -> Any:
        return lambda m, a, o: taken[layer].setdefault(what, []).append(first(o).detach() * scale)

    for i, block in enumerate(blocks):
        handles.append(block.register_forward_pre_hook(lambda m, a, i=i: current.__setitem__(0, i)))
        module, scale = family.mlp(block)
        handles.append(module.register_forward_hook(keep(i, "mlp", scale)))
        if family.attention is not None:
            module, scale = family.attention(block)
            handles.append(module.register_forward_hook(keep(i, "attention", scale)))
        if family.router is not None:
            handles.append(family.router(block).register_forward_hook(keep(i, "router", 1.0)))
    softmax = F.softmax

    def scores(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if x.dim() == 4 and "scores" not in taken[current[0]]:  # the decoder's cross-attention comes second
            taken[current[0]]["scores"] = [x.detach()]
        return softmax(x, *args, **kwargs)

    F.softmax = scores
    try:
        model(**inputs(family, 1, torch.float64))
    finally:
        F.softmax = softmax
        for h in handles:
            h.remove()
    out: dict[int, dict[str, float]] = {}
    for i, got in taken.items():
        values: dict[str, float] = {}
        for branch in ("attention", "mlp"):
            if branch in got:
                t = torch.cat([x.reshape(-1, x.shape[-1]) for x in got[branch]])
                values[f"{branch}_rms"] = float(t.square().mean().sqrt())
                values[f"{branch}_outlier_ratio"] = outlier_ratio(t)
        if "scores" in got:
            lse = torch.logsumexp(got["scores"][0], dim=-1)
            values["attention_z"] = float(lse[lse > -1e30].square().mean())
            # per head (dim -2 of the LSE): the max over every query that has a softmax
            per_head = lse.masked_fill(lse <= -1e30, -math.inf).movedim(-2, 0).reshape(lse.shape[-2], -1).amax(1)
            for h, v in enumerate(per_head.tolist()):
                if v > -math.inf:
                    values[f"attention_lse_max.h{h}"] = v
            values["attention_lse_max"] = float(per_head.max())
        if "router" in got:
            logits = torch.cat([x.reshape(-1, x.shape[-1]) for x in got["router"]])
            values["router_z"] = float(torch.logsumexp(logits, -1).square().mean())
            counts = torch.bincount(logits.topk(family.top_k, -1).indices.reshape(-1), minlength=logits.shape[-1])
            values["max_vio"] = float((counts.max() - counts.double().mean()) / counts.double().mean())
        out[i] = values
    return out


def monitored(name: str) -> tuple[dict[int, dict[str, float]], hooks.Monitor]:
    family = FAMILIES[name]
    model = build(name).double()
    sink = hooks.MemorySink()
    mon = hooks.attach(model, run=name.replace("_", "-"), sink=sink, every=1)  # the three README lines
    loss = model(**inputs(family, 1, torch.float64)).loss
    loss.backward()
    mon.step(0, loss=loss)
    mon.close()
    got: dict[int, dict[str, float]] = {}
    for p in sink.points:
        if p.layer is not None:
            got.setdefault(p.layer, {})[p.name] = p.value
    return got, mon


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_indicator_matches_a_float64_reference_or_is_named_unavailable(name: str) -> None:
    family = FAMILIES[name]
    want = reference(name)
    got, mon = monitored(name)
    assert set(mon.unavailable) == family.unavailable, mon.unavailable
    assert all(reason for reason in mon.unavailable.values())
    assert family.notes <= set(mon.notes), mon.notes
    assert sorted(got) == sorted(want)
    for layer, values in want.items():
        expected = set(values) - (ATTENTION_KEYS if family.attention is None else set())
        assert set(got[layer]) == expected, (layer, set(got[layer]) ^ expected)
        for key, value in values.items():
            if key.endswith("outlier_ratio"):
                assert got[layer][key] == value, (layer, key)
            else:
                assert got[layer][key] == pytest.approx(value, rel=1e-6), (layer, key)
    ratios = [v[k] for v in got.values() for k in ("attention_outlier_ratio", "mlp_outlier_ratio") if k in v]
    assert any(r > 0 for r in ratios), "no outlier: the ratio comparison would prove nothing"


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_training_is_bit_identical_with_and_without_hooks(name: str) -> None:
    family = FAMILIES[name]
    plain = build(name)
    watched = copy.deepcopy(plain)
    mon = hooks.attach(watched, run="bits", sink=hooks.MemorySink(), every=1)
    results = []
    for model in (plain, watched):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for step in range(2):  # the traced first forward, then the hooks it chose
            loss = model(**inputs(family, step)).loss
            loss.backward()
            if model is watched:
                mon.step(step, loss=loss)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.detach())
        results.append((losses, [p.detach().clone() for p in model.parameters()]))
    mon.close()
    (losses_a, params_a), (losses_b, params_b) = results
    assert all(torch.equal(a, b) for a, b in zip(losses_a, losses_b))
    assert all(torch.equal(a, b) for a, b in zip(params_a, params_b))
    assert math.isfinite(float(losses_b[-1]))
