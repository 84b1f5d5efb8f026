"""ASGI middleware: request body size limit (413) and request timing for Prometheus."""

from __future__ import annotations

import json
import time
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hyperwatch.monitor.alerting.prometheus import REQUEST_DURATION


def _message(limit: int) -> str:
    return (
        f"request body is larger than the limit of {limit} bytes (HYPERWATCH_MAX_BODY_BYTES); "
        "split the batch into smaller ones"
    )


class _TooLarge(HTTPException):
    """An HTTPException so that FastAPI's body reader passes it on as a 413 (not a 400)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, _message(limit))


async def _reply_413(send: Send, limit: int) -> None:
    body = json.dumps({"detail": _message(limit)}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodySizeLimit:
    """413 when Content-Length or the streamed body exceeds ``limit`` bytes, before any parsing."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            # bytes.isdigit() is ASCII only; more than 18 digits is above any limit (and unread by int())
            if name == b"content-length" and value.isdigit() and (len(value) > 18 or int(value) > self.limit):
                await _reply_413(send, self.limit)
                return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge(self.limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await _reply_413(send, self.limit)


_WRITES = frozenset({"POST", "PATCH", "PUT", "DELETE"})


class RequestTiming:
    """Observes hyperwatch_http_request_duration_seconds{method, route, status} per request; a write
    answered 2xx clears the app's full-disk mark (``app.state.full_disk``, see routes/health.py)."""

    def __init__(self, app: ASGIApp, prefixes: tuple[str, ...] = ()) -> None:
        self.app = app
        self.prefixes = prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status: dict[str, Any] = {"code": 500}

        async def tracking_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        finally:
            if scope["method"] in _WRITES and 200 <= status["code"] < 300:
                full = getattr(getattr(scope.get("app"), "state", None), "full_disk", None)
                if full is not None:
                    full.clear()  # a write went through: the disk takes writes again (/readyz)
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"  # template, never the raw path
            for prefix in self.prefixes:  # routes of an included router may carry their path sans prefix
                if scope["path"].startswith(prefix + "/") and not template.startswith(prefix + "/"):
                    template = prefix + template
            REQUEST_DURATION.labels(scope["method"], template, f"{status['code'] // 100}xx").observe(
                time.perf_counter() - t0
            )
