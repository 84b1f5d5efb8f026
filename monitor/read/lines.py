"""The read layer the API routes and the web pages share: a page never shows a number the API would not give.

Routes (``monitor/api/routes``) and pages (``web/``) call these functions and nothing else to read
a group's runs, one run's line of an indicator, the x-axis mapping (step to tokens), the records
the fits take and the stability verdict's inputs. The app is assembled above both
(``hyperwatch.app``), so this module imports neither.

A per-layer indicator becomes one line per run by aggregating over layers per bucket of steps
(:func:`aggregate_series`): each layer's largest value in the bucket (so spikes survive the
downsampling), then the mean (the paper's "mean across layers") or the max over layers. The
final value is the exact aggregate of each layer's latest point.

Where a fit record's fields come from (a run's own fields first, then its config):

- ``val_loss``: the run's summary ``val_loss``, else the latest stored ``val_loss`` point.
- ``method``: config ``method`` or ``arm`` (flat or under ``optim``), else the run's ``optimizer``.
- ``batch_size``: config ``batch_size`` or ``batch_tokens`` (flat or under ``train``).
- ``depth``, ``tokens``, ``lr``, ``flops``: the run's scale fields.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from hyperwatch.hooks.schema import SchemaError, decode_value
from hyperwatch.monitor.core.errors import InvalidInputError
from hyperwatch.monitor.read.matrix_cache import cached_matrix
from hyperwatch.monitor.store.base import Store
from hyperwatch.monitor.store.entities import Group, LayerMatrix, Run, SeriesInfo

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
        m = cached_matrix(store, run, name, buckets)
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


def series_peak(store: Store, run: Run, name: str) -> float | None:
    """The largest value of ``name`` over the whole run, every layer and step (None: never logged).

    Read from the rollups in one bucket: each layer's max over the run (:meth:`Store.layer_matrix`),
    or the run-level series' extremes (:meth:`Store.series` keeps each bucket's max and every
    non-finite point). NaN wins, as in :func:`_aggregate`; +inf is larger than any finite value.
    """
    m = cached_matrix(store, run, name, 1)
    cells = [c for row in m.values for c in row if c is not None]
    if not cells:
        cells = [p.value for p in store.series(run.id, name, None, 1, None, None).points]
    return _aggregate(cells, "max") if cells else None


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


MIN_MATCHED_FRACTION = 0.1
"""Below this fraction of training reached by the slowest run, the verdict waits (early steps say little)."""
FINAL_ONLY = ("loss", "val_loss")
"""Judged by their final value only: a larger model starts with a higher loss, so a peak says nothing."""


@dataclass(frozen=True)
class Matching:
    """Which part of each run a cross-scale verdict compares, so that it compares like with like.

    When every run is finished, the whole series (``cutoff`` None everywhere, ``fraction`` 1.0).
    Otherwise every run is cut at the same fraction of its own training, the one the slowest run
    has reached (``fraction``); a run that cannot be placed (not finished and no ``total_steps``) is
    left out (``pending``). ``reason`` is set when no verdict can be given yet.
    """

    fraction: float | None
    cutoff: dict[int, int | None]
    pending: list[dict[str, Any]]
    reason: str | None

    def to_json(self) -> dict[str, Any]:
        return {"fraction": self.fraction, "pending": self.pending, "reason": self.reason}


def match_runs(runs: Sequence[Run]) -> Matching:
    """The :class:`Matching` of ``runs`` (runs without any point are ignored: nothing to compare)."""
    started = [r for r in runs if r.last_step is not None]
    if all(r.status == "finished" for r in started):
        return Matching(1.0, {r.id: None for r in started}, [], None)
    progress: dict[int, float] = {}
    pending: list[dict[str, Any]] = []
    for r in started:
        if r.status == "finished":
            progress[r.id] = 1.0
        elif r.total_steps:
            progress[r.id] = min(1.0, (int(r.last_step or 0) + 1) / r.total_steps)
        else:
            why = f"n/a until the run finishes ({r.status}, no total_steps to match its fraction of training)"
            pending.append({"run": r.name, "run_id": r.id, "reason": why})
    if not progress:
        return Matching(None, {}, pending, "n/a until runs finish")
    fraction = min(progress.values())
    slowest = min(started, key=lambda r: progress.get(r.id, 2.0))
    if fraction < MIN_MATCHED_FRACTION:
        why = (
            f"n/a until runs finish or reach {MIN_MATCHED_FRACTION:.0%} of training "
            f"(slowest: {slowest.name} at {fraction:.0%})"
        )
        return Matching(fraction, {}, pending, why)
    cutoff: dict[int, int | None] = {}
    for r in started:
        if r.id in progress:
            cutoff[r.id] = None if r.status == "finished" and fraction >= 1.0 else _cut(r, fraction)
    return Matching(fraction, cutoff, pending, None)


def _cut(run: Run, fraction: float) -> int | None:
    """The last step of ``run`` inside ``fraction`` of its training (None: all of it)."""
    total = run.total_steps or ((run.last_step or 0) + 1)
    return max(0, math.floor(fraction * total + 1e-9) - 1) if fraction < 1.0 else None


def truncate(line: AggSeries, cutoff: int | None) -> AggSeries:
    """``line`` up to step ``cutoff`` (a bucket counts when it starts there), final = its last value."""
    if cutoff is None:
        return line
    keep = [i for i, s in enumerate(line.steps) if s <= cutoff]
    values = [line.values[i] for i in keep]
    return AggSeries(
        [line.steps[i] for i in keep],
        [line.tokens[i] for i in keep],
        values,
        values[-1] if values else None,
        line.per_layer,
        line.n_layers,
        line.downsampled,
    )


def stability_records(
    store: Store, runs: Sequence[Run], names: Sequence[str], scale: ScaleField, agg: Agg, buckets: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Matching]:
    """Records for :func:`stability_verdict`: each run's aggregated line per indicator it has, cut at
    the matched fraction of training (see :func:`match_runs`); runs left out are in ``skipped``."""
    records: list[dict[str, Any]] = []
    matching = match_runs(runs)
    skipped: list[dict[str, Any]] = list(matching.pending)
    if matching.reason is not None:
        return [], skipped, matching
    pending = {p["run_id"] for p in matching.pending}
    for run in runs:
        size = scale_of(run, scale)
        if size is None:
            skipped.append({"run": run.name, "run_id": run.id, "reason": f"no {scale}; set it on the run"})
            continue
        if run.id not in matching.cutoff:
            if run.id not in pending:
                skipped.append({"run": run.name, "run_id": run.id, "reason": "no points yet"})
            continue
        latest = store.list_series(run.id)
        have = {s.name for s in latest}
        indicators: dict[str, list[float]] = {}
        tmap = TokenMap((), None)  # the verdict needs no x-axis: skip the tokens lookup
        for n in names:
            if n not in have:
                continue
            line = truncate(aggregate_series(store, run, n, agg, buckets, latest, tmap), matching.cutoff[run.id])
            if line.values:
                indicators[n] = stability_values(line, n)
        if indicators:
            records.append({"run": run.name, "run_id": run.id, "scale": size, "indicators": indicators})
        else:
            skipped.append({"run": run.name, "run_id": run.id, "reason": "none of the indicators is stored"})
    return records, skipped, matching


def stability_values(line: AggSeries, name: str = "") -> list[float]:
    """The line's values with its exact final value last (the verdict reads peak = max, final = last).

    For a loss only the final value (see :data:`FINAL_ONLY`): its peak and final verdicts coincide."""
    if name in FINAL_ONLY and line.final is not None:
        return [line.final]
    return [*line.values, line.final] if line.final is not None else list(line.values)


# -- the x-axis, one rule for the API and the pages ----------------------------------------------
XAxis = Literal["step", "tokens", "flops", "fraction"]


class XAxisError(ValueError):
    """A run lacks the field an x-axis needs; the message names the run, the field and the fix."""


def x_values(run: Run, steps: Sequence[int], tokens: Sequence[int | None], x: XAxis) -> list[float | None]:
    """The x of each point on axis ``x``; raises :class:`XAxisError` when the run cannot have it."""
    where = f"run {run.name!r} (id {run.id})"
    if x == "step":
        return [float(s) for s in steps]
    if x == "fraction" and not run.tokens:
        if not run.total_steps:
            raise XAxisError(f"x=fraction: {where} has neither tokens nor total_steps; set one on the run")
        return [s / run.total_steps for s in steps]
    if x != "tokens" and not run.tokens:
        raise XAxisError(f"x={x}: {where} has no tokens (training tokens of the run); set it on the run")
    if x == "flops" and not run.flops:
        raise XAxisError(f"x=flops: {where} has no flops; set the run's training FLOPs")
    if steps and all(t is None for t in tokens):
        raise XAxisError(f"x={x}: {where}: its points carry no tokens; send tokens with the points or use x=step")
    scale = 1.0
    if x == "flops":
        assert run.flops and run.tokens
        scale = run.flops / run.tokens  # training FLOPs per token
    elif x == "fraction":
        assert run.tokens
        scale = 1.0 / run.tokens
    return [None if t is None else t * scale for t in tokens]


# -- runs as the API and the pages list them -------------------------------------------------------
def is_stale(run: Run, stale_after_s: float, now: datetime | None = None) -> bool:
    """A run marked running whose last point (else its last update) is older than ``stale_after_s``:
    the process is probably gone without saying so (killed -9, a lost node)."""
    if run.status != "running":
        return False
    seen = run.last_point_at or run.updated_at
    now = now or datetime.now(UTC)
    return (now - (seen if seen.tzinfo else seen.replace(tzinfo=UTC))).total_seconds() > stale_after_s


def tokens_seen(run: Run) -> int | None:
    """Training tokens up to the run's last stored step (its budget per step x steps done)."""
    if run.last_step is None or not run.tokens or not run.total_steps:
        return None
    return min(run.tokens, round(run.tokens / run.total_steps * (run.last_step + 1)))


