"""Incidents: the alert events of one run, rule and episode, grouped (table ``incidents``, migration 0008).

A run that goes wrong raises an alert event per layer, head and logged step (77 of them for one
blow-up, issue 21); a person needs one line: *what* rose, since which step, where. Every alert
event stored (by the detectors in a batch's transaction, or by the Alertmanager webhook) is
recorded into an incident in the same transaction (:func:`record`), so events and incidents
commit together:

- An incident is keyed by run, rule and source (service or prometheus) and is an *episode*: an
  event joins the run's latest incident of its rule and source when its step lies within
  :data:`EPISODE_GAP_STEPS` of that incident's steps; otherwise it opens a new incident.
- Inside: the first and last step, the event count, the first value and the peak (NaN counts as
  the worst; stored NULL, read back NaN, as every value column), the first event's baseline and
  message, the layers, the heads (``"layer:head"`` of per-head events) and the steps (the first
  :data:`MAX_STEPS`; ``events`` counts all).

The explanation (remedies, link to the run page) is composed when listed, by the API.

An incident that opens, or whose severity rises, queues its notifications in the same transaction
(:func:`monitor.store.webhooks.queue`: the outbox of the project's webhooks, migration 0013).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, insert, select, text, update
from sqlalchemy.engine import Connection, Engine

from hyperwatch.hooks.schema import head_of
from hyperwatch.monitor.store import webhooks
from hyperwatch.monitor.store.alert_models import IncidentRow, run_scoped
from hyperwatch.monitor.store.engine import managed
from hyperwatch.monitor.store.entities import NewAlert
from hyperwatch.monitor.store.models import ProjectRow, RunRow
from hyperwatch.monitor.store.points import api_layer, as_utc, from_sql_value, now_utc, to_sql_value

EPISODE_GAP_STEPS = 1000
"""An event more than this many steps after (or before) an incident's steps starts a new episode."""

MAX_STEPS = 200
"""Steps kept per incident (the first ones); ``events`` counts every event."""

SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


@dataclass(frozen=True)
class Incident:
    id: int
    run_id: int
    run: str
    project: str
    rule: str
    source: str
    severity: str
    name: str
    first_step: int
    last_step: int
    events: int
    first_value: float
    peak_value: float
    baseline: float | None
    layers: list[int]
    heads: list[tuple[int, int]]
    steps: list[int]
    message: str
    created_at: datetime
    updated_at: datetime


