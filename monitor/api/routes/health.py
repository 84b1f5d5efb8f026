"""Liveness, readiness and the Prometheus scrape endpoint (outside /api/v1)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hyperwatch.monitor.api.deps import ReadAuth, StoreDep
from hyperwatch.monitor.core.errors import MonitorError
from hyperwatch.monitor.schemas import HealthOut

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthOut, summary="The process is up")
def healthz() -> HealthOut:
    return HealthOut(status="ok")


@router.get(
    "/readyz",
    response_model=HealthOut,
    summary="The database answers and its schema is current",
    responses={503: {"model": HealthOut}},
)
def readyz(store: StoreDep) -> Response:
    try:
        store.ping()
        store.check_schema()
    except MonitorError as exc:
        return JSONResponse({"status": "unavailable", "detail": str(exc)}, status_code=503)
    return JSONResponse({"status": "ok", "detail": None})


@router.get("/metrics", summary="Prometheus metrics", response_class=Response, dependencies=[ReadAuth])
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
