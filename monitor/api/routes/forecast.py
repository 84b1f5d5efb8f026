"""Forecasts across scale, read through :mod:`monitor.read.forecasts` (the same numbers the pages and
``hyperwatch forecast`` show).

- ``GET /api/v1/groups/{group_id}/forecast?params=7e9`` (or ``?flops=3e21``): each indicator's peak
  and final value forecast at the target, with its band and its threshold crossing.
- ``GET /api/v1/runs/{run_id}/forecast``: a run at its group's largest size against the band its
  smaller runs forecast for it over training.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from hyperwatch.monitor.analysis.forecast import DEFAULT_LEVEL, HORIZON, MIN_SIZES, Axis
from hyperwatch.monitor.analysis.forecast_track import MIN_FRACTION
from hyperwatch.monitor.api.deps import ReadAuth, SettingsDep, StoreDep
from hyperwatch.monitor.api.params import buckets_query, float_query
from hyperwatch.monitor.api.routes.analysis import indicator_names
from hyperwatch.monitor.core.errors import InvalidInputError
from hyperwatch.monitor.read.forecasts import DEFAULT_BUCKETS, DEFAULT_LIMITS, group_forecast, run_forecast
from hyperwatch.monitor.read.lines import Agg

router = APIRouter(tags=["forecast"], dependencies=[ReadAuth])

Names = Annotated[list[str] | None, Query(description="indicators (repeat); default: the seven stability indicators")]
Level = Annotated[
    float,
    float_query("level", 0, 1, "the band's probability (0.9: a 90% prediction interval)", lo_open=True, hi_open=True),
]
Buckets = Annotated[int, buckets_query(10, "buckets of each run's line (as the scale page reads it)")]
AggQuery = Annotated[Agg, Query(description="aggregate over layers per bucket, as on the scale page")]

GROUP_DOC = f"""Where each stability indicator will be at a size not trained yet.

Each run's line (per bucket, each layer's max, then `agg` over layers: the scale page's line) gives
its **peak** and **final** value, the runs compared at a matched fraction of training (the stability
verdict's rule: all of it when every run is finished). Against model size (`total_params`, with
`?params=`) or training FLOPs (`?flops=`), one point per size (the worst run of a size stands for
it), the fit is ln y = a + b ln x by least squares with a `level` prediction band from the residuals
(Student t on n-2 degrees of freedom, with the leverage term that widens it away from the data).
Fewer than {MIN_SIZES} sizes with a finite, positive value: `reason` says "not enough runs". NaN/Inf
values are shown (`points[].reason`) and left out of the fit.

`crossing`: where the fitted curve reaches the group's threshold (`<indicator>_limit` in its
thresholds; defaults {DEFAULT_LIMITS}): `crosses` at `size`, `above` already at the smallest size fitted,
or `never` within {HORIZON:g}x the largest size fitted; `earliest`/`latest` are where the band's upper and
lower edges reach it. `sentence` says all of it in words, as the page and the CLI do.

A run at the group's largest size with {MIN_SIZES}+ smaller sizes, while it trains, is held out of
the fit and listed in `watched` with where its peak so far stands against the band at its fraction
of training (see `GET /api/v1/runs/{{run_id}}/forecast`)."""


@router.get("/groups/{group_id}/forecast", summary="Forecast the indicators at a larger size", description=GROUP_DOC)
def group_forecast_route(
    group_id: int,
    store: StoreDep,
    settings: SettingsDep,
    params: Annotated[
        float | None, float_query("params", 0, None, "target model size in parameters, e.g. 7e9", lo_open=True)
    ] = None,
    flops: Annotated[
        float | None,
        float_query("flops", 0, None, "target training FLOPs, e.g. 3e21 (fits against FLOPs)", lo_open=True),
    ] = None,
    name: Names = None,
    agg: AggQuery = "mean",
    level: Level = DEFAULT_LEVEL,
    buckets: Buckets = DEFAULT_BUCKETS,
) -> dict[str, Any]:
    if params is not None and flops is not None:
        raise InvalidInputError("params, flops: give one target, ?params=7e9 (parameters) or ?flops=3e21, not both")
    names = indicator_names(name, buckets, settings.max_buckets)
    axis: Axis = "flops" if flops is not None else "params"
    return group_forecast(store, group_id, names, axis, flops or params, agg, level, buckets).to_json()


RUN_DOC = f"""A run at its group's largest size in parameters, with runs at {MIN_SIZES} or more smaller sizes
(`watched`; otherwise `reason` says why not), against the forecast its smaller runs make for its size
over training: for each indicator, on a grid of fractions of training from {MIN_FRACTION:.0%} to 100%,
the band of the peak up to that fraction (`band`: predicted, lower, upper, and the sizes it stands
on), the run's own line and running peak against its fraction (`run`), and where its peak stands
now (`now.standing`: inside, above, below the band, nonfinite, or waiting for the band to start).
When the run's value at a logged step rises above the band's upper edge at that step's fraction,
the service raises a `forecast_band` alert (once per episode: again only after a step back inside)."""


@router.get("/runs/{run_id}/forecast", summary="A larger run against its group's forecast", description=RUN_DOC)
def run_forecast_route(
    run_id: int,
    store: StoreDep,
    settings: SettingsDep,
    name: Names = None,
    agg: AggQuery = "mean",
    level: Level = DEFAULT_LEVEL,
    buckets: Buckets = DEFAULT_BUCKETS,
) -> dict[str, Any]:
    names = indicator_names(name, buckets, settings.max_buckets)
    return run_forecast(store, run_id, names, agg, level, buckets)
