"""hooks: stability indicators for any PyTorch training run, streamed without loss.

Imports only torch, numpy and the standard library: it goes into other people's training
environments. Three lines::

    mon = hooks.attach(model, run="llama-d12", sink="http://localhost:8000", every=10, config=cfg)
    ...  mon.step(step, loss=loss, lr=lr, tokens=seen)   # after each optimizer step
    mon.close()                                          # or: with hooks.attach(...) as mon:
"""

from hooks.adapters import AdapterError
from hooks.attach import attach, make_sink
from hooks.monitor import Monitor
from hooks.schema import METRICS, Batch, Point, SchemaError
from hooks.sinks import FanOut, HttpSink, JsonlSink, MemorySink, RunInfo, Sink, SinkError

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
