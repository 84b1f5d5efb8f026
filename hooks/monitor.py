"""``hooks.attach(model, ...)`` -> :class:`Monitor`: the three lines a user adds to a training loop.

Step protocol. ``mon.step(s, ...)`` is called once per optimizer step, after it. The hooks are
*armed* for the forwards of a logged step only: the first step after ``attach`` and every step
``s`` with ``s % every == 0`` (``step(s-1)`` arms them for ``s``). On an armed step every forward
(micro-batch) adds its sums into preallocated device buffers; ``step(s)`` then does, on the
training thread: one all-reduce of those buffers across data-parallel ranks (when
``torch.distributed`` is initialized), one device-to-host copy (asynchronous into pinned memory
on CUDA), and a reset. Everything else (turning sums into indicators, building points, the sink)
happens on the monitor's emitter thread. Rank 0 emits; every rank must call ``step``.
Between logged steps no hook is registered at all and the capture flags are off: the model
runs PyTorch's plain call path, and ``step`` costs a few Python comparisons.

Run-level values: ``loss`` (a float or a tensor; averaged over ranks), ``lr``, ``tokens``,
``grad_norm`` (pass the value ``clip_grad_norm_`` returns, which is the norm before clipping;
without it the monitor computes the norm of the ``.grad`` tensors as they are when ``step`` is
called, so call it before ``zero_grad``, and it is after clipping if you clip).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from hyperwatch.hooks import compiled, environment, indicators
from hyperwatch.hooks.accumulate import GRAD_NORM, LOSS, LOSS_N, Accumulator, LayerValues
from hyperwatch.hooks.adapters import ModelPlan
from hyperwatch.hooks.checks import Scalar, check_int, check_scalar, grad_norm_of, scalar_tensor, warn_no_grad
from hyperwatch.hooks.describe import BudgetFromSteps
from hyperwatch.hooks.discovery import DiscoveryProbe, book_trace, refine
from hyperwatch.hooks.mha import MhaProbe
from hyperwatch.hooks.probes import (
    FAILED,
    BranchProbe,
    BundledMoEProbe,
    Gate,
    InterceptProbe,
    KernelLseProbe,
    OutputProbe,
    Probe,
    RouterProbe,
)
from hyperwatch.hooks.schema import Batch, Point, validate_name
from hyperwatch.hooks.sinks.base import RunInfo, Sink
from hyperwatch.hooks.tracer import Tracer
from hyperwatch.hooks.weights import WeightTracker

log = logging.getLogger(__name__)


class Monitor:
    """Hooks on one model, feeding one sink. Build it with :func:`hooks.attach`."""

    def __init__(
        self,
        model: nn.Module,
        plan: ModelPlan,
        run: RunInfo,
        sink: Sink | None,
        every: int = 10,
        weights: bool = False,
        process_group: Any = None,
        chunk_elements: int = indicators.DEFAULT_CHUNK_ELEMENTS,
        auto_grad_norm: bool = True,
        close_timeout: float = 5.0,
    ) -> None:
        self.every = check_int(every, "every", 1)
        self.close_timeout = close_timeout
        self.model = model
        self.plan = plan
        self.run = run
        self.auto_grad_norm = auto_grad_norm
        self.process_group = process_group
        self.device = next((p.device for p in model.parameters()), torch.device("cpu"))
        self.distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size(process_group) > 1
        self.rank = dist.get_rank(process_group) if self.distributed else 0
        self.sink = sink if self.rank == 0 else None
        # A plan still to be refined by discovery sends its gaps only once they are known: the
        # service merges what it is told, so a guess sent now could never be taken back.
        self._discovering = plan.discover
        known = {} if plan.discover else dict(plan.unavailable)
        self.unavailable: dict[str, str] = dict(known)
        self._reported: set[str] = set()
        self._logged_reasons: set[str] = set()
        self._sent_unavailable = dict(known)  # what the sink has (sent with the run)
        self.notes: dict[str, str] = dict(plan.notes)
        self._sent_notes = dict(plan.notes)
        self._warned_no_grad = False
        if known:
            run.fields["unavailable"] = dict(known)
        self._checked_missing = False
        self.closed = False
        self._finished = False
        self.last_points: list[Point] = []  # the last emitted step's points, for progress displays
        self.budget: BudgetFromSteps | None = None  # set by attach: the token budget learned from steps
        n_layers = max((spec.index for spec in plan.layers), default=-1) + 1
        n_experts = [0] * n_layers
        for spec in plan.layers:
            n_experts[spec.index] = spec.n_experts
        self.acc = Accumulator(n_layers, n_experts, self.device)
        self.gate = Gate()
        self.gate.compiled = compiled.is_compiled(model)  # hooks registered as compiled code needs them
        self.eager = compiled.EagerSteps()  # logged steps run eagerly while discovery is pending
        # what Module.compile() after attach marks: the model or its blocks (checked at logged steps)
        self._compilable = [model, *(b for spec in plan.layers for b in spec.blocks)]
        self._probes_armed = False
        self.probes: list[Probe] = []
        self._chunk_elements = chunk_elements
        self._install(chunk_elements)
        if plan.output is not None:  # measures discovery's forward too, and is kept across it
            self.probes.append(OutputProbe(self.acc, self.gate, plan.output, self._report))
        self._discovery: DiscoveryProbe | None = None
        if plan.discover:
            self._discovery = DiscoveryProbe(
                self.acc, self.gate, model, plan, self._discovered, chunk_elements, self._report, self._note
            )
            self.probes.append(self._discovery)
        if compiled.drop_stale_graphs(model):
            log.warning("hooks: run %r: %s", run.name, compiled.STALE_NOTE)
            self.notes["compiled_before_attach"] = compiled.STALE_NOTE
        self.weights = WeightTracker(plan.layers) if weights else None
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._emitter = threading.Thread(target=self._emit_loop, name="hyperwatch-emitter", daemon=True)
        self._emitter.start()
        for key, reason in known.items():
            self._report(key, reason)
        if self.sink is not None:
            self._submit(lambda: self.sink.start(run) if self.sink is not None else None)
        self._arm(True)  # the first step after attach is always logged

    # -- setup --
    def _install(self, chunk_elements: int, routers: bool = True) -> None:
        acc, gate, report = self.acc, self.gate, self._report
        for spec in self.plan.layers:
            i = spec.index
            branch = spec.attention_output if spec.attention_output is not None else spec.attention
            if branch is not None:
                self.probes.append(BranchProbe(acc, gate, i, branch, "attention", report))
                acc.branch_scale[i, 0] = spec.attention_scale
            if spec.attention is not None:
                if spec.bundled:
                    self.probes.append(KernelLseProbe(acc, gate, i, spec.attention, report))
                elif spec.mha:
                    self.probes.append(MhaProbe(acc, gate, i, spec.attention, chunk_elements, report))
                else:
                    self.probes.append(InterceptProbe(acc, gate, i, spec.attention, report, chunk_elements, self._note))
            if spec.mlp is not None:
                self.probes.append(BranchProbe(acc, gate, i, spec.mlp, "mlp", report))
                acc.branch_scale[i, 1] = spec.mlp_scale
            if spec.router is not None and routers:
                if spec.bundled:
                    self.probes.append(BundledMoEProbe(acc, gate, i, spec.router, report))
                else:
                    self.probes.append(RouterProbe(acc, gate, i, spec.router, spec.n_experts, spec.top_k, report))

    def _discovered(self, static: ModelPlan, tracer: Tracer) -> None:
        """The first logged forward was traced: hook what each residual add received (eager only).

        The trace measured that forward: its sums are booked to the new plan's branches, so the
        step keeps its values. Routers keep their probes (they measured the traced forward too)."""
        self._discovering = False
        self.eager.end()
        if self.gate.compiled:
            self._note("compiled_first_step_eager", compiled.EAGER_NOTE)
        if tracer.error is not None:
            self._adopt_static()
            return
        plan, notes = refine(static, tracer, self.model)
        keep = [p for p in self.probes if p.during_discovery and not isinstance(p, DiscoveryProbe)]
        for probe in self.probes:
            if probe not in keep:
                probe.remove()
        self.probes = keep
        self.plan = plan
        self.acc.branch_scale[:] = 1.0
        routers = {id(p.module) for p in keep if isinstance(p, (RouterProbe, BundledMoEProbe))}
        self._install(self._chunk_elements, routers=False)
        for spec in plan.layers:  # a router found only now (its MLP was found only now)
            if spec.router is not None and id(spec.router) not in routers:
                self.probes.append(
                    RouterProbe(self.acc, self.gate, spec.index, spec.router, spec.n_experts, spec.top_k, self._report)
                )
        for probe in self.probes:
            probe.arm(self._probes_armed)
        with torch.no_grad():
            for spec in plan.layers:
                book_trace(self.acc, spec, tracer, self.device)
        for key, text in notes.items():
            self._note(key, text)
        for key, reason in plan.unavailable.items():
            self._report(key, reason)

    def _adopt_static(self) -> None:
        """No discovery (failed, or every forward compiled): the adapter's gaps by name stand."""
        self._discovering = False
        self.eager.end()
        for key, reason in self.plan.unavailable.items():
            self._report(key, reason)

    def _report(self, key: str, reason: str) -> None:
        if key in self._reported:
            return
        self._reported.add(key)
        self.unavailable[key] = reason
        if reason in self._logged_reasons or reason.startswith(FAILED):  # logged already: stored only
            log.debug("hooks: %s unavailable for run %r: %s", key, self.run.name, reason)
            return
        self._logged_reasons.add(reason)
        log.warning("hooks: %s unavailable for run %r: %s", key, self.run.name, reason)

    def _note(self, key: str, text: str) -> None:
        """How a measured value is obtained (stored in the run's config under ``_hyperwatch``)."""
        if self.notes.get(key) is not None:
            return
        self.notes[key] = text
        log.log(
            logging.INFO if key == "branches" else logging.WARNING, "hooks: run %r, %s: %s", self.run.name, key, text
        )

    def _arm(self, on: bool) -> None:
        """Arm (register the hooks, set capture flags) or disarm; the probes are touched only when
        the state changes, so a run of unlogged steps costs one comparison per step."""
        if on and not self.gate.compiled and compiled.is_compiled(self.model, self._compilable):
            self._now_compiled()
        if on != self._probes_armed:
            for probe in self.probes:
                probe.arm(on)
            self._probes_armed = on
        self.gate.armed = on
        if on and self._discovering:
            self.eager.begin()
        if on and self.weights is not None and self.sink is not None:
            self.weights.snapshot()

    def _now_compiled(self) -> None:
        """The model was compiled after attach (``Module.compile()``, blocks replaced by compiled
        ones): hooks stay registered from now on, and those registered for eager mode are
        registered again as compiled code needs them (see ``InterceptProbe.register``)."""
        self.gate.compiled = True
        for probe in self.probes:
            if probe.handles:
                probe.remove()
                probe.handles = probe.register()
                probe.set_capture(True)

    # -- the training loop's calls --
    def step(
        self,
        step: int,
        loss: Scalar | None = None,
        lr: float | None = None,
        tokens: int | None = None,
        grad_norm: Scalar | None = None,
    ) -> None:
        """End of optimizer step ``step``: emit it if it was a logged step, arm the next logged one."""
        if self.closed:
            raise RuntimeError("Monitor.step: the monitor is closed; attach a new one")
        check_int(step, "step")
        if tokens is not None:
            check_int(tokens, "tokens")
        if lr is not None and (isinstance(lr, bool) or not isinstance(lr, (int, float))):
            raise ValueError(f"lr: must be a number, got {type(lr).__name__}")
        self.eager.end()
        if self.gate.armed:
            if self._discovering and self._discovery is not None and self._discovery.skipped:
                self._adopt_static()  # the forwards were compiled (no stance to run them eagerly)
            for probe in self.probes:
                if isinstance(probe, InterceptProbe):
                    probe.leave()
            self._flush_step(step, loss, lr, tokens, grad_norm)
        self._arm((step + 1) % self.every == 0)

    def log(
        self,
        step: int,
        values: dict[str, Scalar],
        tokens: int | None = None,
        layer: int | None = None,
    ) -> None:
        """Extra values computed outside the hooks, e.g. ``{"val_loss": x}`` or ``{"user.bleu": y}``.

        Names must be registered in :data:`hooks.schema.METRICS` (or start with ``user.``).
        Sent with the next batch (or at ``flush``/``close``), never reduced across ranks.
        """
        check_int(step, "step")
        if tokens is not None:
            check_int(tokens, "tokens")
        if layer is not None:
            check_int(layer, "layer")
        if not isinstance(values, dict):
            raise ValueError("values: must be a dict of metric name -> number")
        points = []
        for name, value in values.items():
            validate_name(name, f"values[{name!r}]")
            t = scalar_tensor(value, f"values[{name!r}]", torch.device("cpu"))
            assert t is not None
            points.append(Point(name=name, step=step, value=float(t), layer=layer, tokens=tokens))
        if self.sink is not None:
            self._submit(lambda: self._write(points))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every emitted batch has reached the sink (and, for HTTP, the service)."""
        done = threading.Event()
        self._submit(done.set)
        if not done.wait(timeout):
            return False
        return self.sink.flush(timeout) if self.sink is not None else True

    def finish(self, status: str = "finished") -> None:
        """Tell the sink the run ended (``finished``, ``failed``...): the HTTP sink PATCHes the run."""
        if self._finished:
            return
        self._finished = True
        if self.sink is not None:
            if self.budget is not None and status == "finished":  # a finished run's length describes it
                self._submit(self.budget.finish_job(self.run, self.sink))
            self._submit(lambda: self.sink.finish(status) if self.sink is not None else None)

    def detach(self) -> None:
        """Remove every hook and capture flag this monitor installed."""
        self.eager.end()
        self.gate.armed = False
        for probe in self.probes:
            probe.remove()
        self.probes.clear()
        self._probes_armed = False

    def close(self, status: str | None = "finished") -> None:
        """Detach, mark the run ``status`` (unless finish() was called), deliver, close the sink.

        Bounded by ``close_timeout`` (``hooks.attach(close_timeout=...)`` or
        ``$HYPERWATCH_CLOSE_TIMEOUT``, default 5 s) for the HTTP sink's delivery; what is not
        delivered by then stays in its spool and the replay command is logged.
        """
        if self.closed:
            return
        self.detach()
        if self.sink is not None:
            self._submit(self._send_unavailable)  # reported after the last emitted step
        if status is not None:
            self.finish(status)
        self._jobs.put(None)
        self._emitter.join(timeout=max(self.close_timeout, 1.0))
        if self._emitter.is_alive():
            log.warning(
                "hooks: the sink of run %r still had not taken the last batches after %.1f s; closing anyway",
                self.run.name,
                max(self.close_timeout, 1.0),
            )
        self.closed = True
        if self.sink is not None:
            try:
                self.sink.close()
            except Exception:  # closing a sink must not take training down
                log.exception("hooks: closing the sink failed")

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close("failed" if exc_type is not None else "finished")

    # -- one logged step --
    def _flush_step(
        self, step: int, loss: Scalar | None, lr: float | None, tokens: int | None, grad_norm: Scalar | None
    ) -> None:
        acc = self.acc
        check_scalar(loss, "loss")
        check_scalar(grad_norm, "grad_norm")
        if loss is not None:
            acc.record_loss(loss)
        reduced = acc.pack()
        if self.distributed:
            dist.all_reduce(reduced, group=self.process_group)
            if acc.n_layers:  # maxima do not add: the per-head LSE maxima take their own (small) collective
                dist.all_reduce(acc.heads, op=dist.ReduceOp.MAX, group=self.process_group)
        gn: Scalar | None = grad_norm
        if gn is None and self.auto_grad_norm:
            gn = grad_norm_of(self.model, self.device)
            if gn is None and not self._warned_no_grad:
                self._warned_no_grad = True
                warn_no_grad(self.model, self.run.name, step)
        acc.record_grad_norm(gn if gn is not None else math.nan)
        weight_names: list[tuple[int, str]] = []
        if self.sink is None:  # ranks other than 0 only took part in the all-reduce
            acc.reset()
            return
        extra = None
        if self.weights is not None:
            extra, weight_names = self.weights.measure(self.device)
        host, event = acc.take(extra)  # the one device-to-host copy of the step; resets the buffers
        has_gn = gn is not None

        def job() -> None:
            if event is not None:
                event.synchronize()
            self._emit(step, tokens, lr, host.numpy(), has_gn, weight_names)

        self._submit(job)

    def _emit(
        self,
        step: int,
        tokens: int | None,
        lr: float | None,
        flat: np.ndarray,
        has_gn: bool,
        weight_names: list[tuple[int, str]],
    ) -> None:
        n = self.acc.packed_size
        layers = self.acc.unpack(flat[: self.acc.flat.numel()])
        loss_sum, loss_n = float(flat[n + LOSS]), float(flat[n + LOSS_N])
        points: list[Point] = []
        for i, values in enumerate(layers):
            points += [Point(name, step, v, layer=i, tokens=tokens) for name, v in values.items()]
        if loss_n > 0:
            points.append(Point("loss", step, loss_sum / loss_n, tokens=tokens))
        if lr is not None:
            points.append(Point("lr", step, float(lr), tokens=tokens))
        if has_gn:
            points.append(Point("grad_norm", step, float(flat[n + GRAD_NORM]), tokens=tokens))
        output_z = self.acc.output_z(flat)
        if output_z is not None:
            points.append(Point("output_z", step, output_z, tokens=tokens))
        pos = self.acc.flat.numel()  # the weight norms follow the accumulator's buffer
        if tokens is not None:
            points.append(Point("tokens", step, float(tokens), tokens=tokens))
        for (layer, name), value in zip(weight_names, flat[pos : pos + len(weight_names)]):
            points.append(Point(name, step, float(value), layer=layer, tokens=tokens))
        points += environment.points(self.device, step, tokens)  # CUDA peak memory, host RSS (host counters)
        self.last_points = points  # read by progress displays (a reference swap: no lock needed)
        self._check_missing(layers)
        self._write(points)
        learned = self.budget.observe(step, tokens) if self.budget is not None else None
        if learned and self.sink is not None:  # sent once, as run fields
            self.run.fields.update(learned)
            self.sink.update(learned)
        self._send_unavailable()

    def _send_unavailable(self) -> None:
        """Tell the sink about indicators reported unavailable, and notes taken, since the run was
        created (emitter thread). Notes travel in the run's config, under ``_hyperwatch``."""
        if self.sink is None:
            return
        fields: dict[str, Any] = {}
        if self.unavailable != self._sent_unavailable:
            fields["unavailable"] = dict(self.unavailable)
        if self.notes != self._sent_notes:
            notes = dict(self.notes)
            meta = self.run.config.setdefault("_hyperwatch", {})
            if isinstance(meta, dict):
                meta.update(notes)
            fields["config"] = self.run.config
            self._sent_notes = notes
        if fields:
            self.sink.update(fields)
            self._sent_unavailable = dict(fields.get("unavailable", self._sent_unavailable))

    def _check_missing(self, layers: list[LayerValues]) -> None:
        """After the first logged step with data: report each expected indicator that did not come."""
        if self._checked_missing or not any(v.items() for v in layers):
            return
        self._checked_missing = True
        for spec in self.plan.layers:
            got = dict(layers[spec.index].items())
            for name in spec.expected():
                key = f"{name}@{spec.index}"
                if name not in got and key not in self._reported:
                    self._report(key, "no value was measured on the first logged step (no forward reached it?)")

    def _write(self, points: list[Point]) -> None:
        if self.sink is None or not points:
            return
        for start in range(0, len(points), 20_000):
            self.sink.write(Batch(run=self.run.name, points=points[start : start + 20_000]))

    # -- the emitter thread --
    def _submit(self, job: Callable[[], None]) -> None:
        if self.closed:
            raise RuntimeError("Monitor: closed; attach a new one")
        self._jobs.put(job)

    def _emit_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except Exception:  # a sink failure must never take training down
                log.exception("hooks: emitting to the sink failed; training continues")
