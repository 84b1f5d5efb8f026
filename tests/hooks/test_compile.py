"""Hooks under ``torch.compile`` (inductor): every indicator, no graph break, no recompile after warm-up.

The compiled model runs logged and unlogged steps alternately; after the first of each, dynamo
must neither recompile nor break a graph, and the indicators must equal the eager ones.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from hyperwatch import hooks
from hyperwatch.hooks import environment, indicators
from tests.hooks.support import bundled_model, hf_model

EVERY = 2
SYSTEM = environment.NAMES  # the process's memory: differs between an eager and a compiled run


class CountingBackend:
    """A dynamo backend that counts the graphs it is handed, then compiles them with inductor
    (or AOT autograd's eager, which functionalizes the same graphs without code generation)."""

    def __init__(self, inner: str) -> None:
        self.graphs = 0
        self.inner = inner

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Any:
        self.graphs += 1
        if self.inner == "inductor":
            from torch._inductor.compile_fx import compile_fx

            return compile_fx(gm, example_inputs)
        from torch._dynamo.backends.common import aot_autograd

        return aot_autograd(fw_compiler=lambda g, _: g, bw_compiler=lambda g, _: g)(gm, example_inputs)


def _models() -> dict[str, tuple[Callable[[], nn.Module], Callable[[nn.Module, torch.Tensor], torch.Tensor], int]]:
    def llama_loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(input_ids=x, labels=x).loss  # type: ignore[no-any-return]

    def bundled_loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(x, x).loss  # type: ignore[no-any-return]

    def sdpa_loss(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(torch.nn.functional.one_hot(x, 32).float()).square().mean()

    return {
        "sdpa_blocks": (lambda: _sdpa_blocks(), sdpa_loss, 32),
        "hf_llama_sdpa": (lambda: hf_model("llama"), llama_loss, 96),
        "bundled_dense": (lambda: bundled_model(), bundled_loss, 64),
        "bundled_moe": (lambda: bundled_model(moe=True), bundled_loss, 64),
    }


def _sdpa_blocks() -> nn.Module:
    from tests.hooks.test_intercept import _Block

    torch.manual_seed(0)
    return nn.Sequential(_Block(), _Block())


Values = dict[tuple[int, str, int | None], float]


def _run(name: str, compile_when: str | None, steps: int, inner: str = "inductor") -> tuple[Values, Any]:
    build, loss_fn, vocab = _models()[name]
    model = build()
    backend = CountingBackend(inner)
    if compile_when == "before":
        model.compile(backend=backend)
    sink = hooks.MemorySink()
    patterns = {"attention": "*.attn", "mlp": "*.mlp"} if name == "sdpa_blocks" else {}
    mon = hooks.attach(model, run=name, sink=sink, every=EVERY, **patterns)
    if compile_when == "after":
        model.compile(backend=backend)
    g = torch.Generator().manual_seed(5)
    batches = [torch.randint(0, vocab, (2, 16), generator=g) for _ in range(steps)]
    graphs_after_warmup = 0
    for step, x in enumerate(batches):
        loss = loss_fn(model, x)
        loss.backward()
        mon.step(step, loss=loss.detach())
        model.zero_grad(set_to_none=True)
        if step == EVERY:  # one logged and one unlogged step compiled: the warm-up is over
            graphs_after_warmup = backend.graphs
            counters.clear()
    mon.close()
    values = {(p.step, p.name, p.layer): p.value for b in sink.batches for p in b.points if p.name not in SYSTEM}
    return values, (backend.graphs - graphs_after_warmup, dict(counters["graph_break"]), dict(mon.unavailable))


# inductor on the model whose compile is quick on a CPU (the bundled dense under inductor passes
# too, but its compile alone takes minutes on a shared 2-core machine); AOT eager (the same functionalized
# graphs, dynamo guards and recompiles, without code generation) on the larger ones.
@pytest.mark.parametrize(
    ("name", "inner", "whens"),
    [
        ("sdpa_blocks", "inductor", ("after", "before")),
        ("hf_llama_sdpa", "aot_eager", ("after", "before")),
        ("bundled_dense", "aot_eager", ("before",)),
        ("bundled_moe", "aot_eager", ("after",)),
    ],
)
def test_compiled_model_gives_every_indicator_without_recompiles(name: str, inner: str, whens: tuple[str, ...]) -> None:
    torch._dynamo.reset()
    eager, _ = _run(name, None, steps=7)
    for when in whens:
        torch._dynamo.reset()
        compiled, (new_graphs, breaks, unavailable) = _run(name, when, steps=7, inner=inner)
        assert new_graphs == 0, f"compile {when} attach: {new_graphs} graphs compiled after warm-up"
        assert breaks == {}, breaks
        assert unavailable == {}
        assert set(compiled) == set(eager), set(eager) ^ set(compiled)
        assert {s for s, _, _ in compiled} == {0, 2, 4, 6}
        names = {n for _, n, _ in compiled}
        assert {"attention_z", "attention_rms", "mlp_rms", "attention_outlier_ratio", "mlp_outlier_ratio"} <= names
        for key, want in eager.items():
            assert compiled[key] == pytest.approx(want, rel=2e-3, abs=1e-6), key


def test_compiled_branch_statistics_read_each_row_once() -> None:
    """Inductor's CPU code for the branch statistics: one parallel loop over the token rows, three
    inner loops over a row (mean, squared deviations, outlier count) while it sits in L1, so the
    branch output is read from memory once (read from the generated code; torch is pinned)."""
    from torch._inductor.utils import run_and_get_code

    torch._dynamo.reset()
    out = torch.zeros(2, dtype=torch.float64)
    x = torch.randn(48, 128)
    x[3, 7] = 40.0

    def stats(t: torch.Tensor) -> None:
        indicators.add_branch_sums_(out, t)

    _, codes = run_and_get_code(torch.compile(stats, backend="inductor"), x)
    code = "\n".join(codes)
    cast = r"static_cast<int64_t>"
    loop = rf"for\(int64_t (x\d)={cast}\(0L\); \1<{cast}\({{n}}L\); \1\+={cast}\({{step}}"
    rows = re.findall(loop.format(n=48, step="1L"), code)
    cols = re.findall(loop.format(n=128, step=""), code)
    assert (len(rows), len(cols)) == (1, 3), code
    want = indicators.branch_sums(x)
    assert out[1] == want[1] == 1 and float(out[0]) == pytest.approx(float(want[0]), rel=1e-6)
