"""Service settings, read from the environment with the prefix ``HYPERWATCH_``.

One :class:`Settings` object is built at start-up and handed to :func:`monitor.api.app.create_app`.
Outside dev mode it refuses to start with a missing or placeholder write token (and a placeholder
read token): a monitoring service reachable on a network must not accept anonymous writes.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from hyperwatch.hooks.schema import MAX_POINTS_PER_BATCH
from hyperwatch.monitor.core.serve_options import default_concurrent_reads

PLACEHOLDER_SECRETS = frozenset({"", "changethis", "changeme", "change-me", "secret", "password", "token", "dev"})
MIN_TOKEN_LENGTH = 16
# A random 16-character hex token (the shortest allowed, from the smallest usual alphabet) has
# fewer than 5 distinct characters with odds of 4 in 10 million; "aaaaaaaaaaaaaaaa" has 1.
MIN_DISTINCT_CHARACTERS = 5
DEFAULT_DATABASE_URL = "sqlite:///./hyperwatch.db"


class Settings(BaseSettings):
    """Environment: HYPERWATCH_DATABASE_URL, HYPERWATCH_WRITE_TOKEN, HYPERWATCH_READ_TOKEN, ..."""

    model_config = SettingsConfigDict(env_prefix="HYPERWATCH_", extra="ignore", validate_default=True)

    database_url: str = Field(
        default=DEFAULT_DATABASE_URL,
        description="SQLAlchemy URL: sqlite:///path.db (default) or postgresql+psycopg://user@host/db",
    )
    write_token: str | None = Field(
        default=None, repr=False, description="bearer token required for ingestion and run changes"
    )
    read_token: str | None = Field(default=None, repr=False, description="optional bearer token required for reads")
    dev_mode: bool = Field(default=False, description="allow a missing or placeholder token (local use only)")
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="allowed CORS origins, comma separated; empty = CORS closed"
    )
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024)
    max_points_per_batch: int = Field(default=MAX_POINTS_PER_BATCH, ge=1, le=MAX_POINTS_PER_BATCH)
    max_buckets: int = Field(default=10_000, ge=10, le=100_000, description="largest N of a downsampled series")
    max_compare_runs: int = Field(default=200, ge=1, le=10_000)
    max_page_size: int = Field(default=1000, ge=1, le=100_000)
    max_concurrent_reads: int | None = Field(
        default=None,
        ge=0,
        le=1000,
        description="series and figure reads computed at once (0 = no limit; unset: 1 on SQLite, 8 on "
        "PostgreSQL); the others wait without a thread",
    )
    # bounded cardinality (issue 37): a batch that would exceed one is refused whole with a 409 naming it
    max_series_per_run: int = Field(
        default=20_000,
        ge=1,
        le=10_000_000,
        description="distinct (metric name, layer) series one run may hold (a 64-layer model logs ~1,700)",
    )
    max_series_per_project: int = Field(
        default=5_000_000,
        ge=1,
        le=2_000_000_000,
        description="series of all the runs of one project together (~3,000 runs of a 64-layer model)",
    )
    max_metric_names: int = Field(
        default=100_000,
        ge=1,
        le=2**31 - 1,
        description="distinct metric names registered in the database, all projects together",
    )
    live_max_per_client: int = Field(
        default=64,
        ge=1,
        le=100_000,
        description="open live requests (GET /api/v1/live, /live/stream) from one client address; more are "
        "answered 429 with Retry-After",
    )
    live_max_total: int = Field(
        default=500,
        ge=1,
        le=100_000,
        description="open live requests in all; more are answered 503 with Retry-After (keep it well below "
        "serve --max-connections: above that, new connections close idle keep-alive ones)",
    )
    live_read_threads: int = Field(
        default=2,
        ge=1,
        le=64,
        description="threads that read the live news (one read per run per change, shared by its watchers), "
        "apart from the request thread pool",
    )
    check_schema: bool = Field(default=True, description="refuse to start on an out-of-date schema")
    stale_after_s: float = Field(
        default=900.0, gt=0, description="a running run without points for this long is shown as stale"
    )
    # notifications without Alertmanager (monitor.alerting.notify): links, sending, retries
    public_url: str | None = Field(
        default=None,
        description="the service's address as its users reach it (https://hyperwatch.example.org), for the "
        "links in webhook notifications; unset, a notification says so instead of a link",
    )
    webhook_delivery: bool = Field(
        default=True, description="send the webhooks' notifications from this process (off: leave them queued)"
    )
    webhook_timeout_s: float = Field(default=5.0, gt=0, le=60, description="one webhook POST's timeout")
    webhook_poll_s: float = Field(default=1.0, gt=0, le=60, description="how often the outbox is looked at")
    webhook_retry_initial_s: float = Field(
        default=10.0, gt=0, le=86_400, description="wait before a failed notification's first retry (doubling)"
    )
    webhook_retry_max_s: float = Field(default=3600.0, gt=0, le=86_400, description="longest wait between retries")
    webhook_give_up_after_s: float = Field(
        default=86_400.0,
        gt=0,
        le=30 * 86_400,
        description="a notification not delivered this long after its incident opened is given up (marked failed)",
    )
    webhook_max_attempts: int = Field(default=32, ge=1, le=1000, description="attempts before giving up")

    @field_validator("write_token", "read_token", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and value.strip() == "" else value

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: object) -> object:
        if isinstance(value, str):
            return [o.strip() for o in value.split(",") if o.strip()]
        return value

    @field_validator("database_url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        if not value.startswith(("sqlite:", "postgresql")):
            raise ValueError(
                f"HYPERWATCH_DATABASE_URL {value!r} is not supported; use sqlite:///path.db "
                "or postgresql+psycopg://user@host:5432/dbname"
            )
        if value.startswith("postgresql://") or value.startswith("postgres://"):
            raise ValueError(
                f"HYPERWATCH_DATABASE_URL {value!r} names no driver; write postgresql+psycopg://... "
                "(psycopg 3 is the installed driver)"
            )
        return value

    @field_validator("public_url", mode="before")
    @classmethod
    def _check_public_url(cls, value: object) -> object:
        if value is None or (isinstance(value, str) and value.strip() == ""):
            return None
        if not isinstance(value, str):
            return value
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError(
                f"HYPERWATCH_PUBLIC_URL {value!r} is not the service's base address; give its http:// or https:// "
                "URL as users open it, without query or fragment, e.g. https://hyperwatch.example.org or "
                "http://10.0.0.5:8000"
            )
        return value.strip().rstrip("/")

    def concurrent_reads(self) -> int:
        """``max_concurrent_reads``, or its default for this database (``serve_options``)."""
        if self.max_concurrent_reads is not None:
            return self.max_concurrent_reads
        return default_concurrent_reads(self.database_url)

    @model_validator(mode="after")
    def _refuse_placeholders(self) -> Settings:
        if self.dev_mode:
            return self
        hint = (
            "set it to a random secret of at least 16 characters, e.g. "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))', or run with --dev "
            "(HYPERWATCH_DEV_MODE=1) for local use"
        )
        if self.write_token is None:
            raise ValueError(f"HYPERWATCH_WRITE_TOKEN is missing; {hint}")
        weak = token_weakness(self.write_token)
        if weak:
            raise ValueError(f"HYPERWATCH_WRITE_TOKEN {weak}; {hint}")
        weak = token_weakness(self.read_token) if self.read_token is not None else ""
        if weak:
            raise ValueError(f"HYPERWATCH_READ_TOKEN {weak}; {hint}, or leave it unset for open reads")
        return self


def token_weakness(token: str) -> str:
    """Why ``token`` is too weak to guard the service ("" when it is not): what the message says."""
    if token.strip().lower() in PLACEHOLDER_SECRETS:
        return "is a placeholder"
    if any(c.isspace() for c in token):
        return "contains whitespace (a copy-paste slip, or padding to the length)"
    if len(token) < MIN_TOKEN_LENGTH:
        return f"is {len(token)} characters long, shorter than {MIN_TOKEN_LENGTH}"
    if len(set(token)) < MIN_DISTINCT_CHARACTERS:
        return f"has only {len(set(token))} distinct characters (at least {MIN_DISTINCT_CHARACTERS} needed)"
    return ""
