"""Routes under /api/v1, one module per resource.

Where future routes go: the scaling analysis of a group (``monitor.analysis.fit_group``, written
separately) gets its own module ``analysis.py`` here with a ``router`` (e.g.
``GET /api/v1/groups/{group_id}/fit``), added to :data:`API_ROUTERS` below.
"""

from __future__ import annotations

from fastapi import APIRouter

from monitor.api.routes import alerts, groups, points, query, runs

API_ROUTERS: list[APIRouter] = [runs.router, groups.router, points.router, query.router, alerts.router]
