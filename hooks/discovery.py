"""Branches found by what the residual stream receives, on the first logged forward.

Names lie: Gemma 2 normalizes the attention output before adding it (``post_attention_layernorm``),
BERT adds inside ``attention.output`` and normalizes after the add, T5 adds a dropout of a child of
a child, Falcon and GPT-NeoX add attention and MLP together, Mamba has no attention at all. So the
monitor does not guess the branches from names alone: :class:`DiscoveryProbe` traces the first
logged eager forward (:class:`hooks.tracer.Tracer`), takes each residual add inside a block (an
add of ``x`` and a tensor computed from ``x``), and hooks the module whose output the residual
receives (with the constant it is multiplied by, if any). A branch with an attention call in it
is the attention branch (its Z comes from the module that made the call); the others are MLP-like
(an MLP, an MoE with or without shared experts, a Mamba mixer). Pre-norm, post-norm, sandwich
norms, parallel blocks and encoder-decoder stacks all come out of the same rule.

What is discovered replaces the adapter's guesses by name; globs given to ``hooks.attach`` still
override. The traced forward itself is measured: the tracer keeps the sums of every module output
inside the blocks and books them to the branches it finds, so the first logged step has its
values. A compiled model's first logged step runs eagerly for the trace (:mod:`hooks.compiled`),
so discovery works whatever the order of compile and attach; only where no stance can make the
forward eager (a forward being traced by dynamo) is nothing discovered, and the adapter's plan by
names stays.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from hyperwatch.hooks import compiled
from hyperwatch.hooks.accumulate import Accumulator
from hyperwatch.hooks.adapters import ROUTER_NAMES, LayerSpec, ModelPlan, branch_gaps, child_named, router_size
from hyperwatch.hooks.intercept import guarded
from hyperwatch.hooks.probes import RECOMPUTED_KEY, Gate, Note, Probe, Report, recompute_note
from hyperwatch.hooks.tracer import Contribution, ResidualAdd, Tracer

log = logging.getLogger(__name__)

Discovered = Callable[[ModelPlan, Tracer], None]


class DiscoveryProbe(Probe):
    """Traces the first logged eager forward of ``model``, then hands the trace to ``done``."""

    keys = ("discovery",)
    during_discovery = True

    def __init__(
        self,
        acc: Accumulator,
        gate: Gate,
        model: nn.Module,
        plan: ModelPlan,
        done: Discovered,
        chunk_elements: int,
        report: Report,
        note: Note,
    ) -> None:
        super().__init__(acc, gate, -1, report)
        self.note = note
        self.model = model
        self.plan = plan
        self.done = done
        self.chunk_elements = chunk_elements
        self.tracer: Tracer | None = None
        self.top: nn.Module | None = None  # the module whose forward is traced
        self._module_handles: list[RemovableHandle] = []
        self.finished = False
        self.skipped = False  # a logged forward was compiled and could not be traced

    def register(self) -> list[RemovableHandle]:
        """Hooks on the model and on every module above its blocks: the outermost one that is called
        is traced (a LightningModule is not called itself: its training_step calls its model)."""
        if self.finished:
            return []
        handles = []
        for m in _above_blocks(self.model, self.plan):
            handles += [m.register_forward_pre_hook(self._pre), m.register_forward_hook(self._post, always_call=True)]
        return handles

    def _pre(self, module: nn.Module, args: Any) -> None:
        if self.finished or self.tracer is not None or not self.live():
            return
        if torch.compiler.is_compiling():  # no stance made this forward eager: the plan by names stays
            self.skipped = True
            return
        if compiled.is_compiled(self.model) or compiled.entered_through_compile():
            self.gate.compiled = True  # the hooks discovery installs must stay for the compiled graphs
        self.top = module
        self.guard(self._start)

    def _start(self) -> None:
        measured = {m for spec in self.plan.layers for b in spec.blocks for m in b.modules()}
        tracer = Tracer(measured, self.chunk_elements, self._on_recompute)
        for parent in self.model.modules():
            for child in parent.children():
                tracer.parent.setdefault(child, parent)
        for m in self.model.modules():
            if m is self.top:
                continue
            self._module_handles += [
                m.register_forward_pre_hook(tracer.pre, with_kwargs=True),
                m.register_forward_hook(tracer.post, always_call=True),
            ]
        self.tracer = tracer
        self.gate.discovering = True
        tracer.__enter__()

    def _on_recompute(self, why: str) -> None:
        tracer = self.tracer
        who = type(tracer.stack[-1]).__name__ if tracer is not None and tracer.stack else "the model"
        self.note(RECOMPUTED_KEY, recompute_note(who, why))

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        tracer = self.tracer
        if tracer is None or module is not self.top:
            return
        self.tracer = None
        self.finished = True
        tracer.__exit__(None, None, None)
        self.gate.discovering = False
        for h in self._module_handles:
            h.remove()
        self._module_handles = []
        self.remove()
        if tracer.error is None:
            guarded(tracer.resolve, tracer._fail)
        if tracer.error is not None:
            self.report(
                "discovery",
                f"residual-stream discovery failed ({type(tracer.error).__name__}: "
                f"{tracer.error}); the branches are the adapter's, found by module names",
            )
        self.guard(lambda: self.done(self.plan, tracer))


def _above_blocks(model: nn.Module, plan: ModelPlan) -> list[nn.Module]:
    """``model`` and every module that holds a block, outermost first."""
    blocks = {id(b) for spec in plan.layers for b in spec.blocks}
    named = list(model.named_modules())
    holders = {""}
    for name, m in named:
        if id(m) in blocks:
            parts = name.split(".")
            holders.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return [m for name, m in named if name in holders and id(m) not in blocks]


def _block_index(plan: ModelPlan) -> dict[nn.Module, int]:
    """Every module inside a layer's blocks -> that layer."""
    out: dict[nn.Module, int] = {}
    for spec in plan.layers:
        for block in spec.blocks:
            for m in block.modules():
                out.setdefault(m, spec.index)
    return out


