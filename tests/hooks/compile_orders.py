"""Every way a user compiles, with the hooks attached before or after: the harness of
``test_compile_orders.py``.

:func:`train` runs a few optimizer steps of one model, compiled in one of :data:`ORDERS` (or
eagerly, or compiled without hooks), and returns the losses, the per-layer values the monitor
emitted, and dynamo's own counters (graphs, recompiles, graph breaks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.utils import counters

from bench.plain_gpt import PlainGPT
from hyperwatch import hooks

ORDERS = (
    "wrap_then_attach",  # model = torch.compile(model); hooks.attach(model)  (the OptimizedModule wrapper)
    "inplace_then_attach",  # model.compile(); hooks.attach(model)
    "attach_then_inplace",  # hooks.attach(model); model.compile()
    "attach_then_wrap",  # hooks.attach(model); compiled = torch.compile(model); train compiled
    "forward_then_attach",  # compiled = torch.compile(model); compiled(x) ran; hooks.attach(model)
    "blocks_then_attach",  # each block replaced by torch.compile(block) (torchtitan), then attach
    "attach_then_blocks",  # attach, then block.compile() in place for each block
)
PER_BLOCK = ("blocks_then_attach", "attach_then_blocks")


@dataclass
class Spec:
    build: Callable[[], nn.Module]
    loss: Callable[[nn.Module, torch.Tensor], torch.Tensor]
    vocab: int
    blocks: Callable[[nn.Module], nn.ModuleList]


def _lm_loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(m(x).flatten(0, 1), x.flatten())


def specs() -> dict[str, Spec]:
    from tests.hooks.support import bundled_model, hf_model

    return {
        "plain_gpt": Spec(lambda: _seeded(PlainGPT), _lm_loss, 64, lambda m: m.stack),
        "hf_llama": Spec(
            lambda: hf_model("llama", layers=3),
            lambda m, x: m(input_ids=x, labels=x).loss,
            96,
            lambda m: m.model.layers,
        ),
        "bundled": Spec(lambda: bundled_model(depth=4), lambda m, x: m(x, x).loss, 64, lambda m: m.blocks),
    }


def _seeded(cls: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return cls()


@dataclass
class Result:
    losses: list[float]
    values: dict[tuple[int, str, int | None], float] = field(default_factory=dict)
    graphs: int = 0
    recompiles: int = 0
    breaks: int = 0
    unavailable: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)


def _compile_blocks(blocks: nn.ModuleList, backend: str, inplace: bool) -> None:
    for i, block in enumerate(blocks):
        if inplace:
            block.compile(backend=backend)
        else:
            blocks[i] = torch.compile(block, backend=backend)


def train(
    spec: Spec, order: str | None, hooked: bool, steps: int = 5, every: int = 2, backend: str = "inductor"
) -> Result:
    """``order`` None: eager. ``hooked`` False: the same compile without a monitor (the reference)."""
    torch._dynamo.reset()
    counters.clear()
    model = spec.build()
    g = torch.Generator().manual_seed(5)
    batches = [torch.randint(0, spec.vocab, (2, 16), generator=g) for _ in range(steps)]
    sink = hooks.MemorySink()
    mon: Any = None
    run: nn.Module = model

    def attach(target: nn.Module) -> None:
        nonlocal mon
        if hooked:
            mon = hooks.attach(target, run=f"{order}", sink=sink, every=every)

    if order in (None, "attach_then_inplace", "attach_then_wrap", "attach_then_blocks"):
        attach(model)
    if order == "wrap_then_attach":
        run = torch.compile(model, backend=backend)
        attach(run)
    elif order == "inplace_then_attach":
        model.compile(backend=backend)
        attach(model)
    elif order == "attach_then_inplace":
        model.compile(backend=backend)
    elif order == "attach_then_wrap":
        run = torch.compile(model, backend=backend)
    elif order == "forward_then_attach":
        run = torch.compile(model, backend=backend)
        with torch.no_grad():
            run(batches[0]) if spec.loss is _lm_loss else spec.loss(run, batches[0])
        attach(model)
    elif order == "blocks_then_attach":
        _compile_blocks(spec.blocks(model), backend, inplace=False)
        attach(model)
    elif order == "attach_then_blocks":
        _compile_blocks(spec.blocks(model), backend, inplace=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step, x in enumerate(batches):
        loss = spec.loss(run, x)
        loss.backward()
        opt.step()
        if mon is not None:
            mon.step(step, loss=loss.detach())
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    out = Result(losses)
    if mon is not None:
        mon.close()
        out.unavailable, out.notes = dict(mon.unavailable), dict(mon.notes)
    out.values = {(p.step, p.name, p.layer): p.value for b in sink.batches for p in b.points if p.layer is not None}
    out.graphs = int(counters["stats"].get("unique_graphs", 0))
    out.recompiles = sum(counters["recompiles"].values()) if "recompiles" in counters else 0
    out.breaks = sum(counters["graph_break"].values())
    return out
