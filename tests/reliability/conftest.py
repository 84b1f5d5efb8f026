"""Fixtures: a migrated SQLite file or PostgreSQL database, and the real service over it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.monitor.conftest import pg_url, sqlite_url
from tests.reliability.support import Service, upgrade

__all__ = ["db_url", "pg_url", "service", "sqlite_url"]


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """A migrated database: a SQLite file, then a fresh PostgreSQL database (same test twice)."""
    url = str(request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url"))
    upgrade(url)
    return url


@pytest.fixture
def service(db_url: str, tmp_path: Path) -> Iterator[Service]:
    svc = Service(db_url, tmp_path / "service.log")
    svc.start()
    try:
        yield svc
    finally:
        svc.kill()
