"""The webhooks' outbox (table ``webhook_deliveries``, migration 0013): claims of due deliveries and their results.

Rows are queued by the transaction that opens an incident (:func:`monitor.store.webhooks.queue`); the
service's deliverer (:mod:`monitor.alerting.notify`) sends them. No HTTP request is ever made inside a
transaction here: a delivery is *claimed* in one short write transaction, which leases it (moves its
``next_attempt_at`` past the time its sending may take and counts the attempt), then sent with no
transaction open, then its result recorded in another short one. So ingest never waits on a slow
receiver, and a service that dies while sending leaves a row that is due again when its lease ends
(sent at least once: receivers can tell a repeat by the delivery id, header ``X-HyperWatch-Delivery``).

Two replicas never claim one row: on PostgreSQL the claim's ``SELECT .. FOR UPDATE SKIP LOCKED``
passes over rows another replica is claiming; SQLite has one writer at a time (``BEGIN IMMEDIATE``).
The outbox reads and writes through its own engine (:meth:`SqlStore.webhook_outbox`), apart from the
request pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import exists, select, update
from sqlalchemy.engine import Engine

from hyperwatch.monitor.store.alert_models import WebhookDeliveryRow, WebhookRow
from hyperwatch.monitor.store.engine import managed
from hyperwatch.monitor.store.incidents import Incident, get_incident
from hyperwatch.monitor.store.points import as_utc, now_utc
from hyperwatch.monitor.store.webhooks import DELIVERED, FAILED, PENDING

MAX_ERROR_CHARS = 500


@dataclass(frozen=True)
class RetryPolicy:
    """When a failed delivery is tried again: ``initial_s`` doubling up to ``max_s`` between attempts,
    for at most ``give_up_after_s`` after it was queued and ``max_attempts`` attempts."""

    initial_s: float = 10.0
    max_s: float = 3600.0
    give_up_after_s: float = 86400.0
    max_attempts: int = 32

    def delay(self, attempts: int, retry_after: float | None = None) -> float:
        """Seconds before the next attempt after ``attempts`` failed ones (a receiver's Retry-After,
        when longer, up to ``max_s``)."""
        backoff = min(self.initial_s * 2 ** max(attempts - 1, 0), self.max_s)
        if retry_after is not None and retry_after > backoff:
            return min(retry_after, self.max_s)
        return backoff


@dataclass(frozen=True)
class Claimed:
    """A delivery leased to this process: what to send, where."""

    id: int
    webhook_id: int
    url: str
    format: str
    event: str
    attempts: int  # this one included
    created_at: datetime
    incident: Incident


class Outbox:
    """The deliverer's reads and writes of ``webhook_deliveries`` (its own engine: :meth:`close` it)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def close(self) -> None:
        self.engine.dispose()

    def due(self) -> bool:
        """Whether any delivery is due now (a read: the write lock is taken only when there is work)."""
        d = WebhookDeliveryRow
        q = select(exists().where(d.status == PENDING, d.next_attempt_at <= now_utc()))
        with managed(self.engine, "look for due webhook deliveries") as conn:
            return bool(conn.execute(q).scalar())

    def claim(self, limit: int, lease_s: float) -> list[Claimed]:
        """Lease up to ``limit`` due deliveries, oldest due first, for ``lease_s`` seconds."""
        d = WebhookDeliveryRow
        now = now_utc()
        due = (
            select(d.id)
            .where(d.status == PENDING, d.next_attempt_at <= now)
            .order_by(d.next_attempt_at, d.id)
            .limit(limit)
        )
        with managed(self.engine, "claim webhook deliveries", write=True) as conn:
            if conn.dialect.name == "postgresql":
                due = due.with_for_update(skip_locked=True)  # another replica's claim is passed over
            leased = conn.execute(
                update(d)
                .where(d.id.in_(due.scalar_subquery()))
                .values(next_attempt_at=now + timedelta(seconds=lease_s), attempts=d.attempts + 1, last_attempt_at=now)
                .returning(d.id, d.webhook_id, d.incident_id, d.event, d.attempts, d.created_at)
            ).all()
            out = []
            for r in sorted(leased, key=lambda r: int(r.id)):
                hook = conn.execute(select(WebhookRow.url, WebhookRow.format).where(WebhookRow.id == r.webhook_id))
                found = hook.first()
                incident = get_incident(conn, int(r.incident_id))
                if found is None or incident is None:  # deleted meanwhile (its row goes with it)
                    continue
                out.append(
                    Claimed(
                        id=int(r.id),
                        webhook_id=int(r.webhook_id),
                        url=str(found.url),
                        format=str(found.format),
                        event=str(r.event),
                        attempts=int(r.attempts),
                        created_at=as_utc(r.created_at) or now,
                        incident=incident,
                    )
                )
            return out

    def delivered(self, c: Claimed, http_status: int) -> None:
        """The receiver took it (2xx)."""
        self._finish(c, status=DELIVERED, delivered_at=now_utc(), last_http_status=http_status, last_error=None)

    def failed(
        self, c: Claimed, http_status: int | None, error: str, policy: RetryPolicy, retry_after: float | None = None
    ) -> bool:
        """Record a failed attempt: due again after the policy's backoff, or failed for good; True when
        given up (too many attempts, or the next one would come after ``give_up_after_s``)."""
        now = now_utc()
        later = now + timedelta(seconds=policy.delay(c.attempts, retry_after))
        give_up = c.attempts >= policy.max_attempts or later > c.created_at + timedelta(seconds=policy.give_up_after_s)
        error = error[:MAX_ERROR_CHARS]
        if give_up:
            error = f"gave up after {c.attempts} attempt{'s' if c.attempts != 1 else ''}: {error}"[:MAX_ERROR_CHARS]
        self._finish(
            c,
            status=FAILED if give_up else PENDING,
            next_attempt_at=now if give_up else later,
            last_http_status=http_status,
            last_error=error,
        )
        return give_up

    def _finish(self, c: Claimed, **values: object) -> None:
        """Record a result, unless the lease ended and another attempt has claimed the row since."""
        d = WebhookDeliveryRow
        with managed(self.engine, f"record webhook delivery {c.id}", write=True) as conn:
            conn.execute(update(d).where(d.id == c.id, d.attempts == c.attempts).values(**values))
