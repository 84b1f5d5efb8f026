"""Pydantic v2 models of the HTTP API (separate from the ORM rows and the store's dataclasses).

Non-finite numbers in JSON, both ways: ``NaN``, ``+Inf`` and ``-Inf`` travel as the strings
``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` (the wire convention of :mod:`hooks.schema`), finite
values as JSON numbers. :data:`WireFloat` does the conversion for every value field.

The ingestion body is exactly a :class:`hooks.schema.Batch`; :class:`BatchIn` validates it with the
same rules (it calls ``validate_name``, ``validate_run_name`` and ``decode_value`` from hooks.schema).
The ingest route reads its body itself (:mod:`monitor.api.batch_body`: canonical batches straight
into numpy columns); :class:`BatchIn` is its documented schema and, for anything else, its
validator, whose error report (every bad field by its location) is the API's answer.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StrictBool,
    WithJsonSchema,
)

from hyperwatch.hooks.schema import (
    MAX_LAYER,
    MAX_POINTS_PER_BATCH,
    MAX_STEP,
    RunStatus,
    SchemaError,
    decode_value,
    encode_value,
    validate_name,
    validate_run_name,
)
from hyperwatch.monitor.api.field_types import (
    KEEP,
    MAX_INT64,
    Label,
    Summary,
    SummaryValue,
    Text,
    json_object,
    not_null,
)


def _decode(value: Any) -> float:
    try:
        return decode_value(value)
    except SchemaError as exc:
        raise ValueError(str(exc).split(": ", 1)[-1]) from exc


def _checked(fn: Any) -> Any:
    def check(value: Any) -> Any:
        try:
            return fn(value)
        except SchemaError as exc:
            raise ValueError(str(exc).split(": ", 1)[-1]) from exc

    return check


_WIRE_SCHEMA = {
    "anyOf": [{"type": "number"}, {"type": "string", "enum": ["NaN", "Infinity", "-Infinity"]}],
    "description": "a number; non-finite values as the strings NaN, Infinity, -Infinity",
}
WireFloat = Annotated[
    float,
    BeforeValidator(_decode),
    PlainSerializer(encode_value, return_type=Any, when_used="json"),
    WithJsonSchema(_WIRE_SCHEMA),
]
MetricName = Annotated[str, BeforeValidator(_checked(validate_name))]
_RUN_NAME_SCHEMA = {
    "type": "string",
    "pattern": "^[A-Za-z0-9][A-Za-z0-9_.:+=@-]{0,199}$",
    "description": "1-200 letters, digits and _.:+=@-, starting with a letter or digit (validate_run_name)",
}
RunName = Annotated[str, BeforeValidator(_checked(validate_run_name)), WithJsonSchema(_RUN_NAME_SCHEMA)]
ProjectName = Annotated[
    str, BeforeValidator(_checked(lambda v: validate_run_name(v, "project"))), WithJsonSchema(_RUN_NAME_SCHEMA)
]
Status = RunStatus  # one list, defined in the hooks' wire schema
Tag = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.:=+@/-]+$")]
XAxis = Literal["step", "tokens", "flops", "fraction"]
UnavailableKey = Annotated[Text, Field(min_length=1, max_length=200)]  # Text: no NUL, no lone surrogate
UnavailableReason = Annotated[Text, Field(max_length=2000)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- ingestion ------------------------------------------------------------------------------------
def _no_text_or_bool(value: Any) -> Any:
    """The wire format's integers are JSON numbers: "12" or true is a client bug, not a 12 or a 1."""
    if isinstance(value, (str, bool)):
        raise ValueError(f"must be an integer (a JSON number), got {type(value).__name__} {value!r}")
    return value


WireInt = Annotated[int, BeforeValidator(_no_text_or_bool)]


def int_to_float(value: int) -> float:
    """A JSON integer as a double; beyond the double range it is +-Infinity (IEEE-754 overflow).

    Decided for issue 14 (a point ``value`` of ``10**400`` answered 500): the same number written
    ``1e400`` already parses as +Infinity, as JavaScript's ``JSON.parse`` reads both; so an integer
    too large for a double is stored as +-Infinity too (faithfully, with a ``nonfinite_value`` alert),
    on both databases, rather than rejected.
    """
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _point_value(value: Any) -> Any:
    if type(value) is int:
        return int_to_float(value)
    return _decode(value)


