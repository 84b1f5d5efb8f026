"""Hugging Face ``Trainer`` callback: ``Trainer(..., callbacks=[HyperWatchCallback(sink=...)])``.

The monitor is attached to the Trainer's model when training begins and steps after each
optimizer step, while the gradients are still there (``on_optimizer_step``, before
``zero_grad``): step ``s`` is ``state.global_step`` before the Trainer counts it, so the first
optimizer step is step 0. The loss is the step's, from its forwards' outputs (their sum when
the Trainer passes ``num_items_in_batch``, which makes each a share of the step's mean).
``grad_norm``: when the Trainer clips (``max_grad_norm > 0``, its default) the norm the Trainer
logs before clipping is recorded at its logging steps (``logging_steps``); without clipping the
monitor computes it from the gradients. The learning rate is the scheduler's, the token count
the Trainer's ``num_input_tokens_seen`` when it counts them (``include_num_input_tokens_seen``).
The run is named after ``args.run_name`` unless ``run`` is given; the TrainingArguments go into
the run's config.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from hyperwatch.hooks.integrations import Watch, loss_of, run_name

if TYPE_CHECKING:
    from hyperwatch.hooks.attach import SinkSpec

log = logging.getLogger(__name__)


class HyperWatchCallback(TrainerCallback):  # type: ignore[misc]
    """Stability hooks on a ``transformers.Trainer`` run (see the module docstring).

    ``sink``, ``every`` and every keyword of :func:`hooks.attach` (``group=``, ``depth=``,
    ``attention=``...) are passed on; ``every`` defaults to the Trainer's ``logging_steps``.
    """

    def __init__(
        self, sink: SinkSpec = "runs/hyperwatch", run: str | None = None, every: int | None = None, **attach_kwargs: Any
    ) -> None:
        self.watch = Watch(sink, run, every, attach_kwargs)
        self._handle: Any = None
        self._clipped = False

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is None or self.watch.monitor is not None:
            return
        config = {"training_args": args.to_sanitized_dict()}
        model_config: Any = getattr(model, "config", None)
        if hasattr(model_config, "to_diff_dict"):
            config["model_config"] = model_config.to_diff_dict()
        self._clipped = bool(args.max_grad_norm and args.max_grad_norm > 0)
        name = run_name(args.run_name or os.path.basename(str(args.output_dir)), "hf-trainer")
        every = int(args.logging_steps) if args.logging_steps >= 1 else 10
        self.watch.start(model, name, every, config, grad_norm=not self._clipped)
        self._handle = model.register_forward_hook(self._keep_loss, with_kwargs=True)

    def _keep_loss(self, module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        monitor = self.watch.monitor
        if monitor is not None and monitor.gate.armed and module.training:
            self.watch.loss.add(loss_of(output), share=kwargs.get("num_items_in_batch") is not None)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.watch.monitor is None:
            return
        scheduler = kwargs.get("lr_scheduler")
        lr = float(scheduler.get_last_lr()[0]) if scheduler is not None else None
        tokens = int(state.num_input_tokens_seen) if getattr(state, "num_input_tokens_seen", 0) else None
        self.watch.monitor.step(state.global_step, loss=self.watch.loss.take(), lr=lr, tokens=tokens)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        norm = (logs or {}).get("grad_norm")
        monitor = self.watch.monitor
        if monitor is not None and self._clipped and isinstance(norm, (int, float)) and state.global_step > 0:
            monitor.log(state.global_step - 1, {"grad_norm": float(norm)})

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self.watch.close()
