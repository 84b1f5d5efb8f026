"""Reads for dashboards: downsampled series, many runs on one x-axis, the layer x step matrix."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from hyperwatch.monitor.api.deps import QueryReaderDep, ReaderDep
from hyperwatch.monitor.api.params import End, Layer, Start, buckets_query
from hyperwatch.monitor.api.query_schemas import CompareOut, ComparePoint, CompareSeries, LayerMatrixOut, SeriesOut
from hyperwatch.monitor.api.schemas import MetricName, WireFloat, XAxis
from hyperwatch.monitor.core.errors import InvalidInputError
from hyperwatch.monitor.read.lines import XAxisError, x_values
from hyperwatch.monitor.store.entities import Run, Series

router = APIRouter(tags=["query"])  # both readers check read auth; QueryReaderDep also waits for a read slot


SERIES_DOC = """A series downsampled server-side to at most `buckets` buckets.

Each bucket returns its minimum and its maximum point, so spikes survive; the first and last
points and every NaN/Inf point are always returned. With few points, all are returned
(`downsampled: false`). Non-finite values are the strings "NaN", "Infinity", "-Infinity"."""


@router.get("/runs/{run_id}/series", response_model=SeriesOut, summary="One series", description=SERIES_DOC)
def series(
    run_id: int,
    name: Annotated[MetricName, Query()],
    read: QueryReaderDep,
    layer: Layer = None,
    buckets: Annotated[int, buckets_query(1)] = 2000,
    start: Start = None,
    end: End = None,
) -> SeriesOut:
    s = read.series(run_id, name, layer, buckets, start, end)
    return SeriesOut.model_validate(s)


def _x_values(run: Run, s: Series, x: XAxis) -> list[ComparePoint]:
    """The points on axis ``x`` by the one rule the pages use too (:func:`monitor.read.lines.x_values`)."""
    try:
        xs = x_values(run, [p.step for p in s.points], [p.tokens for p in s.points], x)
    except XAxisError as exc:
        raise InvalidInputError(f"{exc} (PATCH /api/v1/runs/{run.id})") from exc
    return [ComparePoint(x=v, step=p.step, value=p.value) for v, p in zip(xs, s.points, strict=True) if v is not None]


@router.get("/compare", response_model=CompareOut, summary="Many runs' series on one x-axis")
def compare(
    name: Annotated[MetricName, Query()],
    read: QueryReaderDep,
    run_id: Annotated[list[int] | None, Query(description="repeat for each run")] = None,
    group_id: Annotated[int | None, Query(description="every run of this group")] = None,
    layer: Layer = None,
    x: Annotated[XAxis, Query(description="step, tokens, flops (tokens x run FLOPs/token) or fraction")] = "step",
    buckets: Annotated[int, buckets_query(1)] = 1000,
) -> CompareOut:
    ids = list(run_id or [])
    if group_id is not None:
        ids += [r.id for r in read.group(group_id)[1]]
    if not ids:
        raise InvalidInputError("run_id: give one or more run_id=N parameters, or group_id")
    out = []
    for run in read.runs_by_id(ids):
        s = read.series(run.id, name, layer, buckets, None, None)
        out.append(
            CompareSeries(
                run_id=run.id, run=run.name, project=run.project, downsampled=s.downsampled, points=_x_values(run, s, x)
            )
        )
    return CompareOut(name=name, layer=layer, x=x, series=out)


@router.get("/runs/{run_id}/layers", response_model=LayerMatrixOut, summary="Layer x step matrix for heatmaps")
def layers(
    run_id: int,
    name: Annotated[MetricName, Query()],
    read: QueryReaderDep,
    buckets: Annotated[int, buckets_query(1)] = 200,
    start: Start = None,
    end: End = None,
) -> LayerMatrixOut:
    """The matrix the run page's heatmap draws: buckets no narrower than the run's logging interval."""
    m = read.layers(read.run(run_id), name, buckets, start, end)
    return LayerMatrixOut.model_validate(m)


class HeadMatrixOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    run_id: int
    name: str = Field(description="the per-head indicator: attention_lse_max (a head's max LSE over its queries)")
    step: int | None = Field(description="the run's newest logged step with per-head values (null: none yet)")
    layers: list[int]
    heads: list[int]
    values: list[list[WireFloat | None]] = Field(description="[layer][head] at `step`; null: not reported then")


@router.get("/runs/{run_id}/heads", response_model=HeadMatrixOut, summary="Heads x layers: each head's max LSE now")
def heads(run_id: int, read: ReaderDep) -> HeadMatrixOut:
    """Each attention head's ceiling (``attention_lse_max.h<k>``: its max LSE over the step's queries,
    so its max logit lies in [value - log T, value]) at the run's newest logged step, per layer:
    the matrix a QK-clip-style watch needs to see which heads run away."""
    return HeadMatrixOut.model_validate(read.heads(read.run(run_id)))
