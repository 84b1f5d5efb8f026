"""The runs list's response model with its summaries (``GET /api/v1/runs?summary=loss,val_loss``; issue 35).

Apart from :mod:`monitor.api.schemas` (which it extends) to keep that module short."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from hyperwatch.monitor.api.schemas import RunOut, WireFloat


class MetricSummaryOut(BaseModel):
    """A run-level series in a few numbers (:meth:`monitor.store.base.Store.series_summaries`)."""

    model_config = ConfigDict(from_attributes=True)
    last: WireFloat = Field(description="the value at the latest logged step (NaN, Infinity kept)")
    last_step: int
    min: WireFloat | None = Field(description="the smallest value over every step; NaN never counts; null: all NaN")
    min_step: int | None = Field(description="the step of the smallest value (the earliest, on a tie)")
    max: WireFloat | None = Field(description="the largest value over every step; NaN never counts; null: all NaN")
    max_step: int | None = Field(description="the step of the largest value (the earliest, on a tie)")


class RunListOut(RunOut):
    """A run as GET /api/v1/runs lists it: :class:`RunOut` and, asked for, its metrics summed up."""

    metrics: dict[str, MetricSummaryOut] = Field(
        default_factory=dict,
        description="with summary=NAME,...: each named run-level metric the run logged, summed up "
        "(a name the run never logged is left out)",
    )
