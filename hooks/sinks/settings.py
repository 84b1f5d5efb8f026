"""The HTTP sink's settings read from the environment, and the URL hint for a wrong base URL.

``$HYPERWATCH_SPOOL`` (where the spool lives), ``$HYPERWATCH_SPOOL_MAX_BYTES`` (its bound) and
``$HYPERWATCH_CLOSE_TIMEOUT`` (how long ``close()`` waits for delivery before leaving the rest in
the spool). Bad values fail with the variable's name and an example, never silently default.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from hyperwatch.hooks.sinks.base import SinkError

DEFAULT_SPOOL_MAX_BYTES = 1 << 30
DEFAULT_CLOSE_TIMEOUT_S = 5.0


def default_spool_max_bytes() -> int:
    """``$HYPERWATCH_SPOOL_MAX_BYTES`` (an integer number of bytes), else 1 GiB."""
    raw = os.environ.get("HYPERWATCH_SPOOL_MAX_BYTES", "").strip()
    if not raw:
        return DEFAULT_SPOOL_MAX_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 1:
        raise SinkError(
            f"HYPERWATCH_SPOOL_MAX_BYTES={raw!r}: must be a positive integer number of bytes, e.g. 1073741824"
        )
    return value


def check_close_timeout(value: object, field: str = "close_timeout") -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 <= value < float("inf")):
        raise SinkError(f"{field}: must be a finite number of seconds >= 0, got {value!r}; e.g. 5")
    return float(value)


def default_close_timeout() -> float:
    """``$HYPERWATCH_CLOSE_TIMEOUT`` (seconds), else 5: how long ``close()`` waits for delivery."""
    raw = os.environ.get("HYPERWATCH_CLOSE_TIMEOUT", "").strip()
    if not raw:
        return DEFAULT_CLOSE_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    return check_close_timeout(value, f"HYPERWATCH_CLOSE_TIMEOUT={raw!r}")


def base_url_hint(url: str) -> str:
    """The service's base URL a user probably meant: ``url`` without a trailing ``/api/v1`` or ``/api``."""
    for suffix in ("/api/v1", "/api"):
        if url.rstrip("/").endswith(suffix):
            return url.rstrip("/")[: -len(suffix)]
    return url


def default_spool() -> Path:
    return Path(os.environ.get("HYPERWATCH_SPOOL") or Path.home() / ".cache" / "hyperwatch" / "spool")


def not_found_message(url: str) -> str:
    """Why creating the run got a 404: the URL is not the service's base URL."""
    hint = base_url_hint(url)
    better = hint if hint != url else "http://HOST:8000"
    return (
        f"POST {url.rstrip('/')}/api/v1/runs answered 404 Not Found: {url} is not the "
        f"HyperWatch service's base URL. Give the service's base URL (the sink adds /api/v1 itself), "
        f"e.g. sink={better!r}; the spool keeps every batch meanwhile"
    )


def replay_command(folder: Path, url: str, token: str | None) -> str:
    """The exact command that delivers what a spool folder holds for its run."""
    command = f"hyperwatch upload {shlex.quote(str(folder))} --server {shlex.quote(base_url_hint(url))}"
    if token:
        command += "  # with HYPERWATCH_TOKEN set (or --token)"
    return command
