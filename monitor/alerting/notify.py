"""Notifications without Alertmanager: each new incident POSTed to its project's webhooks, retried.

Alertmanager stays the production path (its receivers route the Prometheus rules' alerts); this is
for a team without it: a Slack incoming webhook, or any HTTP endpoint that takes JSON.

- What is sent: the incident explained (:func:`monitor.alerting.explain.summary`), its run, rule,
  severity, peak and steps, and a link to the run page at the incident's first step, built on
  ``HYPERWATCH_PUBLIC_URL`` (unset: the payload says so instead of a link no one else could open).
  Two shapes: :func:`slack_payload` (``text`` + Block Kit ``blocks``, what a Slack incoming webhook
  takes) and :func:`generic_payload` (``{"event", "delivery_id", "summary", "incident", "run", "url"}``,
  NaN and +-Inf as the API's strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``).
- When: the outbox row is queued with the incident, in its transaction (:mod:`monitor.store.webhooks`);
  the :class:`Deliverer` thread, started with the app (``lifespan`` in :mod:`monitor.api.app`), claims
  due rows (:mod:`monitor.store.outbox`), POSTs each with urllib (no transaction open, a timeout of
  ``HYPERWATCH_WEBHOOK_TIMEOUT_S``, redirects not followed), marks a 2xx delivered and retries
  anything else with exponential backoff (``HYPERWATCH_WEBHOOK_RETRY_INITIAL_S`` doubling up to
  ``_RETRY_MAX_S``), giving up after ``_GIVE_UP_AFTER_S`` or ``_MAX_ATTEMPTS`` with the last error kept.
  Counted on ``/metrics`` as ``hyperwatch_webhook_deliveries_total{outcome}``.

A webhook URL is a secret (a Slack one is its own credential): :func:`masked_url` is all the API,
the logs and the stored errors ever show of it.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import logging
import math
import threading
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from hyperwatch.hooks.schema import encode_value
from hyperwatch.monitor.alerting import explain
from hyperwatch.monitor.alerting.prometheus import WEBHOOK_DELIVERIES
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.core.errors import MonitorError
from hyperwatch.monitor.store.base import Store
from hyperwatch.monitor.store.incidents import Incident
from hyperwatch.monitor.store.outbox import Claimed, Outbox, RetryPolicy

log = logging.getLogger(__name__)

CLAIM_BATCH = 16
"""Deliveries leased per claim; the lease covers sending them all one after another."""
NO_LINK = "no link: set HYPERWATCH_PUBLIC_URL on the service to its address as your team opens it"
SLACK_TEXT_CHARS = 3000  # a section's text limit in Slack's Block Kit
SLACK_HEADER_CHARS = 150


def masked_url(url: str) -> str:
    """What may be shown of a webhook URL: its scheme, host and port, and its last 4 characters."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    tail = url[-4:] if len(url) >= 16 else ""
    return f"{parts.scheme}://{host}{f':{port}' if port else ''}/...{tail}"


def link(incident: Incident, public_url: str | None) -> str | None:
    """The run page at the incident's first step, on the metric that rose (None without a public URL)."""
    return None if public_url is None else public_url.rstrip("/") + explain.run_link(incident)


def _shown(value: float | None) -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(encode_value(value))
    return f"{value:.4g}"


def _wire(value: float | None) -> float | str | None:
    return None if value is None else encode_value(value)


def _iso(ts: datetime) -> str:
    return ts.astimezone(UTC).isoformat().replace("+00:00", "Z")


def generic_payload(event: str, delivery_id: int, incident: Incident, public_url: str | None) -> dict[str, Any]:
    """The generic JSON body (values as the API sends them: NaN and +-Inf as strings)."""
    i = incident
    url = link(i, public_url)
    body: dict[str, Any] = {
        "event": event,
        "delivery_id": delivery_id,
        "summary": explain.summary(i),
        "incident": {
            "id": i.id,
            "rule": i.rule,
            "source": i.source,
            "severity": i.severity,
            "name": i.name,
            "first_step": i.first_step,
            "last_step": i.last_step,
            "events": i.events,
            "first_value": _wire(i.first_value),
            "peak_value": _wire(i.peak_value),
            "baseline": _wire(i.baseline),
            "layers": i.layers,
            "heads": [{"layer": layer, "head": head} for layer, head in i.heads],
            "steps": i.steps,
            "message": i.message,
            "remedies": explain.remedies(i),
            "created_at": _iso(i.created_at),
            "updated_at": _iso(i.updated_at),
        },
        "run": {"id": i.run_id, "name": i.run, "project": i.project},
        "url": url,
    }
    if url is None:
        body["url_note"] = NO_LINK
    return body


