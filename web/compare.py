"""The comparison page's JSON: any runs (across groups and projects) on one chart, under ``/ui/data``.

One indicator, one layer choice (the mean or the max over layers, or one layer), x by step, tokens,
FLOPs or fraction of training; every number through the read layer (:class:`monitor.read.reader.Reader`),
the same lines the group page and the API give. Runs are coloured by a categorical palette (runs of
different groups may share a size, so the group page's size colours would collide) and labelled
``project/group/name``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from hyperwatch.monitor.analysis import jsonable
from hyperwatch.monitor.api.deps import QueryReaderDep
from hyperwatch.monitor.api.params import line_query
from hyperwatch.monitor.api.schemas import MetricName
from hyperwatch.monitor.core.errors import InvalidInputError
from hyperwatch.monitor.read.lines import TokenMap
from hyperwatch.monitor.read.reader import layer_number
from hyperwatch.monitor.store.entities import Run
from hyperwatch.web.data import GL, Buckets, live_cursor
from hyperwatch.web.figures import RunLine, XAxis, compare_figure

router = APIRouter(prefix="/ui/data", tags=["web"], include_in_schema=False)

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
LayerChoice = Annotated[str, line_query("layer", ("mean", "max"), "mean or max over layers, or a layer number")]


def run_label(run: Run) -> str:
    """``project/group/name`` (``project/name`` for a run outside any group)."""
    return "/".join(p for p in (run.project, run.group, run.name) if p)


@router.get("/compare")
def compare_runs(
    read: QueryReaderDep,
    run_id: Annotated[list[int], Query(description="repeat for each run")],
    name: Annotated[MetricName, Query()] = "attention_z",
    layer: LayerChoice = "mean",
    x: XAxis = "step",
    buckets: Buckets = 400,
    gl: GL = False,
) -> dict[str, Any]:
    """Any runs' line of one indicator on one x-axis, with what each run can offer to pick from."""
    read.buckets(buckets)
    runs = read.runs_by_id(run_id)
    lines: list[RunLine] = []
    names: set[str] = set()
    n_layers = 0
    out_runs = []
    for i, run in enumerate(runs):
        latest = read.index(run)
        names.update(s.name for s in latest)
        n_layers = max(n_layers, 1 + max((s.layer for s in latest if s.layer is not None), default=-1))
        colour, label = PALETTE[i % len(PALETTE)], run_label(run)
        out_runs.append({"id": run.id, "label": label, "colour": colour, "status": run.status,
                         "last_step": run.last_step, "group_id": run.group_id})  # fmt: skip
        if not any(s.name == name for s in latest):
            continue
        tmap = read.token_map(run, latest) if x != "step" else TokenMap((), None)
        line = read.line(run, name, layer, buckets, latest, tmap)
        if line.values:
            lines.append(RunLine(run, line, label, colour, i))
    number = layer_number(layer)
    if number is not None and n_layers and number >= n_layers:
        raise InvalidInputError(f"layer: {layer} is past the last layer of these runs ({n_layers - 1})")
    figure = compare_figure(name, lines, x, layer, gl)  # one layer's lines are not per layer: no "over layers"
    if number is not None:
        figure["layout"]["title"]["text"] += f" · layer {layer}"
    drawn = {rl.run.id for rl in lines}
    lacking = [run_label(r) for r in runs if r.id not in drawn]
    if lacking:
        figure["meta"]["missing"].append(f"{name} is not logged by {', '.join(lacking)}")
    return jsonable(  # type: ignore[no-any-return]
        {
            "figure": figure,
            "runs": out_runs,
            "names": sorted(names - {"tokens"}),
            "layers": n_layers,
            "live": {str(run.id): live_cursor(run.last_step, buckets) for run in runs},
        }
    )
