"""The data flow of one eager forward, as residual-stream discovery needs it (:mod:`hooks.discovery`).

:class:`Tracer` is a ``TorchFunctionMode`` entered around the model's first logged forward. It
gives every tensor a sequence number and records, for each call, which tensors went in
(:class:`Node`); forward hooks on the modules inside the blocks record which module returned
which tensor, and measure each such output once (sum of squares and 5-sigma outliers), so the
first logged step keeps its values whichever modules turn out to be the branches. It answers
attention calls as :class:`hooks.intercept.AttentionZMode` does (same kernels, same outputs) and
books their LSE to the innermost module that made them.

A residual add is an add of two same-shaped tensors one of which is an ancestor of the other (``x +
f(x)``: the skip and the branch), or an add of such a result and another tensor computed from the
same ``x`` (``x + attn(h) + mlp(h)``, a parallel block's chained adds); at that moment the branch
is walked back to the module outputs it is made of (:meth:`Tracer.contributions`), through what
leaves values as they are or scales them by a constant (dropout, casts, reshapes, ``* c``), and
through adds of branches (parallel attention and MLP). Every tensor is held by a weak reference
only, so the trace keeps no activation alive. Parents have smaller sequence numbers than their
children, so an ancestry search never looks below the skip's number: the cost is the ops of one
block, not the model.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hyperwatch.hooks import indicators, mha
from hyperwatch.hooks.intercept import AttentionZMode, _tensors, guarded

log = logging.getLogger(__name__)

_ADD = {"add", "add_", "__add__", "__radd__", "__iadd__"}
_MUL = {"mul", "mul_", "__mul__", "__rmul__", "__imul__"}
_DIV = {"div", "div_", "__truediv__", "__itruediv__"}
_SAME = {
    "to",
    "type",
    "type_as",
    "float",
    "half",
    "bfloat16",
    "double",
    "contiguous",
    "clone",
    "view",
    "reshape",
    "view_as",
    "reshape_as",
    "dropout",
    "dropout_",
    "alpha_dropout",
    "feature_alpha_dropout",
}
"""Calls whose output is their first tensor input's values (dropout: in expectation; see the note)."""


@dataclass
class Node:
    """One tensor of the trace: what made it and from which tensors (sequence numbers)."""

    parents: tuple[int, ...]
    op: str
    scale: float | None = None  # ``parent * scale`` for a multiplication or division by a number
    attention: nn.Module | None = None  # the module whose attention call made this tensor
    dropout: float = 0.0  # p of a training-mode dropout that made this tensor


@dataclass
class Contribution:
    """What one residual add receives from one module: ``scale * output(module)``."""

    module: nn.Module
    scale: float
    attention: nn.Module | None  # the attention module in the branch, None for an MLP-like branch
    softcapped: bool = False
    dropout: float = 0.0


@dataclass
class ResidualAdd:
    stream: int
    branch: int
    owners: tuple[nn.Module, ...]  # the modules whose forward made the add
    parts: list[Contribution] = field(default_factory=list)
    failure: str | None = None  # why (part of) the branch is not a (scaled) module output


@dataclass
class Measured:
    """Sums of one module's outputs and attention calls during the traced forward."""

    branch: torch.Tensor | None = None  # (2,) float64: sum of squares, 5-sigma outliers
    elements: int = 0
    z: torch.Tensor | None = None  # (2,): sum of LSE^2 over rows with a softmax, and their count
    lse: list[torch.Tensor] = field(default_factory=list)  # the LSEs themselves, for the per-head maxima


