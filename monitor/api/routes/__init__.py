"""Routes under /api/v1, one module per resource.

``analysis.py`` (written with :mod:`monitor.analysis`) serves the scaling analysis of a group;
further route modules expose a ``router`` and are added to :data:`API_ROUTERS` below.
"""

from __future__ import annotations

from fastapi import APIRouter

from hyperwatch.monitor.api.routes import alerts, analysis, forecast, groups, live, points, query, runs, webhooks

API_ROUTERS: list[APIRouter] = [
    runs.router,
    groups.router,
    points.router,
    query.router,
    live.router,
    alerts.router,
    analysis.router,
    forecast.router,
    webhooks.router,
]
