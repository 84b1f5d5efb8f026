"""Adapters: where, in a given model, are each layer's attention, MLP/MoE and router modules.

An adapter only *finds* modules; :mod:`hooks.probes` measures them. Families:

- ``bundled``: this project's ``trainer.model.Transformer`` (``model.blocks[i].attn`` with
  ``capture_lse``, ``.mlp`` an MLP or a ``MoE`` with ``capture``/``counts``/``aux_loss``).
  Recognized by those attributes, without importing the trainer.
- ``layers``: any other model. Its blocks are the elements of its outermost ``nn.ModuleList``
  containers and ``nn.Sequential`` containers of one module class (sibling lists of equal length, e.g.
  ``mixers`` and ``ffns``, are zipped into one layer each; an encoder's and a decoder's lists
  are numbered one after the other). Inside each block the branches are first guessed by name
  (an attention child ``self_attn``, ``attn``, ``attention``...; an MLP child ``mlp``,
  ``feed_forward``, ``block_sparse_moe``...; an MoE router is the MLP's ``gate``/``router``
  child), then, on the first logged eager forward, replaced by what the residual stream
  actually receives (:mod:`hooks.discovery`). Attention Z comes from intercepting the attention
  call (:mod:`hooks.intercept`). A model without such blocks is still monitored: run-level
  values, and every per-layer indicator listed as unavailable with the fix.
- ``torch``: PyTorch's own ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer``
  (alone, in ``nn.TransformerEncoder``/``nn.TransformerDecoder``/``nn.Transformer`` or any
  container; ``batch_first`` and ``norm_first`` either way), numbered in module order (encoder
  layers before decoder layers). The branch outputs added to the residual stream are the outputs
  of ``dropout1`` (self-attention) and ``dropout2`` (encoder) / ``dropout3`` (decoder) after
  ``linear2``: hooks on those modules see exactly what is added, before or after the norm.
  Attention Z is the self-attention's, recomputed by :mod:`hooks.mha`. A decoder layer's
  cross-attention (``multihead_attn``) is not folded into its layer's indicators (mixing two
  attentions into one Z would hide either); it is listed as unavailable with how to measure it.
- ``pattern``: the user names modules by glob over qualified names
  (``attention="*.attn", mlp="*.mlp", router="*.mlp.gate"``); the i-th match is layer i.
  With ``adapter="auto"`` a glob overrides only its own branch: the others stay auto-detected.

What an adapter cannot find is returned in :attr:`ModelPlan.unavailable` with the reason and
the fix, so the monitor reports it once instead of leaving a silent gap.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from hyperwatch.hooks import mha
from hyperwatch.hooks.heads import find_output_head

ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention", "attn_layer")
MLP_NAMES = ("mlp", "block_sparse_moe", "feed_forward", "ffn", "moe", "mlp_layer")
ROUTER_NAMES = ("gate", "router")


class AdapterError(ValueError):
    """The model's layers could not be found; the message says how to name them."""


@dataclass
class LayerSpec:
    index: int
    attention: nn.Module | None = None  # whose attention call gives attention Z
    mlp: nn.Module | None = None
    router: nn.Module | None = None
    n_experts: int = 0
    top_k: int = 0
    bundled: bool = False  # attention has capture_lse / mlp may be the bundled MoE
    attention_output: nn.Module | None = None  # whose output is the attention branch (default: attention)
    mha: bool = False  # attention is an nn.MultiheadAttention: Z recomputed by hooks.mha
    blocks: tuple[nn.Module, ...] = ()  # the block module(s) of this layer, where discovery looks
    attention_scale: float = 1.0  # the residual receives scale * output (e.g. Granite's residual_multiplier)
    mlp_scale: float = 1.0

    def expected(self) -> list[str]:
        """The indicators this layer's modules should give on a logged step."""
        names = list(BRANCH_KEYS["attention"]) if self.attention is not None else []
        names += list(BRANCH_KEYS["mlp"]) if self.mlp is not None else []
        if self.router is not None:
            names += ["router_z"] + (["max_vio"] if self.n_experts > 0 else [])
        return names


@dataclass
class ModelPlan:
    family: str
    layers: list[LayerSpec]
    unavailable: dict[str, str] = field(default_factory=dict)  # "metric[@layer]" -> reason and fix
    notes: dict[str, str] = field(default_factory=dict)  # how values are obtained, stored in the run config
    discover: bool = False  # refine the branches on the first logged forward (hooks.discovery)
    fixed: frozenset[str] = frozenset()  # branches named by globs: discovery leaves them as they are
    output: nn.Module | None = None  # the LM head, whose logits give output_z (hooks.heads)


BRANCH_KEYS = {
    "attention": ("attention_z", "attention_rms", "attention_outlier_ratio"),
    "mlp": ("mlp_rms", "mlp_outlier_ratio"),
}