def _layer_of(add: ResidualAdd, blocks: dict[nn.Module, int]) -> int | None:
    for part in add.parts:
        if part.module in blocks:
            return blocks[part.module]
    for owner in reversed(add.owners):
        if owner in blocks:
            return blocks[owner]
    return None


def refine(plan: ModelPlan, tracer: Tracer, model: nn.Module) -> tuple[ModelPlan, dict[str, str]]:
    """The plan with each traced block's branches replaced by what its residual stream received,
    and notes on how (stored in the run's config)."""
    blocks = _block_index(plan)
    branch_modules = {part.module for add in tracer.adds for part in add.parts}
    adds = [a for a in tracer.adds if not any(o in branch_modules for o in a.owners)]  # skips inside a branch
    per_layer: dict[int, list[ResidualAdd]] = {}
    for add in adds:
        layer = _layer_of(add, blocks)
        if layer is not None:
            per_layer.setdefault(layer, []).append(add)
    names = {m: n.replace("._orig_mod", "") for n, m in model.named_modules()}  # blocks compiled one by one
    layers: list[LayerSpec] = []
    notes: dict[str, str] = {}
    extra_attention: list[str] = []
    unavailable: dict[str, str] = {}
    for spec in plan.layers:
        found = per_layer.get(spec.index)
        if not found:
            layers.append(spec)
            if any(b in tracer.sums or any(b is o for a in tracer.adds for o in a.owners) for b in spec.blocks):
                notes.setdefault(
                    "branches_by_name",
                    f"no residual add was seen in layer {spec.index}; its branches are found by module names",
                )
            continue
        attention: Contribution | None = None
        mlp: Contribution | None = None
        failures = [a.failure for a in found if a.failure]
        named = set(spec.attention.modules()) if spec.attention is not None else set()
        for part in (p for a in found for p in a.parts):
            # An attention branch makes an attention call; one without (a linear attention) is still
            # the attention branch when it comes from the child named like one. A glob's attention
            # is the attention, whatever the others call.
            by_call = part.attention is not None and "attention" not in plan.fixed
            if by_call or part.module in named:
                if attention is None:
                    attention = part
                else:
                    extra_attention.append(names.get(part.module, type(part.module).__name__))
            elif mlp is None:
                mlp = part
        new = replace(spec, attention=None, attention_output=None, mha=False, mlp=None, router=spec.router)
        if attention is not None:
            new.attention, new.attention_output, new.attention_scale = (
                attention.attention,
                attention.module,
                attention.scale,
            )
            new.mha = isinstance(attention.attention, nn.MultiheadAttention)
            if attention.softcapped:
                notes["attention_z_softcapped"] = (
                    "the attention scores go through a tanh soft-cap before the softmax: attention Z is that of the "
                    "capped scores (bounded by the cap), so it cannot show the raw logits growing"
                )
        if mlp is not None:
            new.mlp, new.mlp_scale = mlp.module, mlp.scale
            if new.router is None:
                router = child_named(mlp.module, ROUTER_NAMES)
                if router is not None:
                    new.router = router
                    new.n_experts, new.top_k = router_size(router, mlp.module, model)
        for dropped in (attention, mlp):
            if dropped is not None and dropped.dropout > 0:
                notes["branch_dropout"] = (
                    f"a branch passes through functional dropout (p={dropped.dropout}) before the residual add; its "
                    "RMS and outliers are measured before the dropout"
                )
        if "attention" in plan.fixed:  # named by a glob: the user's choice stands
            new.attention, new.attention_output, new.mha = spec.attention, spec.attention_output, spec.mha
            new.attention_scale = spec.attention_scale
        if "mlp" in plan.fixed:
            new.mlp, new.mlp_scale = spec.mlp, spec.mlp_scale
        if "router" in plan.fixed:
            new.router, new.n_experts, new.top_k = spec.router, spec.n_experts, spec.top_k
        why = "; ".join(dict.fromkeys(f for f in failures if f))
        unavailable.update(branch_gaps(new, *plan_reasons(why)))
        layers.append(new)
    refined = ModelPlan(plan.family + "+residual", layers, dict(plan.unavailable), dict(plan.notes))
    for key in [k for k in refined.unavailable if k.split("@")[0] in _BRANCH_KEYS]:
        reason = refined.unavailable.pop(key)
        index = key.partition("@")[2]
        if index.isdigit() and int(index) not in per_layer:
            unavailable[key] = reason  # the guess by name of a layer the trace did not see
    refined.unavailable.pop("cross_attention", None)
    refined.unavailable.update(_compact(unavailable, len(layers)))
    if extra_attention:
        more = "..." if len(extra_attention) > 4 else ""
        refined.unavailable["cross_attention"] = (
            f"more than one attention branch per block ({extra_attention[:4]}{more}"
            "): attention_z, attention_rms and attention_outlier_ratio are the first one's (the self-attention); "
            "to watch another, pass hooks.attach(..., attention='<glob>')"
        )
    notes["branches"] = _describe(layers, names)
    return refined, notes


