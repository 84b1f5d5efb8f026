"""Hugging Face ``Trainer`` callback: ``Trainer(..., callbacks=[HyperWatchCallback(sink=...)])``.

The monitor is attached to the Trainer's model when training begins and steps after each
optimizer step, while the gradients are still there (``on_optimizer_step``, before
``zero_grad``). Steps are numbered as the Trainer's own logs number them: the first optimizer
step is step 1 (``state.global_step`` once the Trainer has counted it), so the logged steps are
the Trainer's logging steps (``logging_steps``: 5, 10, 15...; the first step is logged too). The
loss is the step's, from its forwards' outputs (their sum when the Trainer passes
``num_items_in_batch``, which makes each a share of the step's mean). ``grad_norm``: when the
Trainer clips (``max_grad_norm > 0``, its default) the norm the Trainer logs before clipping is
recorded at its logging steps, under the same step numbers; without clipping the monitor
computes it from the gradients. The learning rate is the scheduler's.

Budget: the run's ``total_steps`` is ``state.max_steps``. Tokens (input tokens, padding
included, over all processes) are the Trainer's ``num_input_tokens_seen`` when it counts them
(``include_num_input_tokens_seen``); otherwise they are counted from the model's inputs
(``input_ids``) when that count is exact: a single process training from step 0, or every
micro-batch of the same shape (then a step is ``gradient_accumulation_steps x world_size`` such
micro-batches). With tokens per step and ``total_steps`` the monitor learns the token budget
(hence FLOPs and the fraction of training) from two logged steps. Otherwise the run has no
token count, and a warning says how to get one.

The run is named after ``args.run_name`` unless ``run`` is given; the TrainingArguments go into
the run's config.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import torch
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
        self._input_name = "input_ids"
        self._seen = 0  # input tokens of this process's training forwards, since train begin
        self._shape: tuple[int, ...] | None = None  # the micro-batches' shape while they all share one
        self._fixed = True  # every micro-batch so far had the same shape
        self._micro = 0  # micro-batches counted
        self._first_step = 0  # state.global_step at train begin (> 0 when resumed)
        self._per_step = 1  # micro-batches per step over all processes: accumulation x world size
        self._world = 1
        self._warned_tokens = False

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is None or self.watch.monitor is not None:
            return
        config = {"training_args": args.to_sanitized_dict()}
        model_config: Any = getattr(model, "config", None)
        if hasattr(model_config, "to_diff_dict"):
            config["model_config"] = model_config.to_diff_dict()
        self._clipped = bool(args.max_grad_norm and args.max_grad_norm > 0)
        name = run_name(args.run_name or os.path.basename(str(args.output_dir)), "hf-trainer")
        logging_steps = getattr(state, "logging_steps", None) or args.logging_steps  # a ratio resolved by the Trainer
        every = int(logging_steps) if logging_steps >= 1 else 10
        budget: dict[str, Any] = {}
        max_steps = getattr(state, "max_steps", 0)
        if isinstance(max_steps, int) and max_steps > 0:
            budget["total_steps"] = max_steps
        self._input_name = str(getattr(model, "main_input_name", None) or "input_ids")
        self._first_step = int(state.global_step or 0)
        self._world = max(1, int(getattr(args, "world_size", 1) or 1))
        self._per_step = max(1, int(args.gradient_accumulation_steps)) * self._world
        monitor = self.watch.start(model, name, every, config, grad_norm=not self._clipped, **budget)
        if monitor.budget is not None and monitor.budget.total_steps is not None:
            # The budget is extrapolated to the last step, which the monitor takes to be
            # total_steps - 1 (steps from 0); the Trainer's last step is max_steps (steps from 1).
            monitor.budget.total_steps += 1
        self._handle = model.register_forward_hook(self._on_forward, with_kwargs=True)

    def _on_forward(self, module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        monitor = self.watch.monitor
        if monitor is None or not module.training or not torch.is_grad_enabled():
            return  # evaluation, generation
        inputs = kwargs.get(self._input_name, args[0] if args else None)
        if isinstance(inputs, torch.Tensor):  # shapes only: no device sync
            shape = tuple(inputs.shape)
            self._seen += inputs.numel()
            self._micro += 1
            if self._shape is None:
                self._shape = shape
            elif shape != self._shape:
                self._fixed = False
        else:
            self._fixed = False
        if monitor.gate.armed:
            self.watch.loss.add(loss_of(output), share=kwargs.get("num_items_in_batch") is not None)

    def _tokens(self, state: Any) -> int | None:
        """Input tokens seen through this step over all processes, when they can be known exactly."""
        seen = getattr(state, "num_input_tokens_seen", 0)
        if isinstance(seen, int) and seen > 0:  # the Trainer's own count, gathered over processes
            return seen
        if self._world == 1 and self._first_step == 0 and self._micro > 0:
            return self._seen  # every forward of this run went through the hook
        if self._fixed and self._shape is not None and self._micro > 0:
            per_micro = self._seen // self._micro
            return self._seen * self._world + self._first_step * self._per_step * per_micro
        if not self._warned_tokens:
            self._warned_tokens = True
            log.warning(
                "hooks: the run's token count is unknown (%s); pass TrainingArguments("
                "include_num_input_tokens_seen=True) for the tokens, FLOPs and fraction-of-training axes",
                "micro-batches of different shapes over several processes or after a resume"
                if self._micro
                else f"the model's forwards get no {self._input_name!r} tensor",
            )
        return None

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.watch.monitor is None:
            return
        scheduler = kwargs.get("lr_scheduler")
        lr = float(scheduler.get_last_lr()[0]) if scheduler is not None else None
        # The Trainer counts this step after the callback: its number in the Trainer's logs is the next.
        step = state.global_step + 1
        self.watch.monitor.step(step, loss=self.watch.loss.take(), lr=lr, tokens=self._tokens(state))

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        norm = (logs or {}).get("grad_norm")
        monitor = self.watch.monitor
        if monitor is not None and self._clipped and isinstance(norm, (int, float)) and state.global_step > 0:
            monitor.log(state.global_step, {"grad_norm": float(norm)})  # the step the Trainer logs it at

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self.watch.close()