def branch_gaps(spec: LayerSpec, reason: str, mlp_reason: str | None = None) -> dict[str, str]:
    """Every indicator key of the branches ``spec`` lacks (outlier ratios included), with the reason."""
    out: dict[str, str] = {}
    if spec.attention is None and spec.attention_output is None:
        out.update({f"{k}@{spec.index}": reason for k in BRANCH_KEYS["attention"]})
    elif spec.attention is None:
        out[f"attention_z@{spec.index}"] = reason
    if spec.mlp is None:
        out.update({f"{k}@{spec.index}": mlp_reason or reason for k in BRANCH_KEYS["mlp"]})
    return out


def _int_attr(*objs: Any, names: tuple[str, ...]) -> int:
    for obj in objs:
        for name in names:
            value = getattr(obj, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return 0


def router_size(router: nn.Module, mlp: nn.Module | None, model: nn.Module) -> tuple[int, int]:
    """(routed experts, experts per token) of a router, from its attributes or the model config."""
    config = getattr(model, "config", None)
    n = _int_attr(router, mlp, names=("num_experts", "n_experts", "n_routed_experts", "out_features"))
    if n == 0:
        weight = getattr(router, "weight", None)
        if weight is not None and getattr(weight, "ndim", 0) == 2:
            n = int(weight.shape[0])
    if n == 0:
        n = _int_attr(config, names=("num_local_experts", "num_experts"))
    k = _int_attr(router, mlp, config, names=("top_k", "num_experts_per_tok", "moe_top_k"))
    return n, k


def _is_bundled(model: nn.Module) -> bool:
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList) or len(blocks) == 0:
        return False
    return all(hasattr(getattr(b, "attn", None), "capture_lse") and hasattr(b, "mlp") for b in blocks)


def bundled_plan(model: nn.Module) -> ModelPlan:
    layers = []
    for i, block in enumerate(model.blocks):  # type: ignore[union-attr, arg-type]
        mlp = block.mlp
        moe = hasattr(mlp, "capture") and hasattr(mlp, "counts")
        spec = LayerSpec(index=int(getattr(block, "layer_idx", i)), attention=block.attn, mlp=mlp, bundled=True)
        if moe:
            spec.router = mlp
            spec.n_experts = int(mlp.n_experts)
            spec.top_k = int(mlp.top_k)
        layers.append(spec)
    return ModelPlan("bundled", layers)


def child_named(module: nn.Module, names: tuple[str, ...], contains: tuple[str, ...] = ()) -> nn.Module | None:
    children = dict(module.named_children())
    for name in names:
        if isinstance(children.get(name), nn.Module):
            return children[name]
    for name, child in children.items():
        if any(c in name.lower() for c in contains):
            return child
    return None


def _inside(name: str, outer: str) -> bool:
    return outer == "" or name.startswith(outer + ".")


def find_blocks(model: nn.Module) -> list[tuple[nn.Module, ...]]:
    """The model's blocks, one tuple per layer (see the module docstring), in module order."""
    lists: list[tuple[str, nn.ModuleList | nn.Sequential]] = []
    for name, m in model.named_modules():
        if not isinstance(m, (nn.ModuleList, nn.Sequential)) or len(m) == 0:
            continue
        if next(m.parameters(), None) is None or (isinstance(m, nn.Sequential) and len({type(c) for c in m}) != 1):
            continue  # a Sequential of mixed layers is one MLP, not a stack (a hybrid's ModuleList may mix)
        if any(_inside(name, outer) and name != outer for outer, _ in lists):
            continue  # inside a block of a list already taken (experts, a stage's sub-blocks)
        lists.append((name, m))
    layers: list[tuple[nn.Module, ...]] = []
    taken: set[str] = set()
    for name, m in lists:
        if name in taken:
            continue
        parent = name.rpartition(".")[0]
        siblings = [(n, o) for n, o in lists if n not in taken and n.rpartition(".")[0] == parent and len(o) == len(m)]
        taken.update(n for n, _ in siblings)
        layers += list(zip(*(list(o) for _, o in siblings)))
    return layers


