"""The scaling analysis of a group, computed over the runs the service stores.

- ``GET /api/v1/groups/{group_id}/analysis?baseline=...``: :func:`monitor.analysis.fit_group` on
  one record per run: its scale fields and its final validation loss.
- ``GET /api/v1/groups/{group_id}/stability?scale=total_params``: :func:`stability_verdict` on
  the stability indicators of spec section 4, one line per run.

Where a record's fields come from (a run's own fields first, then its config):

- ``val_loss``: the run's summary ``val_loss``, else the latest stored ``val_loss`` point.
- ``method``: config ``method`` or ``arm`` (flat or under ``optim``), else the run's ``optimizer``.
- ``batch_size``: config ``batch_size`` or ``batch_tokens`` (flat or under ``train``).
- ``depth``, ``tokens``, ``lr``, ``flops``: the run's scale fields.

A per-layer indicator becomes one line per run by aggregating over layers per bucket of steps
(:func:`aggregate_series`): each layer's largest value in the bucket (so spikes survive the
downsampling), then the mean (the paper's "mean across layers") or the max over layers. The
final value is the exact aggregate of each layer's latest point. The web pages draw these same
lines, so a verdict always describes what the page shows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query

from hyperwatch.hooks.schema import SchemaError, decode_value, validate_name
from hyperwatch.monitor.analysis import AnalysisError, fit_group, jsonable, stability_verdict
from hyperwatch.monitor.api.deps import ReadAuth, SettingsDep, StoreDep
from hyperwatch.monitor.core.errors import InvalidInputError
from hyperwatch.monitor.store.base import Store
from hyperwatch.monitor.store.entities import Group, Run, SeriesInfo

router = APIRouter(tags=["analysis"], dependencies=[ReadAuth])

STABILITY_INDICATORS = (
    "attention_z",
    "router_z",
    "attention_rms",
    "mlp_rms",
    "attention_outlier_ratio",
    "mlp_outlier_ratio",
    "max_vio",
)
"""Spec section 4's six stability indicators plus MaxVio, in the order the pages show them."""

Agg = Literal["mean", "max"]
ScaleField = Literal["total_params", "active_params", "depth", "width", "tokens", "flops"]
MAX_GROUP_RUNS = 1000


@dataclass(frozen=True)
class AggSeries:
    """One run's line for one indicator: values per bucket (or per point for a run-level metric).

    ``tokens[i]`` is None where unknown. ``final`` is the exact last value (the aggregate of the
    layers' latest points), or None when the run has no such series.
    """

    steps: list[int]
    tokens: list[int | None]
    values: list[float]
    final: float | None
    per_layer: bool
    n_layers: int
    downsampled: bool


def group_runs(store: Store, group_id: int) -> tuple[Group, list[Run]]:
    """The group and its runs, ordered by id."""
    group = store.get_group(group_id)
    return group, store.list_runs(project=group.project, group=group.name, limit=MAX_GROUP_RUNS)


def _aggregate(values: Sequence[float], agg: Agg) -> float:
    """NaN wins (a NaN layer makes the aggregate NaN), then the mean or max; infinities propagate."""
    if any(math.isnan(v) for v in values):
        return math.nan
    return max(values) if agg == "max" else math.fsum(values) / len(values)


