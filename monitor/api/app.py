"""The service's API: ``create_app(settings)`` (routes under /api/v1, health, /metrics), no pages.

The dashboards are mounted above this by :func:`hyperwatch.app.create_app`, which ``hyperwatch
serve`` runs: monitor/ never imports web/ (web reads through :mod:`monitor.read.lines`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from importlib import metadata
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from hyperwatch.monitor.alerting import notify
from hyperwatch.monitor.alerting.forecast_band import ForecastWatches
from hyperwatch.monitor.alerting.prometheus import DATABASE_ERRORS, build_registry
from hyperwatch.monitor.api.body_errors import is_long_integer, long_integer_error
from hyperwatch.monitor.api.connections import LiveConnectionCap
from hyperwatch.monitor.api.deps import ReadSlots, ids_in_range
from hyperwatch.monitor.api.docs import add_local_docs
from hyperwatch.monitor.api.middleware import BodySizeLimit, RequestTiming
from hyperwatch.monitor.api.routes import API_ROUTERS, health
from hyperwatch.monitor.api.routes.health import FullDisk
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.core.errors import MonitorError, StoreFullError
from hyperwatch.monitor.store import SqlStore, Store
from hyperwatch.monitor.store.cardinality import SeriesLimits
from hyperwatch.monitor.store.engine import DB_ERRORS_HOOK

log = logging.getLogger(__name__)
API_PREFIX = "/api/v1"
DEFAULT_RETRY_AFTER_S = 30
CLIENT_CLOSED_REQUEST = 499  # nginx's code: the client went away before the service could answer
_FASTAPI_PARSE_ERROR = "There was an error parsing the body"
BODY_PARSE_MESSAGE = (
    "the request body could not be parsed: it must be UTF-8 JSON nested at most a few hundred levels "
    "deep; for POST /api/v1/points send one hooks wire-format batch {batch_id, run, points}"
)


def installed_version() -> str:
    """The installed distribution's version (pyproject.toml's), read from its metadata: the service
    never imports the package that assembles it (``hyperwatch``, which passes its ``__version__``)."""
    try:
        return metadata.version("hyperwatch")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def create_app(
    settings: Settings,
    store: Store | None = None,
    registry: CollectorRegistry | None = None,
    version: str | None = None,
) -> FastAPI:
    """Build the app; raises SchemaOutOfDateError (naming ``hyperwatch db upgrade``) on an old schema.
    ``version`` is the one the API reports (default: :func:`installed_version`)."""
    store = store if store is not None else SqlStore(settings.database_url)
    store.series_limits = SeriesLimits(
        settings.max_series_per_run, settings.max_series_per_project, settings.max_metric_names
    )
    if settings.check_schema:
        store.check_schema()
    if settings.dev_mode and settings.write_token is None:
        log.warning("dev mode without HYPERWATCH_WRITE_TOKEN: anyone who can reach this port can write")
    if not DB_ERRORS_HOOK:
        DB_ERRORS_HOOK.append(lambda _exc: DATABASE_ERRORS.inc())
    shown_version = version or installed_version()

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # the webhooks' deliverer (monitor.alerting.notify) runs while the service serves
        deliverer = notify.start_deliverer(store, settings, shown_version) if settings.webhook_delivery else None
        try:
            yield
        finally:
            if deliverer is not None:
                await asyncio.to_thread(deliverer.stop)

    app = FastAPI(
        title="HyperWatch monitor",
        version=shown_version,
        lifespan=lifespan,
        description="Training-stability monitoring: ingest metric points, query series, alerts, Prometheus.",
        docs_url=None,  # served below from local assets: the CDN defaults are a blank page offline
        redoc_url=None,
        dependencies=[Depends(ids_in_range)],  # an id beyond the integer range: 404, before the route runs
    )
    add_local_docs(app)
    app.state.settings = settings
    app.state.store = store
    app.state.registry = build_registry(store, registry)
    app.state.full_disk = FullDisk()  # a write that found the disk full: /readyz not ready
    app.state.forecast_watches = ForecastWatches()  # the forecast alert's bands, per run (points route)
    app.state.read_slots = ReadSlots(settings.concurrent_reads())  # heavy reads at once (api.deps.QueryReaderDep)
    for router in API_ROUTERS:
        app.include_router(router, prefix=API_PREFIX)
    app.include_router(health.router)

    @app.exception_handler(MonitorError)
    async def _domain_error(request: Request, exc: MonitorError) -> JSONResponse:
        headers = None
        if isinstance(exc, StoreFullError):
            app.state.full_disk.mark(str(exc))
        if exc.status_code == 503:  # the database: the client should come back, and says when
            headers = {"Retry-After": str(getattr(exc, "retry_after", DEFAULT_RETRY_AFTER_S))}
        if exc.status_code == 422:
            # The schema's 422 (HTTPValidationError): ``detail`` is a list of errors; ``message`` the words.
            where = "query" if request.method in ("GET", "HEAD") else "body"
            error = {"loc": [where], "msg": str(exc), "type": "invalid_input"}
            return JSONResponse({"detail": [error], "message": str(exc)}, status_code=422)
        return JSONResponse({"detail": str(exc)}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 400 and exc.detail == _FASTAPI_PARSE_ERROR:
            # FastAPI's words for a body json.loads could not take (not UTF-8, nested too deep, ...).
            error = long_integer_error(await request.body()) if is_long_integer(exc.__cause__) else None
            if error is not None:  # one field too large to read: a 422 naming it, as any bad field
                message = f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}"
                return JSONResponse({"detail": [error], "message": message}, status_code=422)
            exc = StarletteHTTPException(400, BODY_PARSE_MESSAGE)
        return await http_exception_handler(request, exc)

    @app.exception_handler(ClientDisconnect)
    async def _client_left(request: Request, _exc: ClientDisconnect) -> Response:
        # Not the service's fault and nothing to fix here: no traceback, and /metrics counts a 4xx.
        # Nobody reads this reply; the request timing middleware sees its status.
        log.info("client disconnected before sending the whole request: %s %s", request.method, request.url.path)
        return Response(status_code=CLIENT_CLOSED_REQUEST)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The traceback goes to the service log (Starlette re-raises after this reply), never to the client.
        log.error("unexpected %s on %s %s", type(exc).__name__, request.method, request.url.path)
        return JSONResponse(
            {"detail": "internal error in the monitoring service; the service log has the details"},
            status_code=500,
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # The inputs are not echoed back: they may hold NaN, which JSON cannot carry.
        errors: list[dict[str, Any]] = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in exc.errors()
        ]
        summary = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors[:5])
        return JSONResponse({"detail": errors, "message": summary}, status_code=422)

    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "PATCH"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(BodySizeLimit, limit=settings.max_body_bytes)
    live_paths = (f"{API_PREFIX}/live", f"{API_PREFIX}/live/stream")  # open live requests, capped (issue 37)
    app.add_middleware(
        LiveConnectionCap, paths=live_paths, per_client=settings.live_max_per_client, total=settings.live_max_total
    )
    app.add_middleware(RequestTiming, prefixes=(API_PREFIX,))
    return app
