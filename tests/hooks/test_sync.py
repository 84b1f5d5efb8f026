"""No host synchronization inside a hooked forward, and one device-to-host copy per logged step.

On CPU a sync cannot be observed directly, so the test counts the ATen ops that force one on a
GPU (``.item()``/``float()`` -> ``_local_scalar_dense``, data-dependent shapes: ``nonzero``,
``bincount``, ``masked_select``, ``unique``...) in a logged forward with hooks, against the same
forward without: the hooks must add none. On CUDA, ``torch.cuda.set_sync_debug_mode("error")``
makes any synchronizing call inside the hooked forward raise.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from hyperwatch import hooks
from tests.hooks.support import bundled_model, hf_model

SYNCING = {
    "_local_scalar_dense",
    "is_nonzero",
    "nonzero",
    "bincount",
    "masked_select",
    "unique",
    "_unique2",
    "unique_consecutive",
    "repeat_interleave",
    "equal",
}


class SyncCounter(TorchDispatchMode):
    """Counts the ATen ops that synchronize the host with a GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        if name in SYNCING:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


Case = tuple[Callable[[], nn.Module], Callable[[nn.Module, torch.Tensor], torch.Tensor], int]


def _cases() -> dict[str, Case]:
    def hf(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(input_ids=x, labels=x).loss  # type: ignore[no-any-return]

    def bundled(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return m(x, x).loss  # type: ignore[no-any-return]

    return {
        "llama": (lambda: hf_model("llama"), hf, 96),
        "mixtral": (lambda: hf_model("mixtral"), hf, 96),
        "bundled_dense": (lambda: bundled_model(), bundled, 64),
        "bundled_moe": (lambda: bundled_model(moe=True), bundled, 64),
    }


def _syncs(
    model: nn.Module, loss_fn: Callable[[nn.Module, torch.Tensor], torch.Tensor], x: torch.Tensor
) -> Counter[str]:
    counter = SyncCounter()
    with counter:
        loss_fn(model, x)
    return counter.ops


@pytest.mark.parametrize("name", ["llama", "mixtral", "bundled_dense", "bundled_moe"])
def test_hooks_add_no_syncing_op_to_a_logged_forward(name: str) -> None:
    build, loss_fn, vocab = _cases()[name]
    model = build()
    x = torch.randint(0, vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    plain = _syncs(model, loss_fn, x)
    sink = hooks.MemorySink()
    mon = hooks.attach(model, run=name, sink=sink, every=1)  # armed: this forward is logged
    hooked = _syncs(model, loss_fn, x)
    mon.step(0)
    mon.close()
    assert hooked == plain, f"the hooks added {hooked - plain}"
    assert any(p.name == "attention_z" for b in sink.batches for p in b.points)


def test_one_device_to_host_copy_per_logged_step() -> None:
    """Structure: the whole step's values leave the device in one copy of one flat buffer."""
    model = bundled_model(moe=True)
    x = torch.randint(0, 64, (2, 16))
    mon = hooks.attach(model, run="t", sink=hooks.MemorySink(), every=1)
    copies: list[tuple[int, ...]] = []
    original = mon.acc.take

    def take(extra: torch.Tensor | None = None) -> Any:
        host, event = original(extra)
        copies.append(tuple(host.shape))
        return host, event

    mon.acc.take = take  # type: ignore[method-assign]
    for step in range(3):
        model(x, x).loss.backward()
        mon.step(step)
    mon.close()
    assert copies == [(mon.acc.flat.numel(),)] * 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="sync debug mode needs a GPU")
@pytest.mark.parametrize("name", ["llama", "bundled_dense", "bundled_moe"])
def test_no_sync_in_a_hooked_cuda_forward(name: str) -> None:
    build, loss_fn, vocab = _cases()[name]
    model = build().cuda()
    x = torch.randint(0, vocab, (2, 16), device="cuda")
    loss_fn(model, x).backward()  # warm-up: lazy initialisation may sync
    mon = hooks.attach(model, run=name, sink=hooks.MemorySink(), every=1)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model, x)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    loss.backward()
    mon.step(0, loss=loss.detach())
    mon.close()
