"""The run page's heads x layers heatmap: each attention head's ceiling at the newest logged step.

``attention_lse_max.h<k>`` is head k's largest log-sum-exp over the step's queries, so its largest
attention logit lies in [value - log T, value] (T keys): a QK-clip-style watch (Kimi K2 clips a
head whose max logit passes 100). One cell per (layer, head); a head that reported nothing at that
step is blank, a NaN or Inf is blank and crossed in red, as in every heatmap of the pages.
"""

from __future__ import annotations

from typing import Any

from hyperwatch.monitor.read.reader import HeadMatrix
from hyperwatch.web.figures import base_layout, heatmap_traces, note
from hyperwatch.web.layout import reserve_right
from hyperwatch.web.scale import esc


def heads_figure(m: HeadMatrix, limit: float | None = None) -> dict[str, Any]:
    """The heatmap (x: head, y: layer); ``limit`` (the run's ``attention_lse_max_limit``) is named in the title."""
    if m.step is None or not m.heads:
        layout = base_layout(f"{esc(m.name)} per head", "head", "layer", 300)
        layout.pop("yaxis2")
        layout["annotations"] = [note("no per-head values yet: the hooks send attention_lse_max.h<k> with attention Z")]
        return {"data": [], "layout": layout, "meta": {"name": m.name, "step": None, "heads": []}}
    data = heatmap_traces(m.name, list(m.heads), m.layers, m.values, "layer %{y}, head %{x}<br>max LSE %{z:.5g}", "")
    limit_words = f"; the ceiling alert fires above {limit:g}" if limit is not None else ""
    title = f"{esc(m.name)} per head at step {m.step} (max logit in [value − log T, value]{limit_words})"
    layout = base_layout(title, "head", "layer", 300)
    layout.pop("yaxis2")
    layout["xaxis"].update(dtick=1 if len(m.heads) <= 32 else None)
    layout["yaxis"].update(dtick=1 if len(m.layers) <= 24 else None)
    room = reserve_right(layout, data)  # the colour bar's room: laid out once (web/layout.py)
    meta = {"name": m.name, "step": m.step, "heads": list(m.heads), "room_right": room}
    return {"data": data, "layout": layout, "meta": meta}
