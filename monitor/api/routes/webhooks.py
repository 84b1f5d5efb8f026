"""A project's notification webhooks: new incidents POSTed to Slack or any JSON endpoint, retried.

``/api/v1/projects/{project}/webhooks`` (the write token for all of it: a webhook URL is a secret):

- ``POST`` creates one (``{"url", "format": "slack"|"generic", "min_severity", "name", "include_prometheus"}``;
  201), or updates the project's webhook of the same URL (200), so a setup script can run twice;
- ``GET`` lists them, each with its deliveries pending, delivered and failed and the latest attempt
  (when, state, HTTP status, error); ``GET .../{id}`` one;
- ``PATCH .../{id}`` changes fields; ``DELETE .../{id}`` removes it with its queued deliveries;
- ``POST .../{id}/test`` sends an example notification now and says what the receiver answered.

The URL is never sent back: scheme, host and its last 4 characters only. What is sent, when and how
often: :mod:`monitor.alerting.notify`. Alertmanager stays the production path for the Prometheus
rules' alerts; these webhooks carry the service's own incidents (and, with ``include_prometheus``,
those Alertmanager posted to ``/api/v1/alerts/prometheus``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from fastapi import APIRouter, Response
from pydantic import BaseModel, BeforeValidator, Field, StrictBool

from hyperwatch.hooks.schema import SchemaError, validate_run_name
from hyperwatch.monitor.alerting.notify import masked_url, send_test
from hyperwatch.monitor.api.deps import ReadAuth, SettingsDep, StoreDep, WriteAuth
from hyperwatch.monitor.api.field_types import KEEP, Text, not_null
from hyperwatch.monitor.api.schemas import Strict
from hyperwatch.monitor.core.errors import InvalidInputError
from hyperwatch.monitor.store.webhooks import Webhook

router = APIRouter(tags=["webhooks"])  # reads: the read token (URLs masked); changes and test sends: the write token

MAX_URL_CHARS = 2000
EXAMPLE_URL = "https://hooks.slack.com/services/T0123ABCD/B0123ABCD/your-webhook-secret"


def _webhook_url(value: Any) -> Any:
    """An http(s) URL with a host, ASCII, no blanks; the messages never repeat it (it is a secret)."""
    if not isinstance(value, str):
        raise ValueError(f"must be a string: the webhook's http:// or https:// URL, e.g. {EXAMPLE_URL}")
    url = value.strip()
    if len(url) > MAX_URL_CHARS:
        raise ValueError(f"is {len(url)} characters long; the limit is {MAX_URL_CHARS}")
    if not url.isascii() or any(c.isspace() or not c.isprintable() for c in url):
        raise ValueError("must be ASCII without blanks or control characters; percent-encode others (%20)")
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        scheme = repr(parts.scheme) if parts.scheme else "missing"
        raise ValueError(f"scheme {scheme} is not supported; give an http:// or https:// URL, e.g. {EXAMPLE_URL}")
    if not parts.hostname:
        raise ValueError(f"has no host; give the whole URL, e.g. {EXAMPLE_URL}")
    try:
        _ = parts.port
    except ValueError:
        raise ValueError("has a port that is not a number from 1 to 65535") from None
    if parts.fragment:
        raise ValueError("has a #fragment, which is never sent; remove it")
    return url


WebhookUrl = Annotated[
    str, BeforeValidator(_webhook_url), Field(description=f"http:// or https://, e.g. {EXAMPLE_URL}")
]
Format = Literal["slack", "generic"]
Severity = Literal["info", "warning", "critical"]
_FORMAT_DOC = "slack: a Slack incoming webhook's text + blocks; generic: {event, incident, run, url, ...}"
_SEVERITY_DOC = "the lowest incident severity sent (info pages nobody: warning by default)"
_PROMETHEUS_DOC = "also the incidents of Alertmanager's alerts (already routed by Alertmanager's own receivers)"


class WebhookIn(Strict):
    url: WebhookUrl
    format: Format = Field(default="slack", description=_FORMAT_DOC)
    min_severity: Severity = Field(default="warning", description=_SEVERITY_DOC)
    name: Annotated[Text, Field(max_length=200)] = Field(default="", description="a label, e.g. #training-alerts")
    include_prometheus: StrictBool = Field(default=False, description=_PROMETHEUS_DOC)


class WebhookPatch(Strict):
    """Fields to change; a field left out keeps its value."""

    url: Annotated[WebhookUrl, not_null("send the new URL")] = Field(default=KEEP)
    format: Annotated[Format, not_null("send slack or generic")] = Field(default=KEEP, description=_FORMAT_DOC)
    min_severity: Annotated[Severity, not_null("send info, warning or critical")] = Field(
        default=KEEP, description=_SEVERITY_DOC
    )
    name: Annotated[Text, not_null('send "" to clear it')] = Field(default=KEEP, max_length=200)
    include_prometheus: Annotated[StrictBool, not_null("send true or false")] = Field(
        default=KEEP, description=_PROMETHEUS_DOC
    )


class DeliveryOut(BaseModel):
    incident_id: int
    event: str = Field(description="incident.opened, or incident.escalated (its severity reached min_severity later)")
    state: str = Field(description="delivered; retrying (will be tried again); failed (given up); sending")
    attempts: int
    at: datetime = Field(description="when it was last attempted")
    http_status: int | None = Field(description="the receiver's answer (null: none, e.g. a timeout)")
    error: str | None
    next_attempt_at: datetime | None = Field(description="when retrying: the next attempt")


class WebhookOut(BaseModel):
    id: int
    project: str
    name: str
    url: str = Field(description="masked: scheme, host and the last 4 characters (the URL is a secret)")
    format: str
    min_severity: str
    include_prometheus: bool
    created_at: datetime
    updated_at: datetime
    pending: int = Field(description="deliveries queued or being retried")
    delivered: int
    failed: int = Field(description="deliveries given up")
    last_delivery: DeliveryOut | None = Field(description="the latest attempted delivery")


class WebhookTestOut(BaseModel):
    delivered: bool = Field(description="the receiver answered 2xx")
    http_status: int | None
    error: str | None


def _out(w: Webhook) -> WebhookOut:
    last = None if w.last is None else DeliveryOut.model_validate(vars(w.last))
    fields = {k: v for k, v in vars(w).items() if k not in ("url", "last")}
    return WebhookOut(**fields, url=masked_url(w.url), last_delivery=last)


def _project(project: str) -> str:
    try:
        return validate_run_name(project, "project")
    except SchemaError as exc:
        raise InvalidInputError(str(exc)) from exc


@router.post(
    "/projects/{project}/webhooks",
    response_model=WebhookOut,
    status_code=201,
    responses={200: {"model": WebhookOut, "description": "the project's webhook of this URL, updated"}},
    dependencies=[WriteAuth],
    summary="Add a webhook for the project's new incidents (Slack or generic JSON)",
)
def add_webhook(project: str, body: WebhookIn, store: StoreDep, response: Response) -> WebhookOut:
    fields = body.model_dump(exclude={"url"}, exclude_unset=True)
    hook, created = store.upsert_webhook(_project(project), body.url, fields)
    response.status_code = 201 if created else 200
    return _out(hook)


@router.get(
    "/projects/{project}/webhooks",
    response_model=list[WebhookOut],
    dependencies=[ReadAuth],
    summary="A project's webhooks",
)
def list_webhooks(project: str, store: StoreDep) -> list[WebhookOut]:
    return [_out(w) for w in store.list_webhooks(project)]


@router.get(
    "/projects/{project}/webhooks/{webhook_id}",
    response_model=WebhookOut,
    dependencies=[ReadAuth],
    summary="One webhook",
)
def get_webhook(project: str, webhook_id: int, store: StoreDep) -> WebhookOut:
    return _out(store.get_webhook(project, webhook_id))


@router.patch(
    "/projects/{project}/webhooks/{webhook_id}",
    response_model=WebhookOut,
    dependencies=[WriteAuth],
    summary="Change a webhook",
)
def update_webhook(project: str, webhook_id: int, body: WebhookPatch, store: StoreDep) -> WebhookOut:
    return _out(store.update_webhook(project, webhook_id, body.model_dump(exclude_unset=True)))


@router.delete(
    "/projects/{project}/webhooks/{webhook_id}",
    response_model=WebhookOut,
    dependencies=[WriteAuth],
    summary="Remove a webhook and its queued deliveries",
)
def delete_webhook(project: str, webhook_id: int, store: StoreDep) -> WebhookOut:
    return _out(store.delete_webhook(project, webhook_id))


@router.post(
    "/projects/{project}/webhooks/{webhook_id}/test",
    response_model=WebhookTestOut,
    dependencies=[WriteAuth],
    summary="Send an example notification now (nothing stored) and say what the receiver answered",
)
def test_webhook(project: str, webhook_id: int, store: StoreDep, settings: SettingsDep) -> WebhookTestOut:
    hook = store.get_webhook(project, webhook_id)
    status, error = send_test(hook.url, hook.format, project, settings.public_url, settings.webhook_timeout_s)
    ok = status is not None and 200 <= status < 300
    return WebhookTestOut(delivered=ok, http_status=status, error=None if ok else error)
