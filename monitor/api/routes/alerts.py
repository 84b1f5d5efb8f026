"""Alert events: those raised by the service's detectors, and those Prometheus fires; and incidents.

``GET /api/v1/incidents`` lists what the events add up to: one incident per run, rule, source and
episode (monitor/store/incidents.py), each explaining itself: what rose, by how much, since which
step, which layers and heads, the usual remedies and a link to the run page at that step.

``POST /api/v1/alerts/prometheus`` is an Alertmanager webhook receiver (``webhook_configs``): each
firing alert whose labels name a known ``project`` and ``run`` is stored as an alert event of
source "prometheus" (rule = the alert's name, value = the run's latest value of the metric),
beside the service's own (source "service"), so ``/alerts`` and the run's charts show both.
Resolved notifications and alerts about unknown runs are listed in the reply, not stored.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field

from hyperwatch.monitor.alerting import explain
from hyperwatch.monitor.alerting.alertmanager import store_firing
from hyperwatch.monitor.api.deps import ReadAuth, SettingsDep, StoreDep, WriteAuth
from hyperwatch.monitor.api.params import Limit, Offset
from hyperwatch.monitor.api.query_schemas import AlertOut
from hyperwatch.monitor.api.schemas import WireFloat

log = logging.getLogger(__name__)
router = APIRouter(tags=["alerts"])

RULES = (
    "logit_ceiling, z_growth, z_spike, loss_spike, grad_norm_spike, nan_loss, nonfinite_value, "
    "max_vio_collapse, forecast_band, or a Prometheus alert name (HyperWatch...)"
)


class AlertFilter:
    """The query of ``/alerts`` and ``/incidents``: which run, project, group and rule, and the page."""

    def __init__(
        self,
        run_id: int | None = None,
        project: str | None = None,
        group_id: int | None = None,
        rule: Annotated[str | None, Query(description=RULES)] = None,
        limit: Limit = 100,
        offset: Offset = 0,
    ) -> None:
        self.run_id, self.project, self.group_id, self.rule = run_id, project, group_id, rule
        self.limit, self.offset = limit, offset

    def args(self, max_page: int) -> tuple[int | None, str | None, int | None, str | None, int, int]:
        """The store's arguments, the page capped at the service's ``max_page``."""
        return self.run_id, self.project, self.group_id, self.rule, min(self.limit, max_page), self.offset


@router.get("/alerts", response_model=list[AlertOut], dependencies=[ReadAuth], summary="Alert events, newest first")
def list_alerts(
    store: StoreDep,
    settings: SettingsDep,
    where: Annotated[AlertFilter, Depends()],
) -> list[AlertOut]:
    found = store.list_alerts(*where.args(settings.max_page_size))
    return [AlertOut.model_validate(a) for a in found]


class HeadOut(BaseModel):
    layer: int
    head: int


class IncidentOut(BaseModel):
    """One incident: the alert events of a run, rule and episode, explained."""

    id: int
    run_id: int
    run: str
    project: str
    rule: str
    source: str = Field(description='"service" (the detectors) or "prometheus" (Alertmanager webhook)')
    severity: str
    name: str = Field(description="the metric of the incident's first event")
    first_step: int
    last_step: int
    events: int = Field(description="alert events grouped here")
    first_value: WireFloat
    peak_value: WireFloat = Field(description="the worst value of its events (NaN counts as the worst)")
    baseline: float | None = Field(description="the first event's baseline (its trailing level, or the limit)")
    layers: list[int]
    heads: list[HeadOut]
    steps: list[int] = Field(description="the events' steps (the first 200)")
    message: str = Field(description="the first event's message")
    summary: str = Field(description="what rose, by how much, since which step, where")
    remedies: list[str]
    link: str = Field(description="the run page at the incident's first step")
    created_at: datetime
    updated_at: datetime


@router.get(
    "/incidents",
    response_model=list[IncidentOut],
    dependencies=[ReadAuth],
    summary="Incidents: alert events grouped per run, rule and episode, most recently active first",
)
def list_incidents(
    store: StoreDep,
    settings: SettingsDep,
    where: Annotated[AlertFilter, Depends()],
) -> list[IncidentOut]:
    found = store.list_incidents(*where.args(settings.max_page_size))
    return [
        IncidentOut(
            **{k: v for k, v in vars(i).items() if k != "heads"},
            heads=[HeadOut(layer=layer, head=head) for layer, head in i.heads],
            summary=explain.summary(i),
            remedies=explain.remedies(i),
            link=explain.run_link(i),
        )
        for i in found
    ]


class AlertmanagerAlert(BaseModel):
    """One alert of an Alertmanager webhook notification (only the fields used here are checked)."""

    model_config = ConfigDict(extra="ignore")
    status: str = Field(description="firing or resolved")
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class AlertmanagerWebhook(BaseModel):
    """Alertmanager's webhook body (version 4): https://prometheus.io/docs/alerting/latest/configuration/#webhook_config"""

    model_config = ConfigDict(extra="ignore")
    version: str = "4"
    status: str = "firing"
    alerts: list[AlertmanagerAlert] = Field(default_factory=list, max_length=10_000)


class WebhookResult(BaseModel):
    stored: int = Field(description="new alert events stored (source prometheus)")
    ignored: list[str] = Field(description="why each alert that was not stored was left out")


@router.post(
    "/alerts/prometheus",
    response_model=WebhookResult,
    dependencies=[WriteAuth],
    summary="Alertmanager webhook: store firing Prometheus alerts as alert events of source 'prometheus'",
)
def prometheus_webhook(body: AlertmanagerWebhook, store: StoreDep) -> WebhookResult:
    stored, ignored = store_firing(store, ((a.status, a.labels, a.annotations) for a in body.alerts))
    if ignored:
        log.info("alertmanager webhook: %d stored, %d ignored (%s)", stored, len(ignored), "; ".join(ignored[:3]))
    return WebhookResult(stored=stored, ignored=ignored)
