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
    "AdapterError": "hyperwatch.hooks.adapters",
    "attach": "hyperwatch.hooks.attach",
    "attached": "hyperwatch.hooks.attach",
    "make_sink": "hyperwatch.hooks.attach",
    "Monitor": "hyperwatch.hooks.monitor",
    "METRICS": "hyperwatch.hooks.schema",
    "Batch": "hyperwatch.hooks.schema",
    "Point": "hyperwatch.hooks.schema",
    "SchemaError": "hyperwatch.hooks.schema",
    "FanOut": "hyperwatch.hooks.sinks",
    "HttpSink": "hyperwatch.hooks.sinks",
    "JsonlSink": "hyperwatch.hooks.sinks",
    "MemorySink": "hyperwatch.hooks.sinks",
    "RunInfo": "hyperwatch.hooks.sinks",
    "Sink": "hyperwatch.hooks.sinks",
    "SinkError": "hyperwatch.hooks.sinks",
    "TensorBoardSink": "hyperwatch.hooks.sinks.trackers",
    "MlflowSink": "hyperwatch.hooks.sinks.trackers",
}

__all__ = [
    "METRICS",
    "AdapterError",
    "Batch",
    "FanOut",
    "HttpSink",
    "JsonlSink",
    "MemorySink",
    "MlflowSink",
    "Monitor",
    "Point",
    "RunInfo",
    "SchemaError",
    "Sink",
    "SinkError",
    "TensorBoardSink",
    "attach",
    "attached",
    "make_sink",
]

if TYPE_CHECKING:
    from hyperwatch.hooks.adapters import AdapterError
    from hyperwatch.hooks.attach import attach, attached, make_sink
    from hyperwatch.hooks.monitor import Monitor
    from hyperwatch.hooks.schema import METRICS, Batch, Point, SchemaError
    from hyperwatch.hooks.sinks import FanOut, HttpSink, JsonlSink, MemorySink, RunInfo, Sink, SinkError
    from hyperwatch.hooks.sinks.trackers import MlflowSink, TensorBoardSink


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hooks' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
