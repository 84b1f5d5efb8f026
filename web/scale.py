"""How a run is named and coloured on every page: "d=12 · 570M", a sequential colour by model size.

Every user string that goes into a figure (run names, labels, messages) passes through
:func:`esc`: Plotly renders a small set of HTML tags inside text and decodes entities, so an
escaped ``<img src=x onerror=...>`` shows as those characters and is never parsed as a tag.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

from hyperwatch.monitor.store.entities import Run

# Viridis, dark (small models) to light (large models), stopping short of the pale yellow end
# that vanishes on a white background.
_STOPS = ("#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b")
UNKNOWN_SIZE_COLOUR = "#7f7f7f"
NONFINITE_COLOUR = "#d62728"


def esc(text: object) -> str:
    """HTML-escape any user string placed in a figure (names, labels, hover text)."""
    return html.escape(str(text), quote=True)


def human_count(n: float) -> str:
    """570_000_000 -> "570M", 1.2e9 -> "1.2B", 35_000 -> "35K" (three significant digits at most)."""
    if not math.isfinite(n):
        return str(n)
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.3g}{suffix}"
    return f"{n:.3g}"


def size_of(run: Run) -> float | None:
    """The model size that orders and colours runs: total parameters, else active, else depth."""
    for value in (run.total_params, run.active_params, run.depth):
        if value:
            return float(value)
    return None


def scale_label(run: Run) -> str:
    """ "d=12 · 570M" (depth and parameters; active parameters when they differ), else the run name."""
    parts = []
    if run.depth:
        parts.append(f"d={run.depth}")
    if run.total_params:
        parts.append(human_count(run.total_params))
        if run.active_params and run.active_params != run.total_params:
            parts.append(f"{human_count(run.active_params)} active")
    elif run.active_params:
        parts.append(f"{human_count(run.active_params)} active")
    return " · ".join(parts) if parts else run.name


def labels(runs: Sequence[Run]) -> dict[int, str]:
    """Scale labels, made unique within the set by appending the run name where two coincide."""
    base = {r.id: scale_label(r) for r in runs}
    counts: dict[str, int] = {}
    for label in base.values():
        counts[label] = counts.get(label, 0) + 1
    out = {}
    for r in runs:
        lab = base[r.id]
        out[r.id] = f"{lab} · {r.name}" if counts[lab] > 1 and lab != r.name else lab
    return out


def _interpolate(t: float) -> str:
    """The colour at t in [0, 1] along the stops (linear in RGB)."""
    t = min(1.0, max(0.0, t))
    pos = t * (len(_STOPS) - 1)
    i = min(int(pos), len(_STOPS) - 2)
    frac = pos - i
    a = [int(_STOPS[i][k : k + 2], 16) for k in (1, 3, 5)]
    b = [int(_STOPS[i + 1][k : k + 2], 16) for k in (1, 3, 5)]
    return "#" + "".join(f"{round(x + (y - x) * frac):02x}" for x, y in zip(a, b, strict=True))


def colours(runs: Sequence[Run]) -> dict[int, str]:
    """A sequential colour per run by log model size; runs of unknown size are grey."""
    sizes = {r.id: size_of(r) for r in runs}
    known = [math.log(s) for s in sizes.values() if s is not None]
    lo, hi = (min(known), max(known)) if known else (0.0, 0.0)
    out = {}
    for rid, s in sizes.items():
        if s is None:
            out[rid] = UNKNOWN_SIZE_COLOUR
        else:
            out[rid] = _interpolate(0.5 if hi == lo else (math.log(s) - lo) / (hi - lo))
    return out


def order_by_size(runs: Sequence[Run]) -> list[Run]:
    """Smallest model first (legend order); unknown sizes last, then by id."""
    return sorted(runs, key=lambda r: (size_of(r) is None, size_of(r) or 0.0, r.id))


@dataclass(frozen=True)
class SizeAxis:
    """What a scale page's x axis measures for a set of runs, and whether a verdict may be read off it.

    Parameters when every sized run has them (total, else active), else depth, labelled so: the
    axis says what it plots. ``blocker`` is set when runs of different lengths share one size: the
    verdict takes the worst run of a size, so a longer run alone would read "breaks at" that size."""

    field: str  # "params", "depth" or "" (no run has a size)
    label: str
    blocker: str | None = None

    def of(self, run: Run) -> float | None:
        if self.field == "params":
            value = run.total_params or run.active_params
        elif self.field == "depth":
            value = run.depth
        else:
            value = None
        return float(value) if value else None


def _length(run: Run) -> int | None:
    """The run's length in steps: ``total_steps``, else the steps of a finished run (None: unknown yet)."""
    if run.total_steps:
        return run.total_steps
    return run.last_step + 1 if run.status == "finished" and run.last_step is not None else None


def size_axis(runs: Sequence[Run]) -> SizeAxis:
    """The :class:`SizeAxis` of ``runs`` (runs without any point are left out: nothing to place)."""
    started = [r for r in runs if r.last_step is not None] or list(runs)
    if started and all(r.total_params or r.active_params for r in started):
        axis = SizeAxis("params", "model size (parameters)")
    elif started and all(r.depth for r in started):
        axis = SizeAxis("depth", "depth (blocks; no parameter count: hooks.attach counts it)")
    elif any(r.total_params or r.active_params for r in started):
        axis = SizeAxis("params", "model size (parameters; runs without a count left out)")
    else:
        axis = SizeAxis("depth", "depth (blocks)")
    by_size: dict[float, list[Run]] = {}
    for r in started:
        size = axis.of(r)
        if size is not None:
            by_size.setdefault(size, []).append(r)
    for size, same in sorted(by_size.items()):
        lengths = {n for n in map(_length, same) if n is not None}
        if len(lengths) > 1:
            where = f"depth {size:g}" if axis.field == "depth" else human_count(size)
            shown = ", ".join(f"{r.name}: {_length(r)} steps" for r in same[:3])
            why = (
                f"n/a: runs of different lengths at {where} ({shown}); the verdict compares one length "
                "per size: put the runs of one length in a group of their own"
            )
            return SizeAxis(axis.field, axis.label, why)
    return axis