def layers_plan(model: nn.Module) -> ModelPlan:
    """Blocks by structure, branches guessed by name (refined by discovery on the first forward)."""
    module = type(model).__module__
    family = "hf" if module.startswith("transformers.") else "layers"
    blocks = find_blocks(model)
    plan = ModelPlan(family, [], discover=True)
    if not blocks:
        plan.discover = False
        reason = (
            f"{type(model).__name__}: found no blocks (an nn.ModuleList or nn.Sequential of one module class), so no "
            "per-layer indicator; loss, grad_norm and the other run-level values are recorded. Name the branches "
            "with hooks.attach(..., attention='<glob>', mlp='<glob>')"
        )
        plan.unavailable = {k: reason for keys in BRANCH_KEYS.values() for k in keys}
        return plan
    for i, group in enumerate(blocks):
        spec = LayerSpec(index=i, blocks=group)
        for block in group:
            spec.attention = spec.attention or child_named(block, ATTENTION_NAMES, ("attn", "attention"))
            spec.mlp = spec.mlp or child_named(block, MLP_NAMES, ("mlp", "ffn", "moe", "feed_forward"))
        if spec.mlp is not None:
            router = child_named(spec.mlp, ROUTER_NAMES)
            if router is not None:
                spec.router = router
                spec.n_experts, spec.top_k = router_size(router, spec.mlp, model)
        plan.unavailable.update(
            branch_gaps(
                spec,
                f"block {i} has no child named like an attention ({list(ATTENTION_NAMES)}) or an MLP "
                f"({list(MLP_NAMES)}); name it with hooks.attach(..., attention='<glob>', mlp='<glob>')",
            )
        )
        plan.layers.append(spec)
    return _note_mha(plan)


TORCH_LAYERS = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)


TorchLayer = nn.TransformerEncoderLayer | nn.TransformerDecoderLayer


def _torch_layers(model: nn.Module) -> list[tuple[str, TorchLayer]]:
    """PyTorch transformer layers of ``model`` in module order (outermost only)."""
    found = [(n, m) for n, m in model.named_modules() if isinstance(m, TORCH_LAYERS)]
    return [(n, m) for n, m in found if not any(n != o and n.startswith(o + ".") for o, _ in found if o)]


def torch_plan(model: nn.Module) -> ModelPlan:
    """Layers made of ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer``."""
    layers = _torch_layers(model)
    if not layers:
        raise AdapterError(f"{type(model).__name__}: holds no nn.TransformerEncoderLayer/nn.TransformerDecoderLayer")
    plan = ModelPlan("torch", [])
    decoders = []
    for i, (name, layer) in enumerate(layers):
        spec = LayerSpec(index=i, attention=layer.self_attn, attention_output=layer.dropout1, mha=True)
        decoder = isinstance(layer, nn.TransformerDecoderLayer)
        spec.mlp = layer.dropout3 if isinstance(layer, nn.TransformerDecoderLayer) else layer.dropout2
        plan.layers.append(spec)
        if decoder:
            decoders.append(name or type(layer).__name__)
    _note_mha(plan)
    if decoders:
        plan.unavailable["cross_attention"] = (
            f"the cross-attention (multihead_attn) of the decoder layers {decoders[:4]}"
            f"{'...' if len(decoders) > 4 else ''} is not measured: attention_z, attention_rms and "
            "attention_outlier_ratio are their self-attention's; to watch the cross-attention instead, pass "
            "hooks.attach(..., attention='*.multihead_attn')"
        )
    return plan


def _matches(model: nn.Module, pattern: str, field_name: str) -> list[nn.Module]:
    if not isinstance(pattern, str) or not pattern:
        raise AdapterError(f"{field_name}: must be a non-empty glob over module names, e.g. '*.attn'")
    names = [name for name, _ in model.named_modules() if name and fnmatch.fnmatchcase(name, pattern)]
    # '*' crosses dots, so "blocks.*" also matches "blocks.0.q_proj": keep the outermost matches only.
    outer = [n for n in names if not any(n.startswith(o + ".") for o in names if o != n)]
    modules = dict(model.named_modules())
    found = [modules[n] for n in outer]
    if not found:
        names = [n for n, _ in model.named_modules() if n][:12]
        raise AdapterError(
            f"{field_name}={pattern!r} matches no module; module names look like {names}; "
            "fix the glob ('*' matches across dots)"
        )
    return found


def pattern_plan(
    model: nn.Module,
    attention: str | None,
    mlp: str | None,
    router: str | None,
    top_k: int | None = None,
) -> ModelPlan:
    """Layers from user globs; the i-th (outermost) match of each pattern belongs to layer i."""
    attn_mods = _matches(model, attention, "attention") if attention is not None else []
    mlp_mods = _matches(model, mlp, "mlp") if mlp is not None else []
    router_mods = _matches(model, router, "router") if router is not None else []
    if not (attn_mods or mlp_mods or router_mods):
        raise AdapterError("attention, mlp, router: give at least one glob to measure")
    n_layers = max(len(attn_mods), len(mlp_mods), len(router_mods))
    plan = ModelPlan("pattern", [LayerSpec(index=i) for i in range(n_layers)])
    for i, m in enumerate(attn_mods):
        plan.layers[i].attention = m
    for i, m in enumerate(mlp_mods):
        plan.layers[i].mlp = m
    for i, m in enumerate(router_mods):
        spec = plan.layers[i]
        spec.router = m
        spec.n_experts, k = router_size(m, spec.mlp, model)
        spec.top_k = top_k if top_k is not None else k
    if attention is None:
        plan.unavailable.update(
            dict.fromkeys(
                BRANCH_KEYS["attention"], "no attention glob given; pass hooks.attach(..., attention='<glob>')"
            )
        )
    if mlp is None:
        plan.unavailable.update(
            dict.fromkeys(BRANCH_KEYS["mlp"], "no mlp glob given; pass hooks.attach(..., mlp='<glob>')")
        )
    return _note_mha(plan)


