"""Liveness, readiness and the Prometheus scrape endpoint (outside /api/v1)."""

from __future__ import annotations

import threading
import time

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hyperwatch.monitor.api.deps import ReadAuth, StoreDep
from hyperwatch.monitor.api.query_schemas import HealthOut
from hyperwatch.monitor.core.errors import MonitorError

router = APIRouter(tags=["health"])


class FullDisk:
    """The database's disk was found full by a write (StoreFullError): ``/readyz`` says so.

    Reads still answer then (ping and the schema check need no space), so readiness comes from
    the writes themselves: not ready from a full-disk failure until a write succeeds again, or
    ``hold_s`` passes without another one (so that a balancer that stopped sending writes to this
    replica lets it try again)."""

    def __init__(self, hold_s: float = 60.0) -> None:
        self.hold_s = hold_s
        self._lock = threading.Lock()
        self._seen: tuple[float, str] | None = None

    def mark(self, message: str) -> None:
        with self._lock:
            self._seen = (time.monotonic(), message)

    def clear(self) -> None:
        with self._lock:
            self._seen = None

    def current(self) -> str | None:
        """The last full-disk message while it holds, else None."""
        with self._lock:
            if self._seen is None or time.monotonic() - self._seen[0] > self.hold_s:
                return None
            return self._seen[1]


@router.get("/healthz", response_model=HealthOut, summary="The process is up")
async def healthz() -> HealthOut:
    """Answered on the event loop: a liveness probe never queues for a thread of the pool the reads use."""
    return HealthOut(status="ok")


@router.get(
    "/readyz",
    response_model=HealthOut,
    summary="The database answers, its schema is current and its disk took the last write",
    responses={503: {"model": HealthOut}},
)
def readyz(request: Request, store: StoreDep) -> Response:
    full: FullDisk | None = getattr(request.app.state, "full_disk", None)
    message = full.current() if full is not None else None
    if message is not None:
        return JSONResponse({"status": "unavailable", "detail": message}, status_code=503)
    try:
        store.ping()
        store.check_schema()
    except MonitorError as exc:
        return JSONResponse({"status": "unavailable", "detail": str(exc)}, status_code=503)
    return JSONResponse({"status": "ok", "detail": None})


@router.get("/metrics", summary="Prometheus metrics", response_class=Response, dependencies=[ReadAuth])
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