PointValue = Annotated[
    float,
    BeforeValidator(_point_value),
    PlainSerializer(encode_value, return_type=Any, when_used="json"),
    WithJsonSchema(_WIRE_SCHEMA),
]


class PointIn(Strict):
    name: MetricName
    layer: WireInt | None = Field(default=None, ge=0, le=MAX_LAYER, description="block index from 0; null = run level")
    step: WireInt = Field(ge=0, le=MAX_STEP)
    tokens: WireInt | None = Field(default=None, ge=0, le=MAX_STEP)
    value: PointValue = Field(
        description="a number (an integer beyond the double range is +-Infinity); NaN/Inf as strings"
    )


class BatchIn(Strict):
    """One hooks.schema Batch. ``run`` is a run name in the project given by ``?project=`` (default)."""

    batch_id: str = Field(
        pattern=r"^[A-Za-z0-9_-]{8,64}$",
        description="idempotency key of the send; the hooks send <session: 32 hex>-<n> (or -<first>-<last> for "
        "merged batches), numbers the service keeps as ranges",
    )
    run: RunName
    points: list[PointIn] = Field(max_length=MAX_POINTS_PER_BATCH)


class IngestOut(BaseModel):
    accepted: int = Field(
        description="points in the batch (when duplicate: of the first send; this send's for a hooks sequence id)"
    )
    duplicate: bool = Field(description="true when this batch_id was already stored (nothing written)")
    run_id: int
    alerts: int = Field(default=0, description="new alert events the batch raised")


# -- runs and groups ------------------------------------------------------------------------------
# One model on the way in and on the way out: whatever a create/update accepts, RunOut and GroupOut
# can read back and send as UTF-8 JSON. Fields stored NOT NULL (config, summary, status, tags,
# export_layers, description, thresholds) refuse an explicit null with a message saying what to
# send instead; leaving a field out keeps the stored value (the value types: monitor.api.field_types).
class RunFields(Strict):
    """Fields a create or update may set; omitted fields are left as they are."""

    group: RunName | None = Field(default=None, description="group (sweep) name; created when new; null = no group")
    status: Annotated[Status, not_null("send one of running, finished, failed, crashed")] = Field(default=KEEP)
    config: Annotated[dict[str, Any], json_object("config")] = Field(
        default=KEEP, description="free-form JSON object; NaN/Infinity floats are stored as those strings"
    )
    summary: Summary = Field(default=KEEP, description="merged into the stored summary, e.g. {'val_loss': 3.21}")
    tags: Annotated[list[Tag], not_null("send [] to remove every tag")] = Field(default=KEEP, max_length=100)
    depth: int | None = Field(default=None, ge=1, le=100_000)
    width: int | None = Field(default=None, ge=1, le=10_000_000)
    total_params: int | None = Field(default=None, ge=0, le=MAX_INT64)
    active_params: int | None = Field(default=None, ge=0, le=MAX_INT64)
    tokens: int | None = Field(default=None, ge=0, le=MAX_INT64, description="training tokens of the whole run")
    total_steps: int | None = Field(
        default=None, ge=1, le=MAX_INT64, description="planned optimizer steps (x axis 'fraction')"
    )
    flops: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="training FLOPs of the whole run (finite, > 0)"
    )
    lr: float | None = Field(default=None, gt=0, allow_inf_nan=False, description="peak learning rate (finite, > 0)")
    optimizer: Label | None = None
    parameterization: Label | None = None
    export_layers: Annotated[bool, not_null("send true or false")] = Field(
        default=KEEP, description="export per-layer gauges on /metrics (label layer)"
    )
    unavailable: dict[UnavailableKey, UnavailableReason] | None = Field(
        default=None,
        max_length=2000,
        description="indicators the hooks could not measure, {'attention_z@3': reason}; merged into the stored ones",
    )


