"""Plain domain objects the store returns (ORM rows never leave the store).

Values are Python floats; NaN, +Inf and -Inf are real IEEE values here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hyperwatch.hooks.schema import RUN_STATUSES as _WIRE_RUN_STATUSES

RUN_STATUSES = tuple(sorted(_WIRE_RUN_STATUSES))  # the one list, from the hooks' wire schema
ACTIVE_STATUS = "running"

SCALE_FIELDS = (
    "depth",
    "width",
    "total_params",
    "active_params",
    "tokens",
    "total_steps",
    "flops",
    "lr",
    "optimizer",
    "parameterization",
)
RUN_FIELDS = (*SCALE_FIELDS, "status", "config", "summary", "tags", "group", "export_layers", "unavailable")
"""The fields a run create/update may set (besides project and name)."""


@dataclass(frozen=True)
class Group:
    id: int
    project: str
    name: str
    description: str
    config: dict[str, Any]
    thresholds: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    learn_thresholds: bool | None = None  # None: the service's default (monitor.thresholds.defaults)
    learned: dict[str, Any] | None = None  # read from its finished healthy runs (monitor.thresholds.learned)


@dataclass(frozen=True)
class GroupThresholds:
    """A group's threshold settings, as a batch's transaction reads them for the detectors:
    its overrides, its learning setting and what was learned (merged by monitor.thresholds.learned)."""

    thresholds: dict[str, Any]
    learn_thresholds: bool | None = None
    learned: dict[str, Any] | None = None


@dataclass(frozen=True)
class RunHealth:
    """What decides whether a group learns from a run (monitor.thresholds.learned): its status, its last
    loss (None: no loss logged; NaN kept) and the (rule, severity) of each kind of incident it has."""

    id: int
    name: str
    status: str
    last_loss: float | None
    incidents: tuple[tuple[str, str], ...] = ()
    archived: bool = False  # an archived run is never learned from (migration 0012)


@dataclass(frozen=True)
class SeriesSummary:
    """A run-level series in a few numbers (:meth:`monitor.store.base.Store.series_summaries`): its
    latest point (``last``: NaN and +-Inf kept) and its smallest and largest values with the step of
    each (NaN never counts, +-Inf do, the earliest step wins a tie; None when every value is NaN)."""

    last_step: int
    last: float
    min: float | None = None
    min_step: int | None = None
    max: float | None = None
    max_step: int | None = None


@dataclass(frozen=True)
class Run:
    id: int
    project: str
    name: str
    status: str
    group: str | None
    group_id: int | None
    config: dict[str, Any]
    summary: dict[str, Any]
    tags: list[str]
    depth: int | None
    width: int | None
    total_params: int | None
    active_params: int | None
    tokens: int | None
    total_steps: int | None
    flops: float | None
    lr: float | None
    optimizer: str | None
    parameterization: str | None
    export_layers: bool
    last_step: int | None
    last_point_at: datetime | None
    created_at: datetime
    updated_at: datetime
    unavailable: dict[str, str] = field(default_factory=dict)  # indicator[@layer] -> why the hooks lack it
    archived: bool = False  # hidden from lists unless asked for (migration 0012)


@dataclass(frozen=True)
class SeriesPoint:
    step: int
    tokens: int | None
    value: float


@dataclass
class Series:
    run_id: int
    name: str
    layer: int | None
    points: list[SeriesPoint]
    downsampled: bool
    buckets: int


@dataclass
class LayerMatrix:
    """``values[i][j]``: the max of layer ``layers[i]`` over bucket j (NaN if the bucket holds a NaN)."""

    run_id: int
    name: str
    layers: list[int]
    bucket_starts: list[int]
    bucket_width: int
    values: list[list[float | None]] = field(default_factory=list)


@dataclass(frozen=True)
class SeriesInfo:
    name: str
    layer: int | None
    step: int
    value: float


@dataclass(frozen=True)
class NewAlert:
    rule: str
    severity: str
    name: str
    layer: int | None
    step: int
    value: float
    baseline: float | None
    message: str
    source: str = "service"  # or "prometheus": delivered by Alertmanager to the webhook


@dataclass(frozen=True)
class Alert:
    id: int
    run_id: int
    run: str
    project: str
    rule: str
    severity: str
    name: str
    layer: int | None
    step: int
    value: float
    baseline: float | None
    message: str
    created_at: datetime
    source: str = "service"


@dataclass(frozen=True)
class IngestResult:
    run_id: int
    accepted: int
    duplicate: bool
    alerts: tuple[NewAlert, ...] = ()  # alert events the batch raised, stored in its transaction


@dataclass(frozen=True)
class LatestValue:
    """The newest point of one series of an active run (what /metrics exports)."""

    project: str
    run: str
    export_layers: bool
    name: str
    layer: int | None
    step: int
    value: float
    last_point_at: datetime | None
    run_id: int = 0
    group_id: int | None = None  # whose thresholds the spike gauges use (None: the defaults)


@dataclass(frozen=True)
class ActiveRun:
    """A running run that has points: what /metrics exports for it besides its gauges' values."""

    project: str
    run: str
    run_id: int
    last_step: int
    last_point_at: datetime | None
    series_count: int  # distinct (name, layer) series (runs.series_count, monitor.store.cardinality)
