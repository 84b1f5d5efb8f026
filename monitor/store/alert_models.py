"""The tables of what the detectors raise and where it goes: alert events, the incidents they add up
to, and the webhooks notified with their outbox (split from :mod:`monitor.store.models`, which imports
this module so that :class:`Base`'s metadata holds every table)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    Select,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    and_,
    false,
    select,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from hyperwatch.monitor.store.models import Base, Double, ProjectRow, RunRow


class AlertEventRow(Base):
    __tablename__ = "alert_events"
    __table_args__ = (
        UniqueConstraint("run_id", "rule", "name", "layer", "step"),
        Index("ix_alert_events_created_at", "created_at"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    rule: Mapped[str] = mapped_column(String(64))
    severity: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(128))
    layer: Mapped[int] = mapped_column(SmallInteger)
    step: Mapped[int] = mapped_column(BigInteger)
    value: Mapped[float | None] = mapped_column(Double, nullable=True)
    baseline: Mapped[float | None] = mapped_column(Double, nullable=True)
    message: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    source: Mapped[str] = mapped_column(String(16), server_default="service")  # "service" | "prometheus"


class IncidentRow(Base):
    """What the alert events of one run, rule and episode add up to (migration 0008; monitor.store.incidents).

    ``layers``, ``heads`` and ``steps`` are JSON lists (``heads`` as ``"layer:head"``), kept short:
    the steps are capped (:data:`monitor.store.incidents.MAX_STEPS`), ``events`` counts them all.
    ``peak_value`` NULL is NaN, as in every value column here.
    """

    __tablename__ = "incidents"
    __table_args__ = (Index("ix_incidents_run_id_rule_source_last_step", "run_id", "rule", "source", "last_step"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    rule: Mapped[str] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(String(16))
    severity: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(128))
    first_step: Mapped[int] = mapped_column(BigInteger)
    last_step: Mapped[int] = mapped_column(BigInteger)
    events: Mapped[int] = mapped_column(Integer)
    first_value: Mapped[float | None] = mapped_column(Double, nullable=True)
    peak_value: Mapped[float | None] = mapped_column(Double, nullable=True)
    baseline: Mapped[float | None] = mapped_column(Double, nullable=True)
    layers: Mapped[str] = mapped_column(Text)
    heads: Mapped[str] = mapped_column(Text)
    steps: Mapped[str] = mapped_column(Text)
    message: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class WebhookRow(Base):
    """A project's notification webhook (migration 0013; monitor.store.webhooks): ``url`` is a secret
    (a Slack webhook URL is its own credential), never sent back whole by the API."""

    __tablename__ = "webhooks"
    __table_args__ = (UniqueConstraint("project_id", "url"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200), server_default="")
    url: Mapped[str] = mapped_column(Text)
    format: Mapped[str] = mapped_column(String(16))  # "slack" | "generic"
    min_severity: Mapped[str] = mapped_column(String(16))  # "info" | "warning" | "critical"
    include_prometheus: Mapped[bool] = mapped_column(Boolean, server_default=false())
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class WebhookDeliveryRow(Base):
    """The outbox: one notification of one incident to one webhook (migration 0013; monitor.store.outbox).

    Queued in the transaction that opens (or escalates) the incident, so it commits with it or not at
    all; ``status`` pending -> delivered, or failed once retrying gave up. A pending row whose
    ``next_attempt_at`` has passed is due; a claimed one is leased by moving it ahead."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("webhook_id", "incident_id"),
        Index("ix_webhook_deliveries_status_next_attempt_at", "status", "next_attempt_at"),
        Index("ix_webhook_deliveries_incident_id", "incident_id"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    webhook_id: Mapped[int] = mapped_column(ForeignKey("webhooks.id", ondelete="CASCADE"))
    incident_id: Mapped[int] = mapped_column(ForeignKey("incidents.id", ondelete="CASCADE"))
    event: Mapped[str] = mapped_column(String(32))  # "incident.opened" | "incident.escalated"
    status: Mapped[str] = mapped_column(String(16))  # "pending" | "delivered" | "failed"
    attempts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    last_http_status: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)


def run_scoped(
    row: type[AlertEventRow] | type[IncidentRow],
    run_id: int | None,
    project: str | None,
    group_id: int | None,
    rule: str | None,
) -> Select[Any]:
    """Rows of an alert-like table with their run's and project's names (``run_name``,
    ``project_name``), filtered by whichever of run, project, group and rule are given."""
    q = (
        select(row.__table__, RunRow.name.label("run_name"), ProjectRow.name.label("project_name"))
        .join(RunRow, RunRow.id == row.run_id)
        .join(ProjectRow, ProjectRow.id == RunRow.project_id)
    )
    conds = [
        c
        for given, c in (
            (run_id, row.run_id == run_id),
            (project, ProjectRow.name == project),
            (group_id, RunRow.group_id == group_id),
            (rule, row.rule == rule),
        )
        if given is not None
    ]
    if run_id is None:  # a run asked for by id shows its alerts; lists leave archived runs out (0012)
        conds.append(RunRow.archived.is_(False))
    return q.where(and_(*conds)) if conds else q
