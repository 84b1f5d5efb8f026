"""Domain errors of the monitoring service.

The store raises these (never SQLAlchemy's own exceptions); the API turns each into an HTTP status
with the same message, so a message must name the input and say how to fix it.
"""

from __future__ import annotations


class MonitorError(Exception):
    """Base class; ``status_code`` is what the API answers."""

    status_code = 400


class NotFoundError(MonitorError):
    status_code = 404


class InvalidInputError(MonitorError):
    """An input the schema allowed but the data does not (e.g. an x-axis a run has no field for)."""

    status_code = 422


class ConflictError(MonitorError):
    status_code = 409


class StoreUnavailableError(MonitorError):
    """The database failed or cannot be reached; the message says which operation.

    The API answers 503 with ``Retry-After: retry_after`` seconds.
    """

    status_code = 503
    retry_after = 5


class StoreBusyError(StoreUnavailableError):
    """A write lost a lock race (SQLite busy, PostgreSQL deadlock) even after waiting; retried, then 503."""


class StoreFullError(StoreUnavailableError):
    """The database's disk (or its size limit) is full: the transaction was rolled back, nothing of
    the request was stored. 503, and ``/readyz`` answers not ready for a while after one."""

    retry_after = 60


class SchemaOutOfDateError(MonitorError):
    """The database schema is not the revision this code needs; run ``hyperwatch db upgrade``."""

    status_code = 503


class ConfigError(ValueError):
    """A setting that cannot be used (placeholder secret outside dev mode, bad URL, ...)."""