def run_view(run: Run, stale_after_s: float, now: datetime | None = None) -> dict[str, Any]:
    """The run's fields plus ``stale`` and ``tokens_seen``, what GET /api/v1/runs returns."""
    return {**run.__dict__, "stale": is_stale(run, stale_after_s, now), "tokens_seen": tokens_seen(run)}


# -- the layer x step matrix at the logging interval ----------------------------------------------
def _whole_intervals(store: Store, run: Run, m: LayerMatrix, start: int | None, end: int | None) -> LayerMatrix:
    """Wide buckets holding a whole number of logging intervals (the hooks' ``every``, in the run's
    config): 9-step buckets over a run logged every 10 steps left every tenth column empty and the
    cells out of step with the line chart."""
    meta = run.config.get("_hyperwatch") if isinstance(run.config, dict) else None
    every = meta.get("every") if isinstance(meta, dict) else None
    if not isinstance(every, int) or isinstance(every, bool) or every <= 1 or m.bucket_width % every == 0:
        return m
    width = -(-m.bucket_width // every) * every
    span = len(m.bucket_starts) * m.bucket_width  # at least the steps covered, at most one bucket more
    for n in (-(-span // width), -(-span // width) - 1):
        wider = cached_matrix(store, run, m.name, max(1, n), start, end)
        if wider.bucket_width % every == 0:
            return wider
    return m


def layer_matrix(
    store: Store, run: Run, name: str, buckets: int, start: int | None = None, end: int | None = None
) -> LayerMatrix:
    """``store.layer_matrix`` with buckets no narrower than the run's logging interval.

    Logging every k steps into 1-step buckets leaves k-1 empty columns out of k (a striped
    heatmap); the interval is read off the data (the gcd of the non-empty columns' offsets) and
    the matrix is read again with one bucket per logged step.
    """
    m = cached_matrix(store, run, name, buckets, start, end)
    if not m.bucket_starts:
        return m
    if m.bucket_width != 1:
        return _whole_intervals(store, run, m, start, end)
    filled = [m.bucket_starts[j] for j in range(len(m.bucket_starts)) if any(row[j] is not None for row in m.values)]
    interval = 0
    for a, b in itertools.pairwise(filled):
        interval = math.gcd(interval, b - a)
    if interval <= 1:
        return m
    return cached_matrix(store, run, name, max(1, -(-len(m.bucket_starts) // interval)), start, end)
