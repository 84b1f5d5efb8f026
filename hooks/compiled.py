"""What the hooks need to know about ``torch.compile``, whatever the order of compile and attach.

- :func:`unwrap`: the eager module behind ``torch.compile(model)``'s ``OptimizedModule`` wrapper
  (``_orig_mod``): plans, hooks and discovery work on it; the wrapper calls it.
- :func:`is_compiled`: the model, or a block of it, is compiled (an ``OptimizedModule`` in the
  tree, or ``Module.compile()`` in place); :func:`entered_through_compile`: the forward being
  run was entered through a compiled wrapper (a frame of dynamo's ``eval_frame`` on the stack),
  which is how ``attach(model)`` followed by ``torch.compile(model)`` shows itself.
- :class:`EagerSteps`: residual-stream discovery traces one forward in Python
  (``hooks.tracer``), which dynamo cannot trace; while discovery is pending, the forwards of a
  logged step run eagerly (``torch.compiler.set_stance("force_eager")``), so the first logged
  step after ``attach`` is eager and the model compiles from the next one, with the hooks that
  discovery chose already in place.
- :func:`drop_stale_graphs`: a model that ran compiled before ``attach`` has graphs cached
  without the hooks, and dynamo does not guard on module hooks; those cache entries are dropped
  (``reset_code`` on ``nn.Module``'s call code and the model's ``forward`` code), so its next
  forward compiles with the hooks. Which module a cached graph belongs to cannot be told from
  its code object: graphs of other compiled modules are dropped too, and compile once more.

Everything here uses dynamo's internals defensively: a torch without them leaves the feature
off, with a debug log line, never an exception.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

_EVAL_FRAME = ("torch/_dynamo/eval_frame.py", "torch\\_dynamo\\eval_frame.py")


def _optimized_module() -> type | None:
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except ImportError:  # a torch without dynamo
        return None
    return OptimizedModule  # type: ignore[no-any-return]


def unwrap(model: nn.Module) -> nn.Module:
    """``model`` without the ``torch.compile`` wrappers around it (``OptimizedModule._orig_mod``)."""
    wrapper = _optimized_module()
    while wrapper is not None and isinstance(model, wrapper):
        inner = getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            break
        model = inner
    return model


def is_compiled(model: nn.Module, among: list[nn.Module] | None = None) -> bool:
    """Whether ``model`` or one of its modules is compiled: a wrapper in the tree, or in place.
    ``among``: look at these modules only (the model and its blocks: cheap enough for every
    logged step), not at the whole tree."""
    wrapper = _optimized_module()
    for m in model.modules() if among is None else among:
        if wrapper is not None and isinstance(m, wrapper):
            return True
        if getattr(m, "_compiled_call_impl", None) is not None:
            return True
    return False


def entered_through_compile() -> bool:
    """Whether the running forward was called through a compiled function or module (run eagerly
    under a stance, or skipped by dynamo): a frame of dynamo's ``eval_frame`` is on the stack."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(_EVAL_FRAME):
            return True
        frame = frame.f_back
    return False


class EagerSteps:
    """``torch.compiler.set_stance("force_eager")`` between :meth:`begin` and :meth:`end`
    (idempotent; the stance that was set before is restored)."""

    def __init__(self) -> None:
        self._stance: Any = None

    @property
    def on(self) -> bool:
        return self._stance is not None

    def begin(self) -> None:
        if self._stance is not None or torch.compiler.is_compiling():
            return
        try:
            self._stance = torch.compiler.set_stance("force_eager")
        except Exception as exc:  # a torch without stances: discovery then skips compiled forwards
            log.debug("hooks: torch.compiler.set_stance('force_eager') is unavailable (%s)", exc)

    def end(self) -> None:
        stance, self._stance = self._stance, None
        if stance is not None:
            try:
                stance.__exit__(None, None, None)
            except Exception:  # restoring a stance must not take training down
                log.exception("hooks: restoring the compiler stance failed")


def _codes(model: nn.Module) -> list[Any]:
    codes = [nn.Module._wrapped_call_impl.__code__, nn.Module._call_impl.__code__]
    for m in model.modules():
        forward = getattr(type(m), "forward", None)
        code = getattr(forward, "__code__", None)
        if code is not None and code not in codes:
            codes.append(code)
    return codes


def drop_stale_graphs(model: nn.Module) -> int:
    """Drop dynamo's cached graphs of the model's code (compiled before the hooks were attached);
    returns how many code objects had graphs. Graphs of other modules that share
    ``nn.Module``'s call code are recompiled on their next call too."""
    try:
        from torch._C._dynamo.eval_frame import reset_code
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    except ImportError as exc:
        log.debug("hooks: dynamo's code cache is not reachable (%s)", exc)
        return 0
    stale = 0
    for code in _codes(model):
        try:
            if _debug_get_cache_entry_list(code):
                reset_code(code)
                stale += 1
        except Exception as exc:  # an API drift: leave the caches as they are
            log.debug("hooks: could not drop the compiled graphs of %s (%s)", code.co_name, exc)
    return stale


STALE_NOTE = (
    "dynamo held graphs of module code compiled before hooks.attach (this model's, or another module's: "
    "they share nn.Module's call code); dynamo does not guard on module hooks, so they could have run without "
    "the hooks: they were dropped, and the next compiled forward compiled again, with the hooks"
)
EAGER_NOTE = (
    "compiled model: the first logged step after attach ran eagerly (torch.compiler.set_stance('force_eager')) "
    "so that residual-stream discovery could trace it; the model compiles from the next step, with the hooks "
    "discovery chose (pass hooks.attach(..., attention='<glob>', mlp='<glob>') to skip discovery)"
)