def aggregate_series(
    store: Store,
    run: Run,
    name: str,
    agg: Agg,
    buckets: int,
    latest: Sequence[SeriesInfo] | None = None,
    token_map: TokenMap | None = None,
) -> AggSeries:
    """The line of ``name`` for ``run``: aggregated over layers for a per-layer metric (see module doc).

    A name the run stores only at run level (layer null) is returned as that series, downsampled
    by min/max buckets. ``latest`` (``store.list_series(run.id)``) and ``token_map`` are reused
    when the caller has them.
    """
    latest = store.list_series(run.id) if latest is None else latest
    layer_latest = [s.value for s in latest if s.name == name and s.layer is not None]
    if layer_latest:
        m = store.layer_matrix(run.id, name, buckets, None, None)
        steps: list[int] = []
        values: list[float] = []
        for j, start in enumerate(m.bucket_starts):
            cells = [c for c in (row[j] for row in m.values) if c is not None]
            if cells:
                steps.append(start)
                values.append(_aggregate(cells, agg))
        token_map = token_map if token_map is not None else TokenMap.of(store, run, latest)
        return AggSeries(
            steps, token_map.at(steps), values, _aggregate(layer_latest, agg), True, len(m.layers), m.bucket_width > 1
        )
    s = store.series(run.id, name, None, buckets, None, None)
    final = s.points[-1].value if s.points else None
    steps = [p.step for p in s.points]
    return AggSeries(steps, [p.tokens for p in s.points], [p.value for p in s.points], final, False, 0, s.downsampled)


@dataclass(frozen=True)
class TokenMap:
    """Training tokens as a function of step, from a run's logged (step, tokens) pairs.

    Every layer and run-level metric of a logging step carries the same tokens, so one reference
    series (the run-level ``tokens``, ``loss`` or ``lr``, else any stored series) gives the map; in
    between its points tokens are interpolated linearly. Without any tokens on the points, the
    run's ``tokens`` / ``total_steps`` ratio is used; without that, tokens are unknown (None).
    """

    known: tuple[tuple[int, int], ...]
    per_step: float | None

    @classmethod
    def of(cls, store: Store, run: Run, latest: Sequence[SeriesInfo]) -> TokenMap:
        names: list[tuple[str, int | None]] = [(s.name, s.layer) for s in latest]
        preferred: list[tuple[str, int | None]] = [("tokens", None), ("loss", None), ("lr", None)]
        ref = next((k for k in preferred if k in names), None)
        ref = ref or (names[0] if names else None)
        known: list[tuple[int, int]] = []
        if ref is not None:
            series = store.series(run.id, ref[0], ref[1], 64, None, None)
            known = [(p.step, p.tokens) for p in series.points if p.tokens is not None]
        per_step = run.tokens / run.total_steps if run.tokens and run.total_steps else None
        if per_step is None and len(known) == 1 and known[0][0] > 0:
            per_step = known[0][1] / known[0][0]
        return cls(tuple(known) if len(known) >= 2 else (), per_step)

    def at(self, steps: Sequence[int]) -> list[int | None]:
        known = self.known
        if not known:
            return [None if self.per_step is None else round(s * self.per_step) for s in steps]
        out: list[int | None] = []
        k = 0
        for s in steps:  # steps ascending: walk the segments once
            while k < len(known) - 2 and known[k + 1][0] <= s:
                k += 1
            (s0, t0), (s1, t1) = known[k], known[k + 1]
            out.append(round(t0 + (t1 - t0) * (s - s0) / (s1 - s0)))
        return out


# -- records for the fits ----------------------------------------------------------------------------
def _nested(config: Mapping[str, Any], keys: Sequence[str], sections: Sequence[str]) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    for section in sections:
        sub = config.get(section)
        if isinstance(sub, Mapping):
            for key in keys:
                if sub.get(key) is not None:
                    return sub[key]
    return None


def final_val_loss(run: Run, latest: Sequence[SeriesInfo]) -> float | None:
    """The run's summary ``val_loss``, else its latest stored ``val_loss`` point, else None."""
    raw = run.summary.get("val_loss")
    if raw is not None:
        try:
            return decode_value(raw, f"run {run.name!r} summary.val_loss")
        except SchemaError as exc:
            raise InvalidInputError(f"{exc}; fix it with PATCH /api/v1/runs/{run.id}") from exc
    found = [s.value for s in latest if s.name == "val_loss" and s.layer is None]
    return found[0] if found else None