_BRANCH_KEYS = {"attention_z", "attention_rms", "attention_outlier_ratio", "mlp_rms", "mlp_outlier_ratio"}


def plan_reasons(why: str) -> tuple[str, str]:
    """(attention, mlp) reasons of a traced layer that lacks the branch."""
    more = f"; {why}" if why else ""
    return (
        "no attention call (torch.nn.functional.scaled_dot_product_attention, or a softmax whose output multiplies "
        f"the values) in what the residual stream receives, so no attention Z there{more}",
        f"the residual stream receives no branch without attention{more}",
    )


def _compact(unavailable: dict[str, str], n_layers: int) -> dict[str, str]:
    """``metric@i`` for every layer with one reason -> ``metric`` once (a 64-layer Mamba lists 5 keys, not 320)."""
    by_metric: dict[str, dict[int, str]] = {}
    for key, reason in unavailable.items():
        metric, _, layer = key.partition("@")
        by_metric.setdefault(metric, {})[int(layer)] = reason
    out: dict[str, str] = {}
    for metric, layers in by_metric.items():
        reasons = set(layers.values())
        if len(layers) == n_layers and len(reasons) == 1:
            out[metric] = f"every layer: {reasons.pop()}"
        else:
            out.update({f"{metric}@{i}": r for i, r in layers.items()})
    return out


def _describe(layers: list[LayerSpec], names: dict[nn.Module, str]) -> str:
    """How layer 0's branches were found, relative to its block, and in how many layers the same holds."""

    def rel(spec: LayerSpec, m: nn.Module | None, scale: float) -> str:
        if m is None:
            return "none"
        name = names.get(m, type(m).__name__)
        for block in spec.blocks:
            prefix = names.get(block, "")
            if prefix and name.startswith(prefix + "."):
                name = "<block>" + name[len(prefix) :]
            elif name == prefix:
                name = "<block>"
        return name + (f" x {scale:g}" if scale != 1.0 else "")

    def describe(spec: LayerSpec) -> str:
        return (
            f"attention = {rel(spec, spec.attention_output or spec.attention, spec.attention_scale)} "
            f"(Z from {rel(spec, spec.attention, 1.0)}); mlp = {rel(spec, spec.mlp, spec.mlp_scale)}"
        )

    if not layers:
        return "no layers"
    first = describe(layers[0])
    same = sum(describe(s) == first for s in layers)
    return f"{first}; the same in {same} of {len(layers)} layers (what each residual add receives)"


def book_trace(acc: Accumulator, spec: LayerSpec, tracer: Tracer, device: torch.device) -> None:
    """Add what the traced forward measured of ``spec``'s branches to the step's sums (the traced
    forward is the step's first one: its values belong to the step)."""
    branch = spec.attention_output if spec.attention_output is not None else spec.attention
    for name, module in (("attention", branch), ("mlp", spec.mlp)):
        m = tracer.sums.get(module) if module is not None else None
        if m is not None and m.branch is not None:
            acc.add_branch_totals(spec.index, name, m.branch.to(device), m.elements)
    z = tracer.sums.get(spec.attention) if spec.attention is not None else None
    if z is not None and z.z is not None:
        acc.add_attention_z_totals(spec.index, z.z.to(device))
        for lse in z.lse:
            acc.add_head_lse_max(spec.index, lse.to(device))
