"""Figure margins and legends sized to their text, so no label is clipped or drawn over another.

Plotly's fixed margins clipped long tick labels (a loss read as 2.000065 ran its labels into the
axis title at 64 px) and its right-hand legends shrank a half-width panel's plot to a sliver when
the labels were long (sweeps named by method). Here:

- :func:`fit_y_margin` sizes the left margin from the widest tick label the value axis will show
  (Plotly's own formatting: SI prefixes past 1e4 and under 1e-3, the decimals its tick step
  needs). The axes keep ``automargin`` as well (base_layout), which corrects a wrong estimate or a
  toggle (log y) at the cost of a second layout pass; a right estimate costs none.
- :func:`legend_below` puts a legend of long labels under the plot, across the figure's width, and
  makes the figure taller by the rows it may take, so the plot keeps its height.
- :func:`reserve_right` widens the right margin to a legend or a colour bar at the plot's right
  (and the bottom margin of a heatmap to its x labels): a margin they push out costs Plotly a second
  layout pass of the whole figure (a 64-layer run page drew every heatmap twice, 70-190 ms each).
  They sit at x = 1.02, so their margin grows with the plot's width: the figure's ``meta.room_right``
  gives the browser their width alone and ``HW.plot`` (web/static/common.js) adds 2% of the plot's
  width as drawn. An estimate too small only brings the second pass back; too large leaves a few
  pixels blank.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from typing import Any

CHAR_PX = 7.0
"""Width of one character of a 12 px tick label (DejaVu Sans / system-ui digits are 6.4-7 px)."""
LEFT_FIXED = 40
"""The rest of the left margin: the rotated axis title (14 px), the labels' standoff and padding."""
TICKS = 6
"""About how many ticks Plotly puts on a value axis of the pages' figure heights (300-420 px)."""
LEGEND_ROW_PX = 20


def _nice_step(span: float) -> float:
    """Plotly's tick step for ``span``: 1, 2 or 5 times a power of ten, about TICKS per axis."""
    raw = span / TICKS
    power = 10.0 ** math.floor(math.log10(raw))
    for m in (1.0, 2.0, 5.0, 10.0):
        if raw <= m * power:
            return m * power
    return 10.0 * power


def tick_label_chars(values: Iterable[float | None], log: bool = False) -> int:
    """Characters of the widest tick label of an axis over ``values`` (exponentformat "B")."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return 3
    lo, hi = min(finite), max(finite)
    if log:
        return 5 if lo > 0 and (lo < 1e-3 or hi >= 1e4) else max(4, len(f"{hi:g}"))
    big = max(abs(lo), abs(hi))
    span = hi - lo if hi > lo else (abs(hi) * 0.2 or 2.0)  # a flat line gets +-10% (flat_range)
    step = _nice_step(span)
    exp = math.floor(math.log10(big)) if big > 0 else 0
    sign = 1 if lo < 0 else 0
    if abs(exp) > 3:  # Plotly switches to an SI prefix ("22M", "150μ"): one more character
        si = 3 * round((exp - 1) / 3)
        decimals = max(0, si - math.floor(math.log10(step)))
        return sign + len(f"{big / 10**si:.{decimals}f}") + 1
    decimals = max(0, -math.floor(math.log10(step)))
    return sign + max(len(f"{big:.{decimals}f}"), len(f"{lo:.{decimals}f}".lstrip("-")))


def fit_y_margin(layout: dict[str, Any], data: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Widen the left margin to the value axis's widest tick label (traces on the main y axis)."""
    ys = [y for t in data if t.get("yaxis", "y") == "y" and t.get("type") != "heatmap" for y in t.get("y") or []]
    axis = layout["yaxis"]
    rng = axis.get("range") if axis.get("autorange") is False else None
    chars = tick_label_chars(rng if rng else ys, axis.get("type") == "log")
    margin = layout["margin"]
    margin["l"] = max(margin["l"], round(LEFT_FIXED + CHAR_PX * chars))
    return layout


def legend_below(layout: dict[str, Any], data: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A horizontal legend under the plot, the figure taller by a row per entry that may wrap."""
    entries = [t for t in data if t.get("showlegend", True) is not False]
    layout["legend"] = {
        "orientation": "h",
        "x": 0,
        "xanchor": "left",
        "yref": "container",
        "y": 0,
        "yanchor": "bottom",
        "font": {"size": 11},
    }
    layout["height"] = layout.get("height", 340) + LEGEND_ROW_PX * len(entries)
    return layout


LEGEND_CHAR_PX = 6.6
"""Width of one character of an 11 px legend label."""
LEGEND_FIXED = 58
"""The rest of a vertical legend's width: its symbol, the symbol's gap to the text and the padding."""
COLORBAR_CHAR_PX = 7.2
"""Width of one character of a colour bar's 12 px title (drawn above the bar: often its widest part)."""
COLORBAR_FIXED = 44
"""The rest of a colour bar's width beside its title: padding either side of it."""
COLORBAR_TICKS_FIXED = 40
"""A colour bar's width beside its tick labels: the bar (12 px), its padding and the labels' standoff."""
HEATMAP_BOTTOM = 56
"""A heatmap's bottom margin: its x tick labels and title sit lower than a line chart's (52 px measured)."""
PAPER_GAP = 0.02
"""Legends and colour bars sit at x = 1.02: 2% of the plot's width between it and them (HW.plot's GAP)."""
PLOT_PX = 900
"""The plot width the margin the server sends assumes (a half-width panel at 1920 px); HW.plot sizes it
to the width drawn."""


def _chars(text: str) -> int:
    """Characters of a label as drawn (the escaped HTML Plotly gets, read back to its text)."""
    return len(html.unescape(text))


def reserve_right(layout: dict[str, Any], data: Sequence[dict[str, Any]]) -> int:
    """Room at the right for the vertical legend Plotly draws (two or more legend entries) and for
    each heatmap's colour bar, and at the bottom for a heatmap's x labels, so automargin pushes
    nothing out and Plotly lays the figure out once. Returns the px the legend or colour bar takes
    right of the plot's gap (0: none), for the figure's ``meta.room_right``."""
    margin = layout["margin"]
    room = 0.0
    legend = layout.get("legend") or {}
    entries = [t for t in data if t.get("showlegend", True) is not False and t.get("type") != "heatmap"]
    shown = layout.get("showlegend")
    if shown is not False and legend.get("orientation") != "h" and (len(entries) >= 2 or shown is True):
        room = LEGEND_FIXED + LEGEND_CHAR_PX * max((_chars(str(t.get("name", ""))) for t in entries), default=0)
    for t in data:
        if t.get("type") != "heatmap" or t.get("showscale") is False:
            continue
        title = str(((t.get("colorbar") or {}).get("title") or {}).get("text", ""))
        z = [v for row in t.get("z") or [] for v in row]
        zs = z + [t[k] for k in ("zmin", "zmax") if t.get(k) is not None]
        ticks = COLORBAR_TICKS_FIXED + CHAR_PX * tick_label_chars(zs)
        room = max(room, ticks, COLORBAR_FIXED + COLORBAR_CHAR_PX * _chars(title))
        margin["b"] = max(margin["b"], HEATMAP_BOTTOM)
    if room:
        margin["r"] = max(margin["r"], round(room + PAPER_GAP * PLOT_PX))
    return math.ceil(room)