def _slack_escape(text: str) -> str:
    """Slack's three control characters in mrkdwn and plain text."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _title(event: str, i: Incident) -> str:
    what = explain.WHAT.get(i.rule, i.rule)
    how = "escalated to " if event == "incident.escalated" else ""
    return f"[{how}{i.severity.upper()}] {what}: {i.project}/{i.run}"


def slack_payload(event: str, incident: Incident, public_url: str | None) -> dict[str, Any]:
    """A Slack incoming webhook's body: ``text`` (the notification's words) and Block Kit ``blocks``."""
    i = incident
    title = _title(event, i)
    summary = explain.summary(i)
    url = link(i, public_url)
    steps = str(i.first_step) if i.first_step == i.last_step else f"{i.first_step}-{i.last_step}"
    fields = [
        ("Project", i.project),
        ("Run", i.run),
        ("Rule", i.rule),
        ("Severity", i.severity),
        ("Peak", f"{_shown(i.peak_value)} ({explain.base(i.name)})"),
        ("Steps", steps),
    ]
    where = f"<{_slack_escape(url)}|Open the run at step {i.first_step}>" if url is not None else _slack_escape(NO_LINK)
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title[:SLACK_HEADER_CHARS]}},
        {"type": "section", "text": {"type": "mrkdwn", "text": _slack_escape(summary)[:SLACK_TEXT_CHARS]}},
        {
            "type": "section",
            "fields": [{"type": "mrkdwn", "text": f"*{k}*\n{_slack_escape(v)}"} for k, v in fields],
        },
        {"type": "section", "text": {"type": "mrkdwn", "text": where}},
    ]
    text = _slack_escape(f"{title}: {summary}")[:SLACK_TEXT_CHARS]
    return {"text": text, "blocks": blocks}


def payload(format_: str, event: str, delivery_id: int, incident: Incident, public_url: str | None) -> dict[str, Any]:
    if format_ == "slack":
        return slack_payload(event, incident, public_url)
    return generic_payload(event, delivery_id, incident, public_url)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error here: urllib would turn the POST into a GET without the body, and a 2xx
    from that would count as delivered."""

    def redirect_request(self, *_args: Any, **_kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    if value.strip().isdigit():
        return float(value.strip())
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds()) if when.tzinfo else None


def post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> tuple[int | None, str, float | None]:
    """POST ``body``: (HTTP status or None, the error in words or "", a Retry-After in seconds). Never raises;
    the URL never appears in the error (it is a secret)."""
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with _OPENER.open(request, timeout=timeout_s) as resp:
            resp.read(65536)
            return int(resp.status), "", None
    except urllib.error.HTTPError as exc:
        try:
            said = exc.read(300).decode("utf-8", "replace").strip().replace("\n", " ")
        except (OSError, http.client.HTTPException):
            said = ""
        if 300 <= exc.code < 400:
            error = f"HTTP {exc.code}: redirected elsewhere (not followed); configure the final URL"
        else:
            error = f"HTTP {exc.code} {exc.reason}" + (f": {said}" if said else "")
        return exc.code, error.replace(url, masked_url(url)), _retry_after(exc.headers.get("Retry-After"))
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        error = f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__
        return None, error.replace(url, masked_url(url)), None


