"""Hooks on compiled models in every order of compile and attach, under inductor on CPU.

For a plain GPT whose modules no heuristic knows (``stack`` / ``mix`` / ``ffn``), a Hugging Face
Llama built from a config and the bundled trainer's model, each order of
:data:`tests.hooks.compile_orders.ORDERS` must: raise nothing; emit every per-layer value the eager
run emits, equal to it (1e-2 relative, the trajectories differ by float rounding); give the losses
of the same compile without hooks (exactly where no step ran eagerly; to float rounding where
discovery's first logged step did); and compile at most one more graph per graph of the run without
hooks (the logged variant; one more where a graph was cached before attach), with no graph break
and no recompile.
"""

from __future__ import annotations

import logging

import pytest
import torch

from hyperwatch import hooks
from hyperwatch.hooks.compiled import EAGER_NOTE, STALE_NOTE
from tests.hooks.compile_orders import ORDERS, PER_BLOCK, PlainGPT, Result, specs, train

_EAGER: dict[str, Result] = {}
_REFERENCE: dict[tuple[str, bool], Result] = {}


def _eager(name: str) -> Result:
    if name not in _EAGER:
        _EAGER[name] = train(specs()[name], None, hooked=True)
    return _EAGER[name]


def _reference(name: str, order: str) -> Result:
    key = (name, order in PER_BLOCK)
    if key not in _REFERENCE:
        _REFERENCE[key] = train(specs()[name], order, hooked=False)
    return _REFERENCE[key]


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("name", ["plain_gpt", "hf_llama", "bundled"])
def test_every_compile_order_measures_what_eager_measures(name: str, order: str) -> None:
    eager, reference = _eager(name), _reference(name, order)
    got = train(specs()[name], order, hooked=True)
    assert got.unavailable == {} == eager.unavailable
    assert set(got.values) == set(eager.values)
    names = {n for _, n, _ in got.values}
    assert {"attention_z", "attention_rms", "mlp_rms", "attention_outlier_ratio", "mlp_outlier_ratio"} <= names
    for key, want in eager.values.items():
        assert got.values[key] == pytest.approx(want, rel=1e-2, abs=1e-6), key
    if "compiled_first_step_eager" in got.notes:  # discovery traced the first logged step eagerly
        assert got.notes["compiled_first_step_eager"] == EAGER_NOTE
        assert got.losses == pytest.approx(reference.losses, rel=1e-5)
    else:
        assert got.losses == reference.losses
    stale = order == "forward_then_attach"
    assert (got.notes.get("compiled_before_attach") == STALE_NOTE) is stale
    assert got.breaks == 0 and got.recompiles <= reference.recompiles
    assert reference.graphs >= 1
    assert got.graphs <= 2 * reference.graphs + int(stale), (got.graphs, reference.graphs)


def test_blocks_of_one_class_share_their_compiled_graphs() -> None:
    """Twelve blocks compiled one by one (torchtitan's way) with hooks: two graphs in all (logged and
    unlogged), not two per block (dynamo's recompile limit is 8 per code object)."""
    spec = specs()["plain_gpt"]
    spec.build = lambda: _seeded_gpt(layers=12)
    got = train(spec, "blocks_then_attach", hooked=True, backend="aot_eager")
    assert got.graphs == 2 and got.recompiles == 0
    assert {layer for (_, n, layer) in got.values if n == "attention_z"} == set(range(12))


def _seeded_gpt(layers: int = 3, parallel: bool = False) -> PlainGPT:
    torch.manual_seed(0)
    return PlainGPT(layers=layers, parallel=parallel)


def test_fullgraph_compile_keeps_one_graph() -> None:
    """``fullgraph=True`` (torchtitan compiles blocks so): a graph break would be an error."""
    model = _seeded_gpt()
    for block in model.stack:
        block.compile(backend="aot_eager", fullgraph=True)
    sink = hooks.MemorySink()
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    with hooks.attach(model, run="fullgraph", sink=sink, every=1) as mon:
        for step in range(3):
            model(x).square().mean().backward()
            mon.step(step)
    rms = [p for b in sink.batches for p in b.points if p.name == "attention_rms"]
    assert len(rms) == 3 * 3


@pytest.mark.parametrize("compile_it", [False, True])
def test_parallel_block_with_chained_adds_finds_both_branches(compile_it: bool) -> None:
    """``x + attn(h) + mlp(h)`` (one norm, GPT-J / PaLM): discovery follows both adds."""
    torch._dynamo.reset()
    model = _seeded_gpt(parallel=True)
    sink = hooks.MemorySink()
    mon = hooks.attach(model, run="parallel", sink=sink, every=1)
    if compile_it:
        model.compile(backend="aot_eager")
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    for step in range(2):
        model(x).square().mean().backward()
        mon.step(step)
    mon.close()
    assert mon.unavailable == {}
    assert mon.notes["branches"].startswith("attention = <block>.mix (Z from <block>.mix); mlp = <block>.ffn;")
    names = {(p.name, p.layer) for b in sink.batches for p in b.points}
    assert {("mlp_rms", i) for i in range(3)} <= names and {("attention_z", i) for i in range(3)} <= names


def test_a_second_attach_is_refused_until_the_first_is_closed() -> None:
    model = _seeded_gpt()
    first = hooks.attach(torch.compile(model, backend="eager"), run="first", sink=hooks.MemorySink())
    assert hooks.attached(model) is first
    for target in (model, model.stack[1], torch.compile(model, backend="eager")):
        with pytest.raises(RuntimeError, match=r"already has a monitor attached \(run 'first'\).*mon.close\(\)"):
            hooks.attach(target, run="second", sink=hooks.MemorySink())
    first.close()
    assert hooks.attached(model) is None
    second = hooks.attach(model, run="second", sink=hooks.MemorySink())
    second.close()


def test_a_failing_probe_logs_one_line_for_all_its_layers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The failure is logged once; every layer it hits is recorded as unavailable; training goes on."""
    from hyperwatch.hooks.accumulate import Accumulator

    def broken(self: Accumulator, *args: object, **kwargs: object) -> None:
        raise ValueError("broken on purpose")

    monkeypatch.setattr(Accumulator, "add_branch", broken)
    model = _seeded_gpt()
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    with (
        caplog.at_level(logging.WARNING, logger="hyperwatch.hooks"),
        hooks.attach(model, run="broken", sink=hooks.MemorySink(), every=1, attention="*.mix", mlp="*.ffn") as mon,
    ):
        for step in range(2):
            model(x).square().mean().backward()
            mon.step(step)
    failures = [r for r in caplog.records if "broken on purpose" in r.getMessage()]
    assert len(failures) == 1, [r.getMessage() for r in failures]
    assert {f"{m}@{i}" for m in ("attention_rms", "mlp_rms") for i in range(3)} <= set(mon.unavailable)
    assert "attention_z@0" not in mon.unavailable