class RunCreate(RunFields):
    name: RunName
    project: ProjectName = "default"
    # run identity (monitor.store.identity): the writing process, and whether it takes over the run
    attach_id: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{8,64}$",
        description="random hex id of the writing process (hooks.attach); another process's id is refused (409)",
    )
    resume: bool = Field(default=False, description="with attach_id: take over the existing run of this name")


class RunUpdate(RunFields):
    archived: Annotated[bool, not_null("send true or false")] = Field(
        default=KEEP,
        description="true: hidden from the runs list, scale comparisons and alert lists (kept whole); false: shown",
    )


class RunDeleted(BaseModel):
    """What ``DELETE /api/v1/runs/{id}`` removed."""

    id: int
    project: str
    name: str
    series: int = Field(description="series the run held (subtracted from its project's count)")


class RunOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    project: str
    name: str
    status: str
    group: str | None
    group_id: int | None
    config: dict[str, Any]
    summary: dict[str, SummaryValue]
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
    unavailable: dict[str, str] = Field(default_factory=dict, description="indicators the hooks could not measure")
    last_step: int | None
    last_point_at: datetime | None
    created_at: datetime
    updated_at: datetime
    stale: bool = Field(default=False, description="running, but no points for HYPERWATCH_STALE_AFTER_S")
    tokens_seen: int | None = Field(default=None, description="training tokens up to the last stored step")
    archived: bool = Field(default=False, description="hidden from lists unless asked for (PATCH archived: false)")


_LIMIT = "the indicator's limit: the forecast says at which model size its peak crosses it"


def _positive(fix: str, integer: bool = False) -> Any:
    """A finite number above 0 (a whole one with ``integer``), or null; the error says what to send."""

    def check(value: Any) -> Any:
        if value is None:
            return value
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if integer and isinstance(value, float) and value.is_integer():
            value = int(value)
        if not number or (integer and not isinstance(value, int)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"must be a finite {'whole ' if integer else ''}number above 0; {fix}")
        return value

    return BeforeValidator(check)


