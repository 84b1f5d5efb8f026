"""Pydantic models of the API's read answers: series, comparisons, layer matrices, alerts, health.

Split from :mod:`monitor.api.schemas` (the ingestion, run and group models, and the wire types these
use: :data:`~monitor.api.schemas.WireFloat` keeps NaN and +-Inf as the strings of :mod:`hooks.schema`).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from hyperwatch.monitor.api.schemas import WireFloat, XAxis


class SeriesPointOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    step: int
    tokens: int | None
    value: WireFloat


class SeriesOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    run_id: int
    name: str
    layer: int | None
    buckets: int
    downsampled: bool = Field(description="false when every point in range is returned")
    points: list[SeriesPointOut]


class SeriesInfoOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    name: str
    layer: int | None
    step: int
    value: WireFloat


class ComparePoint(BaseModel):
    x: WireFloat
    step: int
    value: WireFloat


class CompareSeries(BaseModel):
    run_id: int
    run: str
    project: str
    downsampled: bool
    points: list[ComparePoint]


class CompareOut(BaseModel):
    name: str
    layer: int | None
    x: XAxis
    series: list[CompareSeries]


class LayerMatrixOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    run_id: int
    name: str
    layers: list[int]
    bucket_starts: list[int] = Field(description="first step of each column")
    bucket_width: int
    values: list[list[WireFloat | None]] = Field(description="[layer][bucket]: max, NaN if any NaN, null if empty")


class AlertOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    run_id: int
    run: str
    project: str
    rule: str
    severity: str
    name: str
    layer: int | None
    step: int
    value: WireFloat
    baseline: float | None
    message: str
    created_at: datetime
    source: str = Field(description='"service" (the detectors) or "prometheus" (Alertmanager webhook)')


class HealthOut(BaseModel):
    status: str
    detail: str | None = None
