"""A project's notification webhooks (table ``webhooks``, migration 0013) and the queueing of their deliveries.

- :func:`queue` is called by :func:`monitor.store.incidents.record` inside the transaction that opens
  an incident (or raises its severity): it inserts one ``webhook_deliveries`` row (the outbox) per
  webhook of the run's project that wants the incident, so the notification commits with the
  incident or not at all (a rolled-back batch queues nothing; a re-sent batch opens no incident).
  A webhook gets an incident once (unique per webhook and incident): when it opens at or above the
  webhook's ``min_severity``, or later, when it escalates to it.
- :class:`WebhooksMixin`: SqlStore's webhook configuration and what each one's deliveries came to.

The sending is :mod:`monitor.store.outbox` (claims, results) and :mod:`monitor.alerting.notify`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection, Engine

from hyperwatch.monitor.core.errors import ConflictError, NotFoundError
from hyperwatch.monitor.store.alert_models import WebhookDeliveryRow, WebhookRow
from hyperwatch.monitor.store.engine import managed, retry_busy
from hyperwatch.monitor.store.models import ProjectRow, RunRow
from hyperwatch.monitor.store.points import as_utc, dialect_insert, now_utc

SEVERITIES = ("info", "warning", "critical")
"""Incident severities, lowest first (as ``monitor.store.incidents.SEVERITY_RANK``)."""
FORMATS = ("slack", "generic")
OPENED, ESCALATED = "incident.opened", "incident.escalated"
PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


def rank(severity: str) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else 0


def queue(conn: Connection, run_id: int, incident_id: int, severity: str, source: str, event: str) -> int:
    """Queue the incident for each webhook of the run's project that wants it (in the caller's
    transaction); how many rows were queued. A webhook already holding the incident gets nothing new."""
    w = WebhookRow
    found = conn.execute(
        select(w.id, w.min_severity, w.include_prometheus)
        .join(RunRow, RunRow.project_id == w.project_id)
        .where(RunRow.id == run_id)
    ).all()
    wanted = [
        int(r.id)
        for r in found
        if rank(r.min_severity) <= rank(severity) and (source == "service" or r.include_prometheus)
    ]
    if not wanted:
        return 0
    now = now_utc()
    rows = [
        {
            "webhook_id": wid,
            "incident_id": incident_id,
            "event": event,
            "status": PENDING,
            "attempts": 0,
            "created_at": now,
            "next_attempt_at": now,
        }
        for wid in wanted
    ]
    ins = dialect_insert(conn, WebhookDeliveryRow.__table__).values(rows)
    conn.execute(ins.on_conflict_do_nothing(index_elements=["webhook_id", "incident_id"]))
    return len(rows)


@dataclass(frozen=True)
class DeliveryState:
    """The latest attempted delivery of a webhook."""

    incident_id: int
    event: str
    state: str  # "delivered", "retrying" (failed, will retry), "failed" (gave up) or "sending"
    attempts: int
    at: datetime
    http_status: int | None
    error: str | None
    next_attempt_at: datetime | None  # when retrying


@dataclass(frozen=True)
class Webhook:
    id: int
    project: str
    name: str
    url: str  # the secret: the API masks it (monitor.alerting.notify.masked_url)
    format: str
    min_severity: str
    include_prometheus: bool
    created_at: datetime
    updated_at: datetime
    pending: int = 0
    delivered: int = 0
    failed: int = 0
    last: DeliveryState | None = None


def _state(r: Any) -> DeliveryState:
    if r.status == DELIVERED:
        state = DELIVERED
    elif r.status == FAILED:
        state = FAILED
    else:
        state = "retrying" if (r.last_error is not None or r.last_http_status is not None) else "sending"
    return DeliveryState(
        incident_id=int(r.incident_id),
        event=str(r.event),
        state=state,
        attempts=int(r.attempts),
        at=as_utc(r.last_attempt_at) or now_utc(),
        http_status=r.last_http_status,
        error=r.last_error,
        next_attempt_at=as_utc(r.next_attempt_at) if state == "retrying" else None,
    )


class WebhooksMixin:
    """SqlStore's webhook configuration (needs ``engine`` and ``_project_id``)."""

    engine: Engine

    if TYPE_CHECKING:  # provided by SqlStore

        def _project_id(self, conn: Connection, project: str, create: bool) -> int | None: ...

    @retry_busy
    def upsert_webhook(self, project: str, url: str, fields: dict[str, Any]) -> tuple[Webhook, bool]:
        """Create the project's webhook of ``url`` (the project too, when new) or update the given
        fields of the one it has; returns (webhook, created)."""
        with managed(self.engine, f"save a webhook of project {project}", write=True) as conn:
            pid = self._project_id(conn, project, create=True)
            w = WebhookRow
            wid = conn.execute(select(w.id).where(w.project_id == pid, w.url == url)).scalar()
            now = now_utc()
            if wid is None:
                values = {"name": "", "format": "slack", "min_severity": "warning", "include_prometheus": False}
                values.update(fields)
                ins = insert(w).values(project_id=pid, url=url, created_at=now, updated_at=now, **values)
                wid = conn.execute(ins.returning(w.id)).scalar_one()
                created = True
            else:
                conn.execute(update(w).where(w.id == wid).values(updated_at=now, **fields))
                created = False
            return self._webhooks(conn, project, int(wid))[0], created

    def update_webhook(self, project: str, webhook_id: int, fields: dict[str, Any]) -> Webhook:
        with managed(self.engine, f"update webhook {webhook_id}", write=True) as conn:
            pid = self._existing_hook(conn, project, webhook_id)
            w = WebhookRow
            url = fields.get("url")
            if url is not None:
                other = conn.execute(select(w.id).where(w.project_id == pid, w.url == url, w.id != webhook_id)).scalar()
                if other is not None:
                    raise ConflictError(
                        f"project {project!r} already has a webhook with this url (id {other}); "
                        "delete one of them, or change that one"
                    )
            conn.execute(update(w).where(w.id == webhook_id).values(updated_at=now_utc(), **fields))
            return self._webhooks(conn, project, webhook_id)[0]

    def list_webhooks(self, project: str) -> list[Webhook]:
        with managed(self.engine, f"list webhooks of project {project}") as conn:
            if self._project_id(conn, project, create=False) is None:
                raise _no_project(project)
            return self._webhooks(conn, project, None)

    def get_webhook(self, project: str, webhook_id: int) -> Webhook:
        with managed(self.engine, f"read webhook {webhook_id}") as conn:
            self._existing_hook(conn, project, webhook_id)
            return self._webhooks(conn, project, webhook_id)[0]

    def delete_webhook(self, project: str, webhook_id: int) -> Webhook:
        """Delete the webhook and its deliveries (pending ones are not sent); what it was."""
        with managed(self.engine, f"delete webhook {webhook_id}", write=True) as conn:
            self._existing_hook(conn, project, webhook_id)
            gone = self._webhooks(conn, project, webhook_id)[0]
            conn.execute(delete(WebhookDeliveryRow).where(WebhookDeliveryRow.webhook_id == webhook_id))
            conn.execute(delete(WebhookRow).where(WebhookRow.id == webhook_id))
            return gone

    def _existing_hook(self, conn: Connection, project: str, webhook_id: int) -> int:
        """The project's id, when it has webhook ``webhook_id`` (else NotFoundError)."""
        pid = self._project_id(conn, project, create=False)
        if pid is None:
            raise _no_project(project)
        found = conn.execute(select(WebhookRow.id).where(WebhookRow.id == webhook_id, WebhookRow.project_id == pid))
        if found.scalar() is None:
            raise NotFoundError(
                f"webhook {webhook_id} not found in project {project!r}; list them with "
                f"GET /api/v1/projects/{project}/webhooks"
            )
        return pid

    def _webhooks(self, conn: Connection, project: str, webhook_id: int | None) -> list[Webhook]:
        """The project's webhooks (or the one), with their delivery counts and latest attempt, by id."""
        w, d = WebhookRow, WebhookDeliveryRow
        q = select(w.__table__).join(ProjectRow, ProjectRow.id == w.project_id).where(ProjectRow.name == project)
        if webhook_id is not None:
            q = q.where(w.id == webhook_id)
        rows = conn.execute(q.order_by(w.id)).all()
        ids = [int(r.id) for r in rows]
        counts: dict[tuple[int, str], int] = {}
        if ids:
            per = select(d.webhook_id, d.status, func.count()).where(d.webhook_id.in_(ids))
            for wid, status, n in conn.execute(per.group_by(d.webhook_id, d.status)):
                counts[(int(wid), str(status))] = int(n)
        out = []
        for r in rows:
            last = conn.execute(
                select(d.__table__)
                .where(d.webhook_id == r.id, d.last_attempt_at.is_not(None))
                .order_by(d.last_attempt_at.desc(), d.id.desc())
                .limit(1)
            ).first()
            out.append(
                Webhook(
                    id=int(r.id),
                    project=project,
                    name=r.name,
                    url=r.url,
                    format=r.format,
                    min_severity=r.min_severity,
                    include_prometheus=bool(r.include_prometheus),
                    created_at=as_utc(r.created_at) or now_utc(),
                    updated_at=as_utc(r.updated_at) or now_utc(),
                    pending=counts.get((int(r.id), PENDING), 0),
                    delivered=counts.get((int(r.id), DELIVERED), 0),
                    failed=counts.get((int(r.id), FAILED), 0),
                    last=None if last is None else _state(last),
                )
            )
        return out


def _no_project(project: str) -> NotFoundError:
    return NotFoundError(
        f"project {project!r} not found; it is created with its first run, or by "
        f"POST /api/v1/projects/{project}/webhooks"
    )
