"""hooks: stability indicators for any PyTorch training run, streamed without loss.

Imports only torch, numpy and the standard library: it goes into other people's training
environments.
"""

from hooks.schema import METRICS, Batch, Point, SchemaError

__all__ = ["METRICS", "Batch", "Point", "SchemaError"]
