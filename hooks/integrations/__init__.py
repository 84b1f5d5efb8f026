"""Callbacks for the training frameworks people already use: one line each.

- Hugging Face ``Trainer``: ``Trainer(..., callbacks=[HyperWatchCallback(sink="http://localhost:8000")])``
  (:mod:`hooks.integrations.hf`, needs ``transformers``).
- PyTorch Lightning: ``L.Trainer(..., callbacks=[LightningCallback(sink="runs/hw")])``
  (:mod:`hooks.integrations.lightning`, needs ``lightning`` or ``pytorch_lightning``).

Each module imports its framework when it is imported, never before: ``hyperwatch.hooks`` itself
still needs only torch, numpy and the standard library.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hyperwatch.hooks.attach import SinkSpec
    from hyperwatch.hooks.monitor import Monitor

_RUN_CHARS = re.compile(r"[^A-Za-z0-9_.:+=@-]+")


def run_name(raw: Any, default: str) -> str:
    """A framework's run name (often an output folder) as a valid run name: the last path part,
    other characters replaced by ``-``."""
    text = str(raw or "").rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1]
    text = _RUN_CHARS.sub("-", text).strip("-._:+=@")[:200]
    return text or default


class StepLoss:
    """The loss of one optimizer step from its forwards' outputs (``.loss`` or ``["loss"]``), read by
    a forward hook; frameworks pass only averages over logging intervals. Each forward's loss is a
    mean over its own batch, so the step's is their mean; or, when the model was told the step's
    token count (Hugging Face's ``num_items_in_batch``), a share of the step's mean, so their sum."""

    def __init__(self) -> None:
        self.total: Any = None
        self.count = 0
        self.shares = False

    def add(self, loss: Any, share: bool = False) -> None:
        if loss is None or not hasattr(loss, "detach") or loss.numel() != 1:
            return
        value = loss.detach().reshape(())
        self.total = value if self.total is None else self.total + value
        self.count += 1
        self.shares = share

    def take(self) -> Any:
        """The step's loss since the last take (a 0-d tensor: no host sync here), or None."""
        loss = None if self.total is None else self.total if self.shares else self.total / self.count
        self.total, self.count = None, 0
        return loss


def loss_of(output: Any) -> Any:
    if isinstance(output, dict):
        return output.get("loss")
    return getattr(output, "loss", None)


class Watch:
    """What a callback hands to :func:`hooks.attach`, the monitor it made, and the step's loss."""

    def __init__(self, sink: SinkSpec, run: str | None, every: int | None, attach_kwargs: dict[str, Any]) -> None:
        self.sink = sink
        self.run = run
        self.every = every
        self.attach_kwargs = attach_kwargs
        self.monitor: Monitor | None = None
        self.loss = StepLoss()

    def start(self, model: Any, name: str, every: int, config: dict[str, Any], **defaults: Any) -> Monitor:
        # Through the package, never the submodule: importing hyperwatch.hooks.attach first would
        # leave the module, not the function, as hooks.attach for the user's own code.
        from hyperwatch.hooks import attach

        options = {**defaults, **self.attach_kwargs}
        self.monitor = attach(model, self.run or name, self.sink, self.every or every, config, **options)
        return self.monitor

    def close(self, status: str = "finished") -> None:
        if self.monitor is not None:
            self.monitor.close(status)
            self.monitor = None
