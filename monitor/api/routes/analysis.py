"""The scaling analysis of a group, computed over the runs the service stores.

- ``GET /api/v1/groups/{group_id}/analysis?baseline=...``: :func:`monitor.analysis.fit_group` on
  one record per run: its scale fields and its final validation loss.
- ``GET /api/v1/groups/{group_id}/stability?scale=total_params``: :func:`stability_verdict` on
  the stability indicators of spec section 4, one line per run.

The reads (each run's line, its record, the matched fraction of training) live in
:mod:`monitor.read.lines`, which the web pages call too, so a verdict always describes what a page shows.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from fastapi import APIRouter, Query

from hyperwatch.hooks.schema import SchemaError, validate_name
from hyperwatch.monitor.analysis import AnalysisError, fit_group, jsonable, stability_verdict
from hyperwatch.monitor.api.deps import ReadAuth, SettingsDep, StoreDep
from hyperwatch.monitor.api.params import buckets_query, float_query
from hyperwatch.monitor.core.errors import InvalidInputError
from hyperwatch.monitor.read.lines import (
    STABILITY_INDICATORS,
    Agg,
    ScaleField,
    group_records,
    group_runs,
    stability_records,
)

router = APIRouter(tags=["analysis"], dependencies=[ReadAuth])
__all__ = ["STABILITY_INDICATORS", "router"]


def _analysis_error(exc: AnalysisError) -> InvalidInputError:
    return InvalidInputError(str(exc))


def indicator_names(name: list[str] | None, buckets: int, max_buckets: int) -> list[str]:
    """The indicators asked for (default: the seven), each a valid metric name, and ``buckets`` in range."""
    if buckets > max_buckets:
        raise InvalidInputError(f"buckets: {buckets} is above the limit of {max_buckets} (HYPERWATCH_MAX_BUCKETS)")
    names = list(dict.fromkeys(name or STABILITY_INDICATORS))
    for n in names:
        try:
            validate_name(n, "name")
        except SchemaError as exc:
            raise InvalidInputError(str(exc)) from exc
    return names


# -- routes --------------------------------------------------------------------------------------------
ANALYSIS_DOC = """LR sweeps (quadratic fit in log lr per sweep), transfer laws (optimal LR vs tokens, depth,
batch size) and scaling laws L = A C^-b (+ C0) per method with the compute leverage of every method
over `baseline`, over the group's runs. Each run contributes its scale fields and its final
`val_loss` (summary, else latest point); runs without one are listed in `skipped`. A part that
cannot be fitted carries an `error` message. Non-finite numbers are "NaN"/"Infinity"/"-Infinity"."""


@router.get("/groups/{group_id}/analysis", summary="Scaling analysis of a group", description=ANALYSIS_DOC)
def group_analysis(
    group_id: int,
    store: StoreDep,
    baseline: Annotated[str | None, Query(max_length=64, description="method to compare the others to")] = None,
    floor: Annotated[bool | None, Query(description="fit the floor C0 (default: with >= 5 budgets)")] = None,
) -> dict[str, Any]:
    group, runs = group_runs(store, group_id)
    records, skipped = group_records(store, runs)
    methods = sorted({r["method"] or "default" for r in records if r["flops"] is not None})
    if baseline is not None and baseline not in methods:
        raise InvalidInputError(
            f"baseline: {baseline!r} is not a method with FLOPs in group {group.name!r}; choose one of {methods}"
        )
    try:
        analysis = fit_group(records, baseline=baseline, floor=floor) if records else None
    except AnalysisError as exc:
        raise _analysis_error(exc) from exc
    out = {
        "group_id": group.id,
        "group": group.name,
        "project": group.project,
        "baseline": baseline,
        "methods": methods,
        "runs": records,
        "skipped": skipped,
        "analysis": analysis.to_json() if analysis is not None else None,
    }
    return jsonable(out)  # type: ignore[no-any-return]


STABILITY_DOC = """Transferable stability: for each indicator (default: spec section 4's six plus
max_vio) and each run, the line the scale-comparison page draws (per bucket, each layer's max,
then `agg` over layers); its peak and its final value (the exact aggregate of the layers' latest
points) vs `scale`; `transferable` when every scale's value is finite and not above the previous
scale's beyond `rtol`. Runs are compared at a matched fraction of training: all of it when every
run is finished, else the fraction the slowest run has reached (`matched.fraction`); below 10%
`report` is null and `matched.reason` says why ("n/a until runs finish"). Loss is judged by its
final value only. Runs without the `scale` field or not placeable are listed in `skipped`."""


@router.get("/groups/{group_id}/stability", summary="Transferable-stability verdict", description=STABILITY_DOC)
def group_stability(
    group_id: int,
    store: StoreDep,
    settings: SettingsDep,
    scale: Annotated[ScaleField, Query(description="the model-size field that orders the runs")] = "total_params",
    agg: Annotated[Agg, Query(description="aggregate over layers per bucket")] = "mean",
    name: Annotated[list[str] | None, Query(description="indicators (repeat); default: the seven")] = None,
    buckets: Annotated[int, buckets_query(10)] = 1000,
    rtol: Annotated[float, float_query("rtol", 0, 10)] = 0.05,
    atol: Annotated[float, float_query("atol", 0, None)] = 0.0,
) -> dict[str, Any]:
    names = indicator_names(name, buckets, settings.max_buckets)
    if not math.isfinite(atol):
        raise InvalidInputError("atol: must be a finite number >= 0")
    group, runs = group_runs(store, group_id)
    records, skipped, matching = stability_records(store, runs, names, scale, agg, buckets)
    report = None
    if records:
        try:
            report = stability_verdict(records, rtol=rtol, atol=atol).to_json()
        except AnalysisError as exc:
            raise _analysis_error(exc) from exc
    out = {
        "group_id": group.id,
        "group": group.name,
        "scale": scale,
        "agg": agg,
        "runs": [{"run": r["run"], "run_id": r["run_id"], "scale": r["scale"]} for r in records],
        "skipped": skipped,
        "matched": matching.to_json(),
        "report": report,
    }
    return jsonable(out)  # type: ignore[no-any-return]