def _auto_plan(model: nn.Module) -> ModelPlan:
    if _is_bundled(model):
        return bundled_plan(model)
    if _torch_layers(model):
        return torch_plan(model)
    return layers_plan(model)


def _override(plan: ModelPlan, patterns: ModelPlan, attention: str | None, mlp: str | None, router: str | None) -> None:
    """Replace the branches named by a glob in ``plan`` (auto-detected) with the glob's matches."""
    given = {"attention": attention, "mlp": mlp, "router": router}
    for branch, glob in given.items():
        if glob is None:
            continue
        matched = [s for s in patterns.layers if getattr(s, branch) is not None]
        if len(matched) != len(plan.layers):
            raise AdapterError(
                f"{branch}={glob!r} matches {len(matched)} modules but the {plan.family} adapter found "
                f"{len(plan.layers)} layers; make the glob match one module per layer, or pass "
                "adapter='pattern' to use globs alone"
            )
        for spec, src in zip(plan.layers, matched):
            if branch == "attention":
                spec.attention, spec.attention_output, spec.mha = src.attention, None, src.mha
                spec.bundled = False  # a named module is intercepted, whatever the model
            elif branch == "mlp":
                spec.mlp = src.mlp
            else:
                spec.router, spec.n_experts, spec.top_k = src.router, src.n_experts, src.top_k
        prefixes = {**BRANCH_KEYS, "router": ("router_z", "max_vio")}
        for key in [k for k in plan.unavailable if k.split("@")[0] in prefixes[branch]]:
            del plan.unavailable[key]
        if branch == "attention":
            plan.unavailable.pop("cross_attention", None)
    _note_mha(plan)
    plan.family += "+pattern"
    plan.fixed = frozenset(b for b, g in given.items() if g is not None)
    if {"attention", "mlp"} <= plan.fixed:
        plan.discover = False


def _note_mha(plan: ModelPlan) -> ModelPlan:
    """Mark nn.MultiheadAttention modules for :mod:`hooks.mha` and record how their Z is obtained."""
    plan.notes.pop("attention_z_source", None)
    for spec in plan.layers:
        spec.mha = isinstance(spec.attention, nn.MultiheadAttention) and not spec.bundled
        if spec.mha:
            plan.notes["attention_z_source"] = mha.RECOMPUTED
    return plan


def discover(
    model: nn.Module,
    adapter: str = "auto",
    attention: str | None = None,
    mlp: str | None = None,
    router: str | None = None,
    top_k: int | None = None,
) -> ModelPlan:
    """The plan for ``model``.

    ``adapter="auto"``: the bundled model, else PyTorch's transformer layers, else the model's
    blocks (never an error: what cannot be found is listed in ``unavailable``); a glob given for
    one branch replaces that branch only, the others stay auto-detected (when no block is found,
    the globs alone make the plan). ``adapter="pattern"``: globs only.
    """
    if adapter not in ("auto", "bundled", "torch", "layers", "pattern"):
        raise AdapterError(f"adapter: unknown {adapter!r}; use 'auto', 'bundled', 'torch', 'layers' or 'pattern'")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise AdapterError(f"top_k: must be a positive integer (experts per token), got {top_k!r}")
    patterns_given = any(p is not None for p in (attention, mlp, router))
    if adapter == "pattern":
        plan = pattern_plan(model, attention, mlp, router, top_k)
        plan.output = find_output_head(model)
        return plan
    if adapter == "bundled" and not _is_bundled(model):
        raise AdapterError("adapter='bundled': the model has no .blocks with .attn.capture_lse; use adapter='auto'")
    if adapter == "bundled":
        plan = bundled_plan(model)
    elif adapter == "torch":
        plan = torch_plan(model)
    elif adapter == "layers":
        plan = layers_plan(model)
    else:
        plan = _auto_plan(model)
        if patterns_given and not plan.layers:
            plan = pattern_plan(model, attention, mlp, router, top_k)
            plan.output = find_output_head(model)
            return plan
    if patterns_given:
        _override(plan, pattern_plan(model, attention, mlp, router, top_k), attention, mlp, router)
    if top_k is not None:
        for spec in plan.layers:
            if spec.router is not None and not spec.bundled:
                spec.top_k = top_k
    plan.output = find_output_head(model)
    return plan
