"""Probes: the module hooks that feed an :class:`~hooks.accumulate.Accumulator`.

In eager mode hooks exist only while a probe is armed (the forwards of a logged step):
:meth:`Probe.arm` registers them and disarming removes them, so on the other steps the modules
run PyTorch's hook-free call path and the capture flags of the bundled model are off: the hooks
cost nothing. Under ``torch.compile`` they stay registered and the :class:`Gate` alone tells the
steps apart (see there): two cached graphs, no recompilation after warm-up.
Every hook first asks the shared :class:`Gate` whether this forward counts: autograd must be
recording (validation passes under ``no_grad`` are not training), and we must not be inside a
backward pass (activation checkpointing re-runs forwards there; counting them would count a
micro-batch twice).

Hooks never modify inputs or outputs and compute under ``no_grad`` on detached tensors, so the
model's outputs and gradients are bit-identical with and without them.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from hyperwatch.hooks import heads, indicators
from hyperwatch.hooks.accumulate import Accumulator, Where
from hyperwatch.hooks.intercept import AttentionZMode, guarded

log = logging.getLogger(__name__)

RECOMPUTED_KEY = "attention_z:recomputed"
"""The note key of intercepted SDPA calls that take the costly recompute path (the value is
measured: a note in the run's config, ``_hyperwatch.notes``, not an unavailable indicator)."""

FAILED = "the hook failed"
"""How a failed probe's reason starts (logged by the probe itself, with the traceback, once per kind)."""

Report = Callable[[str, str], None]
"""report(key, reason): a metric could not be measured; the monitor logs it once."""

Note = Callable[[str, str], None]
"""note(key, text): how a measured value is obtained (a costly path, a caveat); logged once."""


def ignore(key: str, reason: str) -> None:
    return None


def recompute_note(who: str, why: str) -> str:
    return (
        f"costly path: the SDPA call of {who} cannot run on an attention kernel that returns the log-sum-exp "
        f"({why}); attention Z is recomputed from q and k in chunks on logged steps, which can cost as much as "
        "the attention itself. Use bf16/fp16 on CUDA, no attention mask (is_causal=True) and no dropout on CPU "
        "to get it from the kernel"
    )


def _in_backward() -> bool:
    if torch.compiler.is_compiling():  # a compiled forward is never re-run by a backward pass
        return False
    fn = getattr(torch._C, "_current_graph_task_id", None)
    return fn is not None and fn() != -1


class Gate:
    """Whether the current forward is measured.

    ``compiled``: the model is compiled (``hooks.compiled``: found at attach, at a logged step,
    or on discovery's forward) or a hook was traced by dynamo. Dynamo does not guard on module
    hooks, so a graph compiled while they were removed would keep running without them: once
    compiled, the probes keep their hooks registered and a disarmed step is told apart by this
    gate alone. Dynamo guards on ``armed`` (a Python bool), so exactly two graphs exist, logged and unlogged; both are
    cached after warm-up, and the unlogged one contains no hook work at all.
    """

    def __init__(self) -> None:
        self.armed = False
        self.compiled = False
        self.discovering = False  # the discovery trace measures this forward (hooks.discovery)
        self.failures: set[tuple[str, str]] = set()  # (probe class, exception class) already logged

    def active(self) -> bool:
        if torch.compiler.is_compiling():
            self.compiled = True  # a side effect dynamo replays after the graph runs
            return self.armed and torch.is_grad_enabled()
        return self.armed and torch.is_grad_enabled() and not _in_backward()


def _first_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


class Probe:
    """Owns its hook handles, which exist only while armed; ``arm`` also switches capture flags.

    A probe never fails the user's forward: whatever its hook raises is caught (:meth:`guard`),
    reported once under :attr:`key` with the exception, and the probe stops measuring; the
    model's own inputs and outputs are never touched.
    """

    keys: tuple[str, ...] = ("hooks",)
    """The indicators a failure of this probe leaves unmeasured (reported as ``metric@layer``)."""

    during_discovery = False
    """Whether the probe measures the forward that the discovery trace measures (routers do: the
    trace does not replace them)."""

    def __init__(self, acc: Accumulator, gate: Gate, layer: int, report: Report = ignore) -> None:
        self.acc = acc
        self.gate = gate
        self.layer = layer
        # where this probe's layer lives in the accumulator: tensors, so that a compiled graph never
        # specializes on the layer (hooks.accumulate.Where); run-level probes (layer -1) have none
        self.where = acc.where[layer] if 0 <= layer < acc.n_layers else cast(Where, None)
        self.report = report
        self.failed = False
        self.handles: list[RemovableHandle] = []

    def live(self) -> bool:
        """Whether this forward is measured by this probe."""
        return not self.failed and self.gate.active() and (self.during_discovery or not self.gate.discovering)

    def guard(self, fn: Callable[[], Any]) -> Any:
        return guarded(fn, self._failure)

    def _failure(self, exc: BaseException) -> None:
        self.failed = True
        kind = (type(self).__name__, type(exc).__name__)
        if kind not in self.gate.failures:  # one log line per kind of failure, not one per layer
            self.gate.failures.add(kind)
            log.warning(
                "hooks: the %s probe of layer %d failed (%s: %s); it is off for the rest of the run (so is any other "
                "layer's that fails the same way, recorded in the run's 'unavailable' without more log lines); the "
                "forward goes on unchanged",
                self.keys[0],
                self.layer,
                type(exc).__name__,
                exc,
                exc_info=exc,
            )
        for key in self.keys:
            self.report(
                f"{key}@{self.layer}" if self.layer >= 0 else key,
                f"{FAILED} ({type(exc).__name__}: {exc}); the model's forward was left unchanged and this "
                "value is not measured for the rest of the run",
            )

    def register(self) -> list[RemovableHandle]:
        """Register this probe's hooks; called when it is armed."""
        return []

    def set_capture(self, on: bool) -> None:
        """Switch the module's own capture flags (bundled models); none by default."""

    def arm(self, on: bool) -> None:
        if on and not self.handles:
            self.handles = self.register()
        elif not on and not self.gate.compiled:
            self.remove()
        self.set_capture(on)

    def remove(self) -> None:
        """Remove the hooks and capture flags whatever the state (detach)."""
        self.set_capture(False)
        if self.handles:
            for handle in self.handles:
                handle.remove()
            self.handles = []


class OutputHookProbe(Probe, ABC):
    """A probe that measures one module's output from a forward hook: subclasses define ``_measure``."""

    module: nn.Module

    def register(self) -> list[RemovableHandle]:
        return [self.module.register_forward_hook(self._hook)]

    def _hook(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.live():
            self.guard(lambda: self._measure(output))

    @abstractmethod
    def _measure(self, output: Any) -> None:
        """What the probe computes from the hooked module's output (on logged steps only)."""


class BranchProbe(OutputHookProbe):
    """RMS and 5-sigma outliers of a branch output (attention or mlp), from a forward hook."""

    def __init__(
        self, acc: Accumulator, gate: Gate, layer: int, module: nn.Module, branch: str, report: Report = ignore
    ) -> None:
        super().__init__(acc, gate, layer, report)
        self.module = module
        self.branch = branch
        self.keys = (f"{branch}_rms", f"{branch}_outlier_ratio")

    def _measure(self, output: Any) -> None:
        out = _first_tensor(output)
        if out is not None and out.is_floating_point() and out.dim() >= 1 and out.numel() > 0:
            with torch.no_grad():
                self.acc.add_branch(self.where, self.branch, out)


class KernelLseProbe(Probe):
    """Attention Z of the bundled model: the kernel's own LSE (``capture_lse`` -> ``.lse``).

    The bundled attention is always causal without a mask, so every LSE row has a softmax.
    """

    keys = ("attention_z",)

    def __init__(self, acc: Accumulator, gate: Gate, layer: int, module: nn.Module, report: Report) -> None:
        super().__init__(acc, gate, layer, report)
        self.module = module

    def register(self) -> list[RemovableHandle]:
        return [self.module.register_forward_hook(self._hook)]

    def set_capture(self, on: bool) -> None:
        setattr(self.module, "capture_lse", on)  # noqa: B010 (an attribute mypy cannot see)

    def _hook(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.live():
            self.guard(lambda: self._measure(module))

    def _measure(self, module: nn.Module) -> None:
        lse = getattr(module, "lse", None)
        if isinstance(lse, torch.Tensor):
            with torch.no_grad():
                self.acc.add_attention_lse(self.where, lse, every_row_attends=True)
        else:
            self.report(f"attention_z@{self.layer}", "the attention module set capture_lse but kept no .lse")


class InterceptProbe(Probe):
    """Attention Z of any attention module, by intercepting its SDPA or softmax call."""

    keys = ("attention_z",)

    def __init__(
        self,
        acc: Accumulator,
        gate: Gate,
        layer: int,
        module: nn.Module,
        report: Report,
        chunk_elements: int,
        note: Note = ignore,
    ) -> None:
        super().__init__(acc, gate, layer, report)
        self.module = module
        self.note = note
        self.mode = AttentionZMode(self._sink, chunk_elements, self._on_recompute, self._failure)
        self._entered: list[bool] = []

    def register(self) -> list[RemovableHandle]:
        """The post hook is ``always_call`` in eager mode (the mode must be left even when the
        forward raises). Under ``torch.compile`` it is not: a graph that raises replays none of
        the mode's enter, and dynamo would guard on the hook's id in ``_forward_hooks_always_called``,
        a different number in every block, so blocks compiled one by one would not share a graph."""
        self._entered = []
        return [
            self.module.register_forward_pre_hook(self._pre),
            self.module.register_forward_hook(self._post, always_call=not self.gate.compiled),
        ]

    def leave(self) -> None:
        """Leave the mode if a forward that raised left it entered (eager hooks registered before
        the model was found compiled); called by the monitor at each step."""
        while self._entered:
            if self._entered.pop():
                self.mode.__exit__(None, None, None)
                self.mode.end()

    def _sink(self, lse: torch.Tensor, every_row_attends: bool) -> None:
        self.acc.add_attention_lse(self.where, lse, every_row_attends)

    def _on_recompute(self, why: str) -> None:
        """Noted once per model (one key): attention Z is measured, but at the costly path."""
        self.note(RECOMPUTED_KEY, recompute_note(f"{type(self.module).__name__} (layer {self.layer})", why))

    def _pre(self, module: nn.Module, args: Any) -> None:
        enter = self.live() and not any(self._entered)
        self._entered.append(enter)
        if enter:
            self.mode.begin()
            self.mode.__enter__()

    def _post(self, module: nn.Module, args: Any, output: Any) -> None:
        if not self._entered:
            return
        if self._entered.pop():
            self.mode.__exit__(None, None, None)
            self.mode.end()
            if self.mode.seen == 0 and not self.failed:
                self.report(f"attention_z@{self.layer}", self._why_none(module))

    def _why_none(self, module: nn.Module) -> str:
        if self.mode.candidates:
            return (
                f"{type(module).__name__} called a softmax, but no softmax output was multiplied by the values "
                "(a matmul), so none can be told to be the attention's; its attention Z is not measured"
            )
        return (
            f"{type(module).__name__} called neither torch.nn.functional.scaled_dot_product_attention "
            "nor a softmax whose output multiplies the values; its attention Z cannot be intercepted"
        )


class RouterProbe(Probe):
    """Router Z and expert counts of a router module.

    Its output may be the logits (an ``nn.Linear``; the top-k choice is then recomputed from
    them) or a tuple ``(logits, scores, indices)`` as Hugging Face's Top-K routers return.
    """

    keys = ("router_z", "max_vio")
    during_discovery = True

    def __init__(
        self, acc: Accumulator, gate: Gate, layer: int, module: nn.Module, n_experts: int, top_k: int, report: Report
    ) -> None:
        super().__init__(acc, gate, layer, report)
        self.module = module
        self.n_experts = n_experts
        self.top_k = top_k

    def register(self) -> list[RemovableHandle]:
        return [self.module.register_forward_hook(self._hook)]

    def _hook(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.live():
            self.guard(lambda: self._measure(module, output))

    def _measure(self, module: nn.Module, output: Any) -> None:
        logits = _first_tensor(output)
        if logits is None:
            self.report(f"router_z@{self.layer}", f"{type(module).__name__} returned no logits tensor")
            return
        with torch.no_grad():
            logits = logits.reshape(-1, logits.shape[-1])
            self.acc.add_router_logits(self.where, logits)
            indices = None
            if isinstance(output, (tuple, list)) and len(output) >= 3:
                cand = output[2]
                if isinstance(cand, torch.Tensor) and not cand.is_floating_point():
                    indices = cand
            if indices is None and self.top_k > 0:
                indices = logits.topk(self.top_k, dim=-1).indices
            if indices is None:
                self.report(
                    f"max_vio@{self.layer}",
                    "the router's experts-per-token is unknown; pass hooks.attach(..., top_k=K)",
                )
            elif self.n_experts > 0:
                self.acc.add_expert_counts(self.where, indicators.expert_counts(indices, self.n_experts))


class BundledMoEProbe(Probe):
    """Router Z, expert counts and aux loss of the bundled ``MoE`` (``capture`` -> ``.router_logits``)."""

    keys = ("router_z", "max_vio")
    during_discovery = True

    def __init__(self, acc: Accumulator, gate: Gate, layer: int, module: nn.Module, report: Report = ignore) -> None:
        super().__init__(acc, gate, layer, report)
        self.module = module

    def register(self) -> list[RemovableHandle]:
        return [self.module.register_forward_hook(self._hook)]

    def set_capture(self, on: bool) -> None:
        setattr(self.module, "capture", on)  # noqa: B010 (an attribute mypy cannot see)

    def _hook(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.live():
            self.guard(lambda: self._measure(module))

    def _measure(self, module: nn.Module) -> None:
        with torch.no_grad():
            logits = getattr(module, "router_logits", None)
            if isinstance(logits, torch.Tensor):
                self.acc.add_router_logits(self.where, logits)
            counts = getattr(module, "counts", None)
            if isinstance(counts, torch.Tensor):
                self.acc.add_expert_counts(self.where, counts)
            aux = getattr(module, "aux_loss", None)
            if isinstance(aux, torch.Tensor):
                self.acc.add_aux_loss(self.where, aux)


class OutputProbe(OutputHookProbe):
    """Output Z of the LM head: LSE over the vocabulary of each position's logits (a forward hook).

    ``layer`` is -1: a run-level value (``output_z``), reported without a layer.
    """

    keys = ("output_z",)
    during_discovery = True  # measures the traced forward too, and is kept when discovery replaces the probes

    def __init__(self, acc: Accumulator, gate: Gate, module: nn.Module, report: Report = ignore) -> None:
        super().__init__(acc, gate, -1, report)
        self.module = module

    def _measure(self, output: Any) -> None:
        logits = heads.first_logits(output)
        if logits is None or not logits.is_floating_point() or logits.dim() < 1 or logits.numel() == 0:
            self.report("output_z", f"{type(self.module).__name__} returned no floating-point logits tensor")
            return
        with torch.no_grad():
            self.acc.add_output_logits(logits)
