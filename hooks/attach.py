"""``hooks.attach``: find the model's layers, build the sink, return a :class:`Monitor`."""

from __future__ import annotations

import math
import numbers
import os
import re
import sys
import weakref
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hyperwatch.hooks import compiled, environment, indicators, lifecycle
from hyperwatch.hooks.adapters import discover
from hyperwatch.hooks.describe import BudgetFromSteps, describe
from hyperwatch.hooks.monitor import Monitor
from hyperwatch.hooks.sinks.base import FanOut, RunInfo, Sink, SinkError
from hyperwatch.hooks.sinks.http import HttpSink, check_close_timeout, default_close_timeout
from hyperwatch.hooks.sinks.jsonl import JsonlSink

SinkSpec = Sink | str | os.PathLike[str] | list[Any] | tuple[Any, ...]

_ATTACHED: weakref.WeakKeyDictionary[nn.Module, Monitor] = weakref.WeakKeyDictionary()
"""Each module a live monitor watches -> that monitor (two monitors on one module would book one
module's outputs twice, under names of the other's plan)."""


def attached(model: nn.Module) -> Monitor | None:
    """The open monitor attached to ``model`` (or to a module inside it, or around it), else None."""
    model = compiled.unwrap(model)
    for m in model.modules():
        mon = _ATTACHED.get(m)
        if mon is not None and not mon.closed and mon.probes:
            return mon
    return None


def _refuse_second(model: nn.Module) -> None:
    mon = attached(model)
    if mon is not None:
        raise RuntimeError(
            f"hooks.attach: this model already has a monitor attached (run {mon.run.name!r}); a second one would "
            "measure the same modules twice. Close the first one (mon.close(), or hooks.attached(model).close()) "
            "before attaching again"
        )


_HOST_PORT = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?:[0-9]{1,5}(/.*)?$")
"""``host:port[/path]``: a service address without its scheme, not a folder a user would name."""


def _check_folder_string(sink: str) -> None:
    """Refuse strings that are service addresses missing their scheme (they would silently become a
    folder named ``localhost:8000``). A path that exists stays a folder, and so does any string
    that is plainly a path (``./localhost:8000``, ``runs/x``, a pathlib.Path)."""
    if "://" in sink:
        scheme = sink.split("://", 1)[0]
        raise SinkError(
            f"sink={sink!r}: the {scheme}:// scheme is not supported; give an http:// or https:// URL of "
            "the service, e.g. sink='http://localhost:8000', or a folder path for offline JSONL"
        )
    if _HOST_PORT.match(sink) and not os.path.exists(sink):
        raise SinkError(
            f"sink={sink!r} has no scheme: did you mean http://{sink}? "
            f"(to write an offline JSONL folder by that name, pass './{sink}' or pathlib.Path({sink!r}))"
        )


def make_sink(
    sink: SinkSpec,
    spool: str | os.PathLike[str] | None = None,
    token: str | None = None,
    close_timeout: float | None = None,
) -> Sink:
    """``"http(s)://..."`` -> HttpSink (with spool); a path -> JsonlSink; a list -> FanOut; a Sink as is.

    A string that looks like ``host:port`` (no scheme) is refused with the URL it probably meant.
    """
    if isinstance(sink, Sink):
        return sink
    if isinstance(sink, (list, tuple)):
        if not sink:
            raise SinkError("sink: the list is empty; give at least one URL, folder or Sink")
        return FanOut([make_sink(s, spool, token, close_timeout) for s in sink])
    if isinstance(sink, str) and sink.startswith(("http://", "https://")):
        return HttpSink(sink, token=token, spool=spool, close_timeout=close_timeout)
    if isinstance(sink, str):
        _check_folder_string(sink)
    if isinstance(sink, (str, os.PathLike)):
        return JsonlSink(sink)
    raise SinkError(
        f"sink: {type(sink).__name__} is not a sink; pass an http(s) URL, a folder path, a hooks.Sink or a list"
    )


def _environment(model: nn.Module, family: str, every: int, n_layers: int) -> dict[str, Any]:
    """The hooks' settings and what the run runs on (git commit, host, versions, devices: see
    :func:`hooks.environment.describe`, which never raises)."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    env: dict[str, Any] = {
        "hooks_adapter": family,
        "every": every,
        "layers": n_layers,
        "model_class": type(model).__name__,
        "argv": sys.argv[:1],
    }
    env.update(environment.describe(device))
    return env


LR_KEYS = ("lr", "learning_rate")
"""Config keys whose number is the run's ``lr`` field when ``lr=`` is not given (issue 35)."""


def lr_from_config(config: dict[str, Any] | None, run_fields: dict[str, Any]) -> dict[str, Any]:
    """``run_fields`` with ``lr`` from ``config["lr"]`` (else ``config["learning_rate"]``) when the
    caller gave no ``lr=``: the number the user declared, sent as the run field the runs table, the
    API and the scaling fits read. Only a positive finite number is copied (a schedule's name, a
    list of rates or a bool is not a learning rate); an explicit ``lr=`` always wins."""
    if "lr" in run_fields or not config:
        return run_fields
    for key in LR_KEYS:
        v = config.get(key)
        if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(x := float(v)) and x > 0:
            return {**run_fields, "lr": x}
    return run_fields


