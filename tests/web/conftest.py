"""A live service (real uvicorn on a free localhost port, SQLite file) seeded through the API, and
headless Chromium. Browser tests skip locally when Chromium is missing and fail under CI=true."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from hyperwatch.monitor.store import SqlStore, migrate
from tests.server_thread import start
from tests.web.browser import chromium, missing_browser
from tests.web.seed import seed, seed_sweep, seed_xss

WRITE_TOKEN = "web-test-write-token-0123456789"
READ_TOKEN = "web-test-read-token-0123456789"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "web"


@dataclass
class Live:
    base: str
    store: SqlStore
    ids: dict[str, Any] = field(default_factory=dict)


def serve(store: SqlStore, **settings: Any) -> tuple[uvicorn.Server, threading.Thread, str]:
    return start(store, WRITE_TOKEN, **settings)


def _live(tmp: Path, **settings: Any) -> Iterator[Live]:
    store = SqlStore(f"sqlite:///{tmp / 'web.db'}")
    migrate.upgrade(store.engine)
    server, thread, base = serve(store, **settings)
    try:
        yield Live(base, store)
    finally:
        server.should_exit = True
        thread.join(10)
        store.close()


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """The ladder (4 scales, per-layer indicators, a NaN), an XSS-named run, and an LR/method sweep."""
    for lv in _live(tmp_path_factory.mktemp("web")):
        lv.ids = seed(lv.base, WRITE_TOKEN)
        lv.ids["xss_run_id"] = seed_xss(lv.store)
        lv.ids["xss_group_id"] = lv.store.get_run(lv.ids["xss_run_id"]).group_id
        lv.ids["sweep_group_id"] = seed_sweep(lv.base, WRITE_TOKEN)
        yield lv


@pytest.fixture(scope="session")
def live_with_read_token(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    for lv in _live(tmp_path_factory.mktemp("web-auth"), read_token=READ_TOKEN):
        lv.store.upsert_run("secret", "private-run", {"depth": 4})
        yield lv


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    why = missing_browser()
    if why:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"browser tests must run under CI=true: {why}")
        pytest.skip(why)
    with chromium() as driver:
        yield driver


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
