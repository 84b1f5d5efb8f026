"""``/docs`` and ``/redoc`` work offline: their assets come from the service, never from a CDN."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from hyperwatch.app import create_app
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.store import SqlStore, migrate
from tests.web.browser import chromium, console_errors, missing_browser, screenshot, wait_for
from tests.web.conftest import serve


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    s = SqlStore(f"sqlite:///{tmp_path / 'docs.db'}")
    migrate.upgrade(s.engine)
    yield s
    s.close()


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_only_local_assets(store: SqlStore, page: str) -> None:
    url = store.engine.url.render_as_string(hide_password=False)
    app = create_app(Settings(database_url=url, dev_mode=True), store=store, registry=CollectorRegistry())
    with TestClient(app) as c:
        html = c.get(page)
        assert html.status_code == 200
        sources = re.findall(r'(?:src|href)="([^"]+)"', html.text)
        assert sources and all(s.startswith("/") for s in sources), sources  # no http(s):// anywhere
        assert "fonts.googleapis" not in html.text
        for s in sources:
            if s.startswith("/docs-static/"):
                asset = c.get(s)
                assert asset.status_code == 200 and len(asset.content) > 1000, s
        assert c.get("/docs-static/nothing.js").status_code == 404


@pytest.mark.skipif(missing_browser() is not None, reason=str(missing_browser()))
def test_swagger_ui_renders_the_api_in_a_browser(store: SqlStore, artifacts: Path) -> None:
    server, thread, url = serve(store)
    try:
        with chromium() as driver:
            driver.get(f"{url}/docs")
            wait_for(driver, lambda d: d.execute_script("return document.querySelectorAll('.opblock').length") > 5)
            paths = driver.execute_script(
                "return Array.from(document.querySelectorAll('.opblock-summary-path')).map(e => e.textContent)"
            )
            screenshot(driver, artifacts / "docs-swagger.png")
            assert console_errors(driver) == []
        assert any("/api/v1/alerts/prometheus" in p for p in paths), paths
    finally:
        server.should_exit = True
        thread.join(timeout=10)