def _worse(a: float, b: float) -> float:
    """The worse of two values: NaN first, else the larger."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)


@dataclass
class _Open:
    """An incident being recorded (a stored row's fields, or a new one's)."""

    id: int | None
    severity: str
    name: str
    first_step: int
    last_step: int
    events: int
    first_value: float
    peak_value: float
    baseline: float | None
    layers: list[int]
    heads: list[str]
    steps: list[int]
    message: str
    stored_severity: str | None = None  # as read from its row (None: new), to tell an escalation

    @classmethod
    def start(cls, a: NewAlert) -> _Open:
        o = cls(None, a.severity, a.name, a.step, a.step, 0, a.value, a.value, a.baseline, [], [], [], a.message)
        o.add(a)
        return o

    def near(self, step: int) -> bool:
        return self.first_step - EPISODE_GAP_STEPS <= step <= self.last_step + EPISODE_GAP_STEPS

    def add(self, a: NewAlert) -> None:
        self.events += 1
        if a.step < self.first_step:
            self.first_step, self.first_value, self.baseline, self.message = a.step, a.value, a.baseline, a.message
        self.last_step = max(self.last_step, a.step)
        self.peak_value = _worse(self.peak_value, a.value)
        if SEVERITY_RANK.get(a.severity, 0) > SEVERITY_RANK.get(self.severity, 0):
            self.severity = a.severity
        if a.layer is not None and a.layer not in self.layers:
            self.layers.append(a.layer)
            self.layers.sort()
        head = head_of(a.name)
        if head is not None and a.layer is not None and f"{a.layer}:{head}" not in self.heads:
            self.heads.append(f"{a.layer}:{head}")
        if a.step not in self.steps and len(self.steps) < MAX_STEPS:
            self.steps.append(a.step)
            self.steps.sort()

    def values(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "name": self.name,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "events": self.events,
            "first_value": to_sql_value(self.first_value),
            "peak_value": to_sql_value(self.peak_value),
            "baseline": self.baseline,
            "layers": json.dumps(self.layers),
            "heads": json.dumps(self.heads),
            "steps": json.dumps(self.steps),
            "message": self.message,
            "updated_at": now_utc(),
        }


def _latest(conn: Connection, run_id: int, rule: str, source: str) -> _Open | None:
    i = IncidentRow
    row = conn.execute(
        select(i.__table__)
        .where(and_(i.run_id == run_id, i.rule == rule, i.source == source))
        .order_by(i.last_step.desc(), i.id.desc())
        .limit(1)
    ).first()
    if row is None:
        return None
    return _Open(
        row.id,
        row.severity,
        row.name,
        row.first_step,
        row.last_step,
        row.events,
        from_sql_value(row.first_value),
        from_sql_value(row.peak_value),
        row.baseline,
        list(json.loads(row.layers)),
        list(json.loads(row.heads)),
        list(json.loads(row.steps)),
        row.message,
        row.severity,
    )


def _write(conn: Connection, run_id: int, rule: str, source: str, o: _Open, notify: bool = True) -> None:
    if o.id is None:
        keys = {"run_id": run_id, "rule": rule, "source": source, "created_at": now_utc()}
        new_id = conn.execute(insert(IncidentRow).values(**keys, **o.values()).returning(IncidentRow.id)).scalar_one()
        if notify:  # the project's webhooks, in this transaction (the outbox)
            webhooks.queue(conn, run_id, int(new_id), o.severity, source, webhooks.OPENED)
    else:
        conn.execute(update(IncidentRow).where(IncidentRow.id == o.id).values(**o.values()))
        rose = SEVERITY_RANK.get(o.severity, 0) > SEVERITY_RANK.get(o.stored_severity or "", 0)
        if notify and rose:  # webhooks that wait for this severity hear of it now
            webhooks.queue(conn, run_id, o.id, o.severity, source, webhooks.ESCALATED)


_LOCK_SPACE = 0x4877_0021
"""First key of the PostgreSQL advisory lock that serializes the incident writes of one run."""


def record(conn: Connection, run_id: int, alerts: Sequence[NewAlert], notify: bool = True) -> None:
    """Group newly stored alert events of one run into its incidents (inside the caller's transaction).

    Two transactions recording the same run at once (two Alertmanager notifications, or one beside
    a batch's detectors) would each read the latest incident, find none, and each open one. On
    PostgreSQL a transaction-scoped advisory lock on the run serializes them: the second reads
    after the first commits (read committed) and joins its incident. SQLite's writers hold the
    database's write lock from their first statement, so they never overlap.

    ``notify``: queue the webhooks' notifications of incidents opened or escalated (not when a
    migration groups old events).
    """
    if not alerts:
        return
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:space, :run)"), {"space": _LOCK_SPACE, "run": run_id})
    by_rule: dict[tuple[str, str], list[NewAlert]] = {}
    for a in alerts:
        by_rule.setdefault((a.rule, a.source), []).append(a)
    for (rule, source), events in by_rule.items():
        current = _latest(conn, run_id, rule, source)
        for a in sorted(events, key=lambda e: e.step):
            if current is not None and current.near(a.step):
                current.add(a)
                continue
            if current is not None:
                _write(conn, run_id, rule, source, current, notify)
            current = _Open.start(a)
        if current is not None:
            _write(conn, run_id, rule, source, current, notify)


def record_rows(conn: Connection, rows: Sequence[tuple[Any, ...]]) -> None:
    """:func:`record` for stored ``alert_events`` rows, (run_id, rule, severity, name, layer, step, value,
    baseline, message, source) in the order stored (migration 0008 groups the existing events)."""
    by_run: dict[int, list[NewAlert]] = {}
    for run_id, rule, severity, name, layer, step, value, baseline, message, source in rows:
        alert = NewAlert(rule, severity, name, api_layer(layer), step, from_sql_value(value), baseline, message, source)
        by_run.setdefault(run_id, []).append(alert)
    for run_id, alerts in by_run.items():
        record(conn, run_id, alerts, notify=False)  # before 0013 there is no outbox; old events notify nobody


class IncidentsMixin:
    """SqlStore's incident reads (the writes happen with the alert events, :func:`record`)."""

    engine: Engine

    def list_incidents(
        self,
        run_id: int | None = None,
        project: str | None = None,
        group_id: int | None = None,
        rule: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Incident]:
        """Incidents, the most recently active first."""
        i = IncidentRow
        q = run_scoped(i, run_id, project, group_id, rule)
        q = q.order_by(i.updated_at.desc(), i.id.desc()).limit(limit).offset(offset)
        with managed(self.engine, "list incidents") as conn:
            return [_incident(r) for r in conn.execute(q)]


def get_incident(conn: Connection, incident_id: int) -> Incident | None:
    """One incident by id, with its run's and project's names (None when gone)."""
    i = IncidentRow
    q = (  # run_scoped's columns, archived runs included
        select(i.__table__, RunRow.name.label("run_name"), ProjectRow.name.label("project_name"))
        .join(RunRow, RunRow.id == i.run_id)
        .join(ProjectRow, ProjectRow.id == RunRow.project_id)
        .where(i.id == incident_id)
    )
    found = conn.execute(q).first()
    return None if found is None else _incident(found)


def _incident(r: Any) -> Incident:
    heads = []
    for h in json.loads(r.heads):
        layer, head = str(h).split(":", 1)
        heads.append((int(layer), int(head)))
    return Incident(
        id=r.id,
        run_id=r.run_id,
        run=r.run_name,
        project=r.project_name,
        rule=r.rule,
        source=r.source,
        severity=r.severity,
        name=r.name,
        first_step=r.first_step,
        last_step=r.last_step,
        events=r.events,
        first_value=from_sql_value(r.first_value),
        peak_value=from_sql_value(r.peak_value),
        baseline=r.baseline,
        layers=[int(x) for x in json.loads(r.layers)],
        heads=heads,
        steps=[int(x) for x in json.loads(r.steps)],
        message=r.message,
        created_at=as_utc(r.created_at) or now_utc(),
        updated_at=as_utc(r.updated_at) or now_utc(),
    )