class Thresholds(Strict):
    """Detector settings of a group (defaults in monitor/thresholds/defaults.py, DEFAULT_THRESHOLDS); finite numbers."""

    spike_window: int | None = Field(default=None, ge=5, le=10_000, description="trailing points of the baseline")
    spike_min_points: int | None = Field(default=None, ge=3, le=10_000)
    spike_mad_multiple: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    spike_min_relative: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="jump must exceed this x |median|"
    )
    attention_z_min: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="minimum absolute attention Z of a spike"
    )
    router_z_min: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="minimum absolute router Z of a spike"
    )
    max_vio_limit: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="MaxVio above this is a collapse"
    )
    max_vio_persist: int | None = Field(
        default=None, ge=1, le=1000, description="consecutive logged points of a layer above max_vio_limit"
    )
    # the trend rules (monitor/thresholds/defaults.py, issue 21)
    attention_lse_max_limit: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="logit ceiling of a head's max attention LSE"
    )
    growth_window: int | None = Field(default=None, ge=3, le=10_000, description="logged points of a growth fit")
    growth_min_points: int | None = Field(default=None, ge=2, le=10_000)
    growth_factor: float | None = Field(
        default=None, gt=1, allow_inf_nan=False, description="fitted rise over the window that is a climb"
    )
    attention_z_growth_floor: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    attention_lse_max_growth_floor: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    output_z_growth_floor: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    router_z_growth_floor: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    attention_rms_growth_floor: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="attention branch output RMS below this is no climb"
    )
    mlp_rms_growth_floor: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="MLP/MoE branch output RMS below this is no climb"
    )
    growth_info_fraction: float | None = Field(
        default=None,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="a climb at or above this fraction of its floor, but below it, is raised as info (1: no info tier)",
    )
    growth_recent: float | None = Field(
        default=None,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="1: a climb counts only while the window's last growth_window // 2 points keep its pace (a "
        "settling climb is learning); 0: the whole window's fit alone",
    )
    loss_spike_window: int | None = Field(
        default=None, ge=5, le=10_000, description="trailing loss values a loss spike is judged against"
    )
    loss_spike_persist: int | None = Field(
        default=None, ge=1, le=1000, description="logged points in a row above the bar that make a loss spike"
    )
    grad_norm_spike_window: int | None = Field(
        default=None, ge=5, le=10_000, description="trailing grad-norm values a grad-norm spike is judged against"
    )
    grad_norm_spike_persist: int | None = Field(
        default=None, ge=1, le=1000, description="logged points in a row above the bar that make a grad-norm spike"
    )
    sigma_spike_min_points: int | None = Field(default=None, ge=3, le=10_000)
    sigma_spike_multiple: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    sigma_spike_min_relative: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    loss_shift_window: int | None = Field(
        default=None, ge=5, le=10_000, description="logged losses a loss shift is judged against"
    )
    loss_shift_points: int | None = Field(
        default=None, ge=2, le=1000, description="latest logged losses tested, their largest left out (Prometheus: 6)"
    )
    loss_shift_multiple: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="standard errors above the window's mean"
    )
    # the thresholds a forecast crosses (monitor.read.forecasts.DEFAULT_LIMITS: attention Z 1000, MaxVio above)
    attention_z_limit: float | None = Field(default=None, gt=0, allow_inf_nan=False, description=_LIMIT)
    router_z_limit: float | None = Field(default=None, gt=0, allow_inf_nan=False, description=_LIMIT)
    attention_rms_limit: float | None = Field(default=None, gt=0, allow_inf_nan=False, description=_LIMIT)
    mlp_rms_limit: float | None = Field(default=None, gt=0, allow_inf_nan=False, description=_LIMIT)
    attention_outlier_ratio_limit: float | None = Field(
        default=None, gt=0, le=1, allow_inf_nan=False, description=_LIMIT
    )
    mlp_outlier_ratio_limit: float | None = Field(default=None, gt=0, le=1, allow_inf_nan=False, description=_LIMIT)
    # learning (monitor.thresholds.learned): what a group with learn_thresholds learns, and from how many runs
    learn_multiple: Annotated[
        float | None, _positive("send e.g. 3 (learned = 3 x the healthy runs' highest peak), or leave it out")
    ] = Field(default=None, description="a learned threshold is this x the highest peak of its finished healthy runs")
    learn_min_runs: Annotated[int | None, _positive("send a whole number such as 2, or leave it out", integer=True)] = (
        Field(default=None, le=10_000, description="finished healthy runs needed before anything is learned")
    )
    learn_loss_margin: Annotated[
        float | None, _positive("send e.g. 0.05 (nats of final loss above the group's best), or leave it out")
    ] = Field(
        default=None,
        description="a finished run is learned from when its final loss is within this of the group's best",
    )


class GroupFields(Strict):
    description: Annotated[Text, not_null('send "" to clear it')] = Field(default=KEEP, max_length=10_000)
    config: Annotated[dict[str, Any], json_object("config")] = Field(default=KEEP)
    thresholds: Annotated[Thresholds, not_null("send {} for the defaults")] = Field(default=KEEP)
    learn_thresholds: StrictBool | None = Field(
        default=None,
        description="learn the growth floors and the logit ceiling from the group's finished healthy runs "
        "(GET /api/v1/groups/{id}/thresholds shows them); null: the service's default (on)",
    )


class GroupCreate(GroupFields):
    name: RunName
    project: ProjectName = "default"


class GroupOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    project: str
    name: str
    description: str
    config: dict[str, Any]
    thresholds: dict[str, Any]
    learn_thresholds: bool | None = Field(default=None, description="null: the service's default (on)")
    created_at: datetime
    updated_at: datetime


class ThresholdOut(BaseModel):
    key: str = Field(description="a threshold of monitor/thresholds/defaults.py DEFAULT_THRESHOLDS")
    value: float = Field(description="the value the detectors and the exported gauges use")
    source: Literal["default", "override", "learned"]
    default: float
    detail: str = Field(description="where the value came from: the override, or what was learned from which runs")