def attach(
    model: nn.Module,
    run: str,
    sink: SinkSpec,
    every: int = 10,
    config: dict[str, Any] | None = None,
    *,
    adapter: str = "auto",
    attention: str | None = None,
    mlp: str | None = None,
    router: str | None = None,
    top_k: int | None = None,
    weights: bool = False,
    grad_norm: bool = True,
    process_group: Any = None,
    spool: str | os.PathLike[str] | None = None,
    token: str | None = None,
    chunk_elements: int = indicators.DEFAULT_CHUNK_ELEMENTS,
    close_timeout: float | None = None,
    total_steps: int | None = None,
    tokens: int | None = None,
    flops_per_token: float | None = None,
    resume: bool = False,
    **run_fields: Any,
) -> Monitor:
    """Attach stability hooks to ``model`` and stream them to ``sink`` every ``every`` steps.

    - ``run``: the run's name; ``config``: its configuration (stored once with the run);
      ``run_fields``: the service's run fields (project, group, tags, depth, width, tokens, flops,
      lr, optimizer, parameterization...: the list is ``hooks.sinks.base.RUN_FIELDS``). Without
      ``lr=``, a number at ``config["lr"]`` or ``config["learning_rate"]`` is sent as ``lr``.
    - ``sink``: ``"http://host:8000"`` (spooled in ``spool``; write token from ``token``, else
      ``$HYPERWATCH_WRITE_TOKEN``, the variable the service reads, else the older
      ``$HYPERWATCH_TOKEN``), a folder for offline JSONL, a :class:`hooks.Sink`, or a list of them.
    - ``attention``/``mlp``/``router``: globs over module names that override the branches found
      by what the residual stream receives (``top_k``: experts per token when the router returns
      bare logits). Never an error for a model it can partly measure: the rest is ``unavailable``.
    - ``weights``: also each hidden matrix's Frobenius norm and update/weight ratio.
    - ``grad_norm``: compute the gradient norm when ``step`` is not given one.
    - ``total_steps``: optimizer steps the run will take; ``tokens``: its token budget (training
      tokens over all steps). Either one lets pages draw it against tokens, FLOPs and the fraction
      of training; with ``total_steps`` alone the budget is learned from the tokens passed to
      ``mon.step`` and sent once. ``flops_per_token``: training FLOPs per token (default 6N, N the
      ``active_params`` when given, else the parameters counted from the model, sent as
      ``total_params``); the run's ``flops`` is that times the budget.
    - ``resume``: continue the stored run of this name (after a crash, from a checkpoint). Without
      it, a name whose run ended (finished, failed...) or belongs to another process is refused by
      the service and the error says so; the spool keeps the batches for this process's run only.
    - ``close_timeout``: ``close()`` returns within about this many seconds (default
      ``$HYPERWATCH_CLOSE_TIMEOUT``, else 5): what the HTTP sink has not delivered by then stays in
      its spool, and the exact ``hyperwatch upload <spool folder> --server <url>`` command is logged.

    A monitor still open when the process ends is closed then (see :mod:`hooks.lifecycle`): the run
    is marked ``finished`` on a normal exit, ``failed`` on an uncaught exception or a non-zero
    ``sys.exit``, ``interrupted`` on Ctrl-C.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: must be a torch.nn.Module, got {type(model).__name__}")
    model = compiled.unwrap(model)  # torch.compile's wrapper calls this module: hook it, not the wrapper
    _refuse_second(model)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every: must be an integer >= 1 (log every N steps), got {every!r}")
    if config is not None and not isinstance(config, dict):
        raise ValueError(f"config: must be a dict (stored as the run's JSON config), got {type(config).__name__}")
    if isinstance(chunk_elements, bool) or not isinstance(chunk_elements, int) or chunk_elements < 1:
        raise ValueError(f"chunk_elements: must be a positive integer, got {chunk_elements!r}")
    if not isinstance(resume, bool):
        raise ValueError(f"resume: must be True or False (continue the stored run of this name), got {resume!r}")
    given = {k: v for k, v in (("total_steps", total_steps), ("tokens", tokens)) if v is not None}
    run_fields = lr_from_config(config, run_fields)
    run_fields = describe(model, {**run_fields, **given}, flops_per_token)
    plan = discover(model, adapter, attention, mlp, router, top_k)
    n_layers = max((s.index for s in plan.layers), default=-1) + 1
    full_config = dict(config or {})
    full_config.setdefault("_hyperwatch", {**_environment(model, plan.family, every, n_layers), **plan.notes})
    info = RunInfo(name=run, config=full_config, fields={"status": "running", **run_fields}, resume=resume)
    rank0 = not (dist.is_available() and dist.is_initialized()) or dist.get_rank(process_group) == 0
    timeout = default_close_timeout() if close_timeout is None else check_close_timeout(close_timeout)
    built = make_sink(sink, spool, token, timeout) if rank0 else None
    mon = Monitor(
        model,
        plan,
        info,
        built,
        every=every,
        weights=weights,
        process_group=process_group,
        chunk_elements=chunk_elements,
        auto_grad_norm=grad_norm,
        close_timeout=timeout,
    )
    mon.budget = BudgetFromSteps(run_fields, flops_per_token)
    for m in model.modules():
        _ATTACHED[m] = mon
    lifecycle.watch(mon)
    return mon
