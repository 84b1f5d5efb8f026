"""PyTorch Lightning callback: ``L.Trainer(..., callbacks=[LightningCallback(sink=...)])``.

The monitor is attached to the LightningModule when fitting starts and steps after each
optimizer step (``on_train_batch_end`` once ``trainer.global_step`` has moved: with gradient
accumulation the micro-batches of a step are one step), before the next step's ``zero_grad``,
so the monitor computes ``grad_norm`` from the gradients (after clipping, if ``gradient_clip_val``
is set). The loss is the mean of the step's ``training_step`` losses (Lightning hands each one
divided by ``accumulate_grad_batches``: their sum); the learning rate the first optimizer's.
Works with ``lightning`` and with the older ``pytorch_lightning`` package (the callback
subclasses whichever is installed, ``lightning`` first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hyperwatch.hooks.integrations import Watch, loss_of, run_name

if TYPE_CHECKING:
    from hyperwatch.hooks.attach import SinkSpec

Callback: Any
try:
    from lightning.pytorch import Callback
except ImportError:  # the older package name
    from pytorch_lightning import Callback


class LightningCallback(Callback):  # type: ignore[misc]
    """Stability hooks on a Lightning run (see the module docstring); the keywords of
    :func:`hooks.attach` (``group=``, ``depth=``, ``attention=``...) are passed on."""

    def __init__(
        self, sink: SinkSpec = "runs/hyperwatch", run: str | None = None, every: int = 10, **attach_kwargs: Any
    ) -> None:
        super().__init__()
        self.watch = Watch(sink, run, every, attach_kwargs)
        self._stepped = 0

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if self.watch.monitor is not None:
            return
        hparams = dict(getattr(pl_module, "hparams", {}) or {})
        name = run_name(getattr(trainer.logger, "name", None) or type(pl_module).__name__, "lightning")
        self.watch.start(pl_module, name, 10, {"hparams": hparams})
        self._stepped = trainer.global_step

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        monitor = self.watch.monitor
        if monitor is None:
            return
        if monitor.gate.armed:  # Lightning divides each micro-batch's loss by accumulate_grad_batches
            self.watch.loss.add(loss_of(outputs) if isinstance(outputs, dict) else outputs, share=True)
        if trainer.global_step == self._stepped:  # an accumulating micro-batch: the step is not done
            return
        self._stepped = trainer.global_step
        lr = float(trainer.optimizers[0].param_groups[0]["lr"]) if trainer.optimizers else None
        monitor.step(trainer.global_step - 1, loss=self.watch.loss.take(), lr=lr)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.watch.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.watch.close("failed")
