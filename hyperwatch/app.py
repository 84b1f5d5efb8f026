"""The whole app: the service's API (:mod:`monitor.api.app`) with the dashboards (:mod:`web`) mounted.

Assembled here, above both, so the dependency arrows run one way: web -> monitor (its read layer
:mod:`monitor.read.lines`), and neither imports this module. ``hyperwatch serve`` runs this app.
"""

from __future__ import annotations

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from hyperwatch import __version__
from hyperwatch.monitor.api.app import create_app as create_api
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.store import Store
from hyperwatch.web.router import router as web_router


def create_app(settings: Settings, store: Store | None = None, registry: CollectorRegistry | None = None) -> FastAPI:
    """The API plus the pages under ``/`` and their JSON under ``/ui/data`` (same read auth)."""
    app = create_api(settings, store=store, registry=registry, version=__version__)
    app.include_router(web_router)
    return app
