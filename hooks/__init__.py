"""hooks: stability indicators for any PyTorch training run, streamed without loss.

Imports only torch, numpy and the standard library: it goes into other people's training
environments. Three lines::

    mon = hooks.attach(model, run="llama-d12", sink="http://localhost:8000", every=10, config=cfg)
    ...  mon.step(step, loss=loss, lr=lr, tokens=seen)   # after each optimizer step
    mon.close()                                          # or: with hooks.attach(...) as mon:

The names below are imported lazily, so ``import hooks.schema`` (the wire format, which the
service validates with) never pulls in torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AdapterError": "hooks.adapters",
    "attach": "hooks.attach",
    "make_sink": "hooks.attach",
    "Monitor": "hooks.monitor",
    "METRICS": "hooks.schema",
    "Batch": "hooks.schema",
    "Point": "hooks.schema",
    "SchemaError": "hooks.schema",
    "FanOut": "hooks.sinks",
    "HttpSink": "hooks.sinks",
    "JsonlSink": "hooks.sinks",
    "MemorySink": "hooks.sinks",
    "RunInfo": "hooks.sinks",
    "Sink": "hooks.sinks",
    "SinkError": "hooks.sinks",
}

__all__ = [
    "METRICS",
    "AdapterError",
    "Batch",
    "FanOut",
    "HttpSink",
    "JsonlSink",
    "MemorySink",
    "Monitor",
    "Point",
    "RunInfo",
    "SchemaError",
    "Sink",
    "SinkError",
    "attach",
    "make_sink",
]

if TYPE_CHECKING:
    from hooks.adapters import AdapterError
    from hooks.attach import attach, make_sink
    from hooks.monitor import Monitor
    from hooks.schema import METRICS, Batch, Point, SchemaError
    from hooks.sinks import FanOut, HttpSink, JsonlSink, MemorySink, RunInfo, Sink, SinkError


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hooks' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
