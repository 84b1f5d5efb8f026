"""How a run is named and coloured on every page: "d=12 · 570M", a sequential colour by model size.

Every user string that goes into a figure (run names, labels, messages) passes through
:func:`esc`: Plotly renders a small set of HTML tags inside text and decodes entities, so an
escaped ``<img src=x onerror=...>`` shows as those characters and is never parsed as a tag.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

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