class Tracer(AttentionZMode):
    """Records one forward (see the module docstring); ``measured`` modules are those inside blocks."""

    def __init__(
        self, measured: set[nn.Module], chunk_elements: int, on_recompute: Callable[[str], None] | None = None
    ) -> None:
        super().__init__(self._on_lse, chunk_elements, on_recompute, on_error=self._fail)
        self.measured = measured
        self.nodes: list[Node] = []
        self._seq: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}
        self.module_of: dict[int, list[nn.Module]] = {}  # seq -> modules that returned it, inner first
        self.calls: dict[nn.Module, int] = {}
        self.parent: dict[nn.Module, nn.Module] = {}
        self.stack: list[nn.Module] = []
        self._inputs: list[tuple[int, ...]] = []
        self.adds: list[ResidualAdd] = []
        self.roots: dict[int, int] = {}  # the result of a residual add -> the stream it was added to
        self.sums: dict[nn.Module, Measured] = {}
        self.error: BaseException | None = None
        self._attention_made: nn.Module | None = None

    # -- failures: the trace is abandoned, never the forward --
    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
            log.warning("hooks: residual-stream discovery failed (%s: %s)", type(exc).__name__, exc)

    # -- sequence numbers --
    def seq(self, t: torch.Tensor, create: bool = True) -> int | None:
        entry = self._seq.get(id(t))
        if entry is not None and entry[0]() is t:
            return entry[1]
        if not create:
            return None
        return self._new(t, Node((), "input"))

    def _new(self, t: torch.Tensor, node: Node) -> int:
        self.nodes.append(node)
        n = len(self.nodes) - 1
        self._seq[id(t)] = (weakref.ref(t), n)
        return n

    # -- module hooks (registered by the discovery probe on every module while tracing) --
    def pre(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.calls[module] = self.calls.get(module, 0) + 1
        self.stack.append(module)
        self._inputs.append(tuple(s for t in _tensors(args, kwargs) if (s := self.seq(t)) is not None))
        if isinstance(module, nn.MultiheadAttention) and module in self.measured and self.error is None:
            guarded(lambda: self._mha(module, args, kwargs), self._fail)

    def post(self, module: nn.Module, args: Any, output: Any) -> None:
        if not self.stack or self.stack[-1] is not module:
            return
        self.stack.pop()
        inputs = self._inputs.pop()
        if self.error is None:
            guarded(lambda: self._returned(module, inputs, output), self._fail)

    def _returned(self, module: nn.Module, inputs: tuple[int, ...], output: Any) -> None:
        out = output[0] if isinstance(output, (tuple, list)) and output else output
        if not isinstance(out, torch.Tensor):
            return
        n = self.seq(out, create=False)
        if n is None:  # made by a call the mode cannot see (a custom autograd Function, a C++ module)
            n = self._new(out, Node(inputs, "module"))
        if isinstance(module, nn.MultiheadAttention):
            self.nodes[n].attention = module
        self.module_of.setdefault(n, []).append(module)  # hooks run inner first
        if module in self.measured and out.is_floating_point() and out.dim() >= 1 and out.numel() > 0:
            with torch.no_grad():
                m = self.sums.setdefault(module, Measured())
                sums = indicators.branch_sums(out)
                m.branch = sums if m.branch is None else m.branch + sums
                m.elements += out.numel()

    def _mha(self, module: nn.MultiheadAttention, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        with torch.no_grad():
            lse, _ = mha.mha_lse(module, mha.call_arguments(args, kwargs), self.chunk_elements)
            self._book(module, lse)

    # -- attention calls (AttentionZMode's sink) --
    def _on_lse(self, lse: torch.Tensor, every_row_attends: bool) -> None:
        module = self.stack[-1] if self.stack else None
        if module is not None:
            self._book(module, lse)
        self._attention_made = module

    def _book(self, module: nn.Module, lse: torch.Tensor) -> None:
        total, n = indicators.z_sums(lse)
        z = torch.stack([total, n.to(total.dtype)])
        m = self.sums.setdefault(module, Measured())
        m.z = z if m.z is None else m.z + z
        m.lse.append(lse.detach())

    # -- every call --
    def __torch_function__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        self._attention_made = None
        out = super().__torch_function__(func, types, args, kwargs)
        if self.error is None:
            guarded(lambda: self._record(func, args, kwargs, out), self._fail)
        return out

    def _record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        name = getattr(func, "__name__", "")
        ins = _tensors(args, kwargs)
        outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, torch.Tensor)]
        if not outs:
            return
        parents = tuple(s for t in ins if (s := self.seq(t)) is not None)
        skip = None
        if name in _ADD and len(ins) == 2 and ins[0].shape == ins[1].shape == outs[0].shape:
            skip = self._skip(parents)
        node = Node(parents, name, scale=_scale(name, args, ins), attention=self._attention_made)
        if name.startswith("dropout") or name.endswith("dropout"):
            p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
            training = args[2] if len(args) > 2 else kwargs.get("training", True)
            node.dropout = float(p) if training else 0.0
        inplace = (name.endswith("_") and not name.endswith("__")) or name.startswith("__i")
        for o in outs:
            if inplace or not any(o is t for t in ins):
                self._new(o, node)  # an in-place op makes a new version of its input: a new node
            # else: an input returned as it is (``.to`` its own dtype, dropout in eval): the same node
        if skip is not None:
            self._residual(*skip)
            made = self.seq(outs[0], create=False)
            if made is not None:
                self.roots[made] = skip[0]

    def _skip(self, parents: tuple[int, ...]) -> tuple[int, int] | None:
        """(skip, branch) of an add whose one operand is an ancestor of the other, else None."""
        if len(parents) != 2 or parents[0] == parents[1]:
            return None
        a, b = parents
        for skip, branch in ((a, b), (b, a)):
            source = self._source(skip)  # the skip may be a cast or a view of the stream (fp32 residuals)
            if source == branch:
                return None
            if self.is_ancestor(source, branch):
                return source, branch
        for stream, branch in ((a, b), (b, a)):  # chained adds: (x + attn(h)) + mlp(h), h made from x
            root = self.roots.get(self._source(stream))
            if root is not None and root != branch and self.is_ancestor(root, branch):
                return root, branch
        return None

    def _source(self, n: int) -> int:
        """``n`` before the casts and reshapes that made it (same values, another dtype or view)."""
        node = self.nodes[n]
        while node.op in _SAME and not node.op.startswith("dropout") and len(node.parents) == 1:
            n = node.parents[0]
            node = self.nodes[n]
        return n

    def is_ancestor(self, a: int, b: int) -> bool:
        seen = {b}
        todo = [b]
        while todo:
            n = todo.pop()
            for p in self.nodes[n].parents:
                if p == a:
                    return True
                if p > a and p not in seen:
                    seen.add(p)
                    todo.append(p)
        return False

    def _residual(self, skip: int, branch: int) -> None:
        self.adds.append(ResidualAdd(stream=skip, branch=branch, owners=tuple(self.stack)))

    def resolve(self) -> None:
        """After the forward: walk each residual add's branch back to module outputs (every call
        is counted by then, so a module called more than once per call of its parent is known)."""
        for add in self.adds:
            failures: list[str] = []
            add.parts = self.contributions(add.branch, add.stream, 1.0, 0.0, add.owners, failures)
            add.failure = "; ".join(dict.fromkeys(failures)) or None

    def _single(self, module: nn.Module) -> bool:
        """Called once per call of its parent: its hook sees one branch, not several (ViT runs one
        ``dropout`` module on both of its branches)."""
        parent = self.parent.get(module)
        return self.calls.get(module, 0) <= max(1, self.calls.get(parent, 0) if parent is not None else 1)

    def contributions(
        self, n: int, skip: int, scale: float, dropout: float, owners: tuple[nn.Module, ...], failures: list[str]
    ) -> list[Contribution]:
        """The module outputs tensor ``n`` is made of, with their scale; why a part is none, in ``failures``."""
        node = self.nodes[n]
        for module in reversed(self.module_of.get(n, [])):  # the outermost module that can be hooked
            if self._single(module) and not any(module is m for m in owners):
                attention, softcapped = self._attention_between(n, skip)
                return [Contribution(module, scale, attention, softcapped, dropout)]
        if node.op in _SAME and node.parents:
            return self.contributions(node.parents[0], skip, scale, max(dropout, node.dropout), owners, failures)
        if node.scale is not None and len(node.parents) == 1:
            return self.contributions(node.parents[0], skip, scale * node.scale, dropout, owners, failures)
        if node.op in _ADD and len(node.parents) == 2 and skip not in node.parents:
            return [c for p in node.parents for c in self.contributions(p, skip, scale, dropout, owners, failures)]
        failures.append(
            f"the residual add receives the result of {node.op or 'an unknown call'}, not a module's output"
        )
        return []

    def _attention_between(self, n: int, skip: int) -> tuple[nn.Module | None, bool]:
        """The first attention module met walking back from ``n`` to the skip, and whether its scores
        went through a tanh (logit soft-capping) on the way to the softmax."""
        seen = {n}
        todo = [n]
        while todo:
            k = todo.pop(0)
            node = self.nodes[k]
            if node.attention is not None:
                return node.attention, self._tanh_before(k)
            for p in node.parents:
                if p > skip and p not in seen:
                    seen.add(p)
                    todo.append(p)
        return None, False

    def _tanh_before(self, n: int, depth: int = 8) -> bool:
        todo, seen = [(n, 0)], {n}
        while todo:
            k, d = todo.pop()
            if self.nodes[k].op == "tanh":
                return True
            if d < depth:
                for p in self.nodes[k].parents:
                    if p not in seen:
                        seen.add(p)
                        todo.append((p, d + 1))
        return False


def _scale(name: str, args: tuple[Any, ...], ins: list[torch.Tensor]) -> float | None:
    """The constant of ``t * c``, ``c * t`` or ``t / c`` (c a Python number), else None."""
    if len(ins) != 1:
        return None
    numbers = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
    if len(numbers) != 1:
        return None
    if name in _MUL:
        return float(numbers[0])
    if name in _DIV and args and isinstance(args[0], torch.Tensor) and numbers[0] != 0:
        return 1.0 / float(numbers[0])
    return None