class Deliverer:
    """The thread that sends the outbox's due deliveries (one per service process; replicas share the
    work through the outbox's claims)."""

    def __init__(
        self,
        outbox: Outbox,
        policy: RetryPolicy,
        public_url: str | None,
        timeout_s: float = 5.0,
        poll_s: float = 1.0,
        user_agent: str = "HyperWatch",
    ) -> None:
        self.outbox, self.policy, self.public_url = outbox, policy, public_url
        self.timeout_s, self.poll_s, self.user_agent = timeout_s, poll_s, user_agent
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False

    def start(self) -> Deliverer:
        self._thread = threading.Thread(target=self._loop, name="hyperwatch-webhooks", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop after the POST in flight (a leased delivery not sent yet is due again when its lease ends)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s if timeout_s is not None else self.timeout_s + 5)
        self.outbox.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                while self.run_once() and not self._stop.is_set():
                    pass
                if self._failing:
                    log.info("webhook outbox readable again; notifications resume")
                self._failing = False
            except MonitorError as exc:
                if not self._failing:  # once per outage, not once per poll
                    log.warning("webhook notifications paused: %s", exc)
                self._failing = True
            except Exception:
                if not self._failing:
                    log.exception("webhook notifications paused by an unexpected error")
                self._failing = True
            self._stop.wait(self.poll_s)

    def run_once(self) -> int:
        """Send what is due now, once; how many deliveries were attempted."""
        if not self.outbox.due():
            return 0
        claimed = self.outbox.claim(CLAIM_BATCH, CLAIM_BATCH * self.timeout_s + 30)
        for c in claimed:
            if self._stop.is_set():
                break
            self.deliver(c)
        return len(claimed)

    def deliver(self, c: Claimed) -> str:
        """POST one claimed delivery and record its outcome: delivered, retry or failed."""
        body = json.dumps(payload(c.format, c.event, c.id, c.incident, self.public_url), allow_nan=False)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": self.user_agent,
            "X-HyperWatch-Event": c.event,
            "X-HyperWatch-Delivery": str(c.id),
        }
        started = time.monotonic()
        status, error, retry_after = post(c.url, body.encode(), headers, self.timeout_s)
        if status is not None and 200 <= status < 300:
            self.outbox.delivered(c, status)
            WEBHOOK_DELIVERIES.labels("delivered").inc()
            log.info("webhook %d: incident %d delivered (%s)", c.webhook_id, c.incident.id, masked_url(c.url))
            return "delivered"
        gave_up = self.outbox.failed(c, status, error, self.policy, retry_after)
        outcome = "failed" if gave_up else "retry"
        WEBHOOK_DELIVERIES.labels(outcome).inc()
        log.warning(
            "webhook %d (%s): incident %d, attempt %d failed after %.1f s: %s; %s",
            c.webhook_id,
            masked_url(c.url),
            c.incident.id,
            c.attempts,
            time.monotonic() - started,
            error,
            "given up" if gave_up else "will retry",
        )
        return outcome


def start_deliverer(store: Store, settings: Settings, version: str = "") -> Deliverer:
    """The app's deliverer, on an outbox of its own connections, started."""
    policy = RetryPolicy(
        settings.webhook_retry_initial_s,
        max(settings.webhook_retry_max_s, settings.webhook_retry_initial_s),
        settings.webhook_give_up_after_s,
        settings.webhook_max_attempts,
    )
    agent = f"HyperWatch/{version}" if version else "HyperWatch"
    return Deliverer(
        store.webhook_outbox(),
        policy,
        settings.public_url,
        settings.webhook_timeout_s,
        settings.webhook_poll_s,
        agent,
    ).start()


def send_test(url: str, format_: str, project: str, public_url: str | None, timeout_s: float) -> tuple[int | None, str]:
    """POST an example incident to ``url`` now (nothing stored): (HTTP status or None, error or "")."""
    now = datetime.now(UTC)
    example = Incident(
        id=0,
        run_id=0,
        run="example-run",
        project=project,
        rule="z_growth",
        source="service",
        severity="warning",
        name="attention_z",
        first_step=1200,
        last_step=1260,
        events=4,
        first_value=180.0,
        peak_value=410.0,
        baseline=52.0,
        layers=[3, 4],
        heads=[],
        steps=[1200, 1220, 1240, 1260],
        message="test notification from HyperWatch: this webhook works",
        created_at=now,
        updated_at=now,
    )
    body = json.dumps(payload(format_, "test", 0, example, public_url), allow_nan=False).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "HyperWatch", "X-HyperWatch-Event": "test"}
    status, error, _ = post(url, body, headers, timeout_s)
    return status, error