def run_record(run: Run, val_loss: float) -> dict[str, Any]:
    """One :func:`fit_group` record (see the module doc for where each field comes from)."""
    method = _nested(run.config, ("method", "arm"), ("optim",)) or run.optimizer
    batch = _nested(run.config, ("batch_size", "batch_tokens"), ("train",))
    return {
        "run": run.name,
        "run_id": run.id,
        "val_loss": val_loss,
        "method": str(method) if method is not None else None,
        "depth": run.depth,
        "tokens": run.tokens,
        "batch_size": batch if isinstance(batch, (int, float)) and not isinstance(batch, bool) else None,
        "lr": run.lr,
        "flops": run.flops,
    }


def group_records(store: Store, runs: Sequence[Run]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(records, skipped): runs without a final val_loss are skipped with the reason."""
    records, skipped = [], []
    for run in runs:
        loss = final_val_loss(run, store.list_series(run.id))
        if loss is None:
            skipped.append({"run": run.name, "run_id": run.id, "reason": "no val_loss (summary or points)"})
            continue
        records.append(run_record(run, loss))
    return records, skipped


def scale_of(run: Run, field: ScaleField) -> float | None:
    value = getattr(run, field)
    return float(value) if value is not None and value > 0 else None


def _analysis_error(exc: AnalysisError) -> InvalidInputError:
    return InvalidInputError(str(exc))


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
scale's beyond `rtol`. Runs without the `scale` field are listed in `skipped`."""


@router.get("/groups/{group_id}/stability", summary="Transferable-stability verdict", description=STABILITY_DOC)
def group_stability(
    group_id: int,
    store: StoreDep,
    settings: SettingsDep,
    scale: Annotated[ScaleField, Query(description="the model-size field that orders the runs")] = "total_params",
    agg: Annotated[Agg, Query(description="aggregate over layers per bucket")] = "mean",
    name: Annotated[list[str] | None, Query(description="indicators (repeat); default: the seven")] = None,
    buckets: Annotated[int, Query(ge=10)] = 1000,
    rtol: Annotated[float, Query(ge=0, le=10)] = 0.05,
    atol: Annotated[float, Query(ge=0)] = 0.0,
) -> dict[str, Any]:
    if buckets > settings.max_buckets:
        raise InvalidInputError(
            f"buckets: {buckets} is above the limit of {settings.max_buckets} (HYPERWATCH_MAX_BUCKETS)"
        )
    if not math.isfinite(atol):
        raise InvalidInputError("atol: must be a finite number >= 0")
    names = list(dict.fromkeys(name or STABILITY_INDICATORS))
    for n in names:
        try:
            validate_name(n, "name")
        except SchemaError as exc:
            raise InvalidInputError(str(exc)) from exc
    group, runs = group_runs(store, group_id)
    records, skipped = stability_records(store, runs, names, scale, agg, buckets)
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
        "report": report,
    }
    return jsonable(out)  # type: ignore[no-any-return]


def stability_records(
    store: Store, runs: Sequence[Run], names: Sequence[str], scale: ScaleField, agg: Agg, buckets: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Records for :func:`stability_verdict`: each run's aggregated line per indicator it has."""
    records, skipped = [], []
    for run in runs:
        size = scale_of(run, scale)
        if size is None:
            skipped.append({"run": run.name, "run_id": run.id, "reason": f"no {scale}; set it on the run"})
            continue
        latest = store.list_series(run.id)
        have = {s.name for s in latest}
        indicators: dict[str, list[float]] = {}
        tmap = TokenMap((), None)  # the verdict needs no x-axis: skip the tokens lookup
        for n in names:
            if n not in have:
                continue
            line = aggregate_series(store, run, n, agg, buckets, latest, tmap)
            if line.values:
                indicators[n] = stability_values(line)
        if indicators:
            records.append({"run": run.name, "run_id": run.id, "scale": size, "indicators": indicators})
        else:
            skipped.append({"run": run.name, "run_id": run.id, "reason": "none of the indicators is stored"})
    return records, skipped


def stability_values(line: AggSeries) -> list[float]:
    """The line's values with its exact final value last (the verdict reads peak = max, final = last)."""
    return [*line.values, line.final] if line.final is not None else list(line.values)
