"""Bounded connections for ``hyperwatch serve``: slow or half-open clients cannot starve the service.

uvicorn by itself waits forever for a request's headers and body, and accepts connections until
the process runs out of file descriptors: one local client holding ~20,000 half-open connections
made ``/healthz`` hang. :func:`guarded_protocol` builds one of uvicorn's HTTP/1.1 protocols (h11's,
the default, or httptools' C parser when asked for and installed) with two limits:

- ``request_timeout``: a client has this many seconds, from connecting (or from the end of its
  previous response), to send a whole request, headers and body; then the connection is closed.
  Time the service spends answering does not count.
- ``max_connections``: above this many open connections, each new one closes the connection that
  has waited longest for its client's request (a half-open one first, never one whose request
  is being answered). A fresh client, like a health probe that sends its request at once, is
  served even while the table is full of stalled ones; file descriptors stay bounded.

Both limits live in :class:`ConnectionGuard`, shared by the two protocols; each protocol only says
when its connection is waiting for the client (:meth:`ConnectionGuard.waiting_for_client`).
h11 stays the default: bench/http_overhead.py measured httptools (with uvloop) ~0.15 ms faster per
512-point batch, under a tenth of the HTTP overhead and within the noise of a whole ingest (issue 16).

:class:`LiveConnectionCap` bounds the other long-lived kind: live requests (a stream lasts up to 30 s),
per client and in all, refused with ``Retry-After`` before they start.

On a network (``--host 0.0.0.0``) a fronting proxy (nginx, Caddy, a cloud load balancer) with its
own timeouts remains the recommended setup; these limits keep the bare service safe without one.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
from typing import TYPE_CHECKING, Any

import h11
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from hyperwatch.monitor.core.serve_options import DEFAULT_MAX_CONNECTIONS, DEFAULT_REQUEST_TIMEOUT_S, HTTP_CHOICES

log = logging.getLogger(__name__)
_WAITING_FOR_CLIENT = (h11.IDLE, h11.SEND_BODY)


class ConnectionGuard(asyncio.Protocol):
    """A request deadline and a connection cap for a uvicorn HTTP protocol (see the module doc).

    Mixed in before the protocol class (``class P(ConnectionGuard, H11Protocol)``): it uses the
    protocol's ``loop``, ``transport``, ``connections`` (every open connection of the server),
    ``client`` and ``cycle``, and hooks ``connection_made``, ``connection_lost`` and
    ``on_response_complete``.
    """

    request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    if TYPE_CHECKING:  # provided by the uvicorn protocol this is mixed into
        loop: asyncio.AbstractEventLoop
        transport: asyncio.Transport
        connections: set[Any]
        client: tuple[str, int] | None

        # each guarded protocol class says, from its parser's state, when the client still owes its
        # request (nothing of it is being answered)
        def waiting_for_client(self) -> bool: ...

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting_since = 0.0
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_waiting()
        if len(self.connections) > self.max_connections:
            self._evict_one()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]  # the protocol's, next in the MRO
        self._start_waiting()

    def _start_waiting(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._waiting_since = self.loop.time()
        self._deadline = self.loop.call_later(self.request_timeout, self._check_deadline)

    def _closing(self) -> bool:
        """Closed, not yet removed from the server's set of connections."""
        return self.transport is None or self.transport.is_closing()

    def _check_deadline(self) -> None:
        self._deadline = None
        if not self.waiting_for_client():
            return
        log.info("closing a connection from %s: no complete request in %.0f s", self.client, self.request_timeout)
        self._close()

    def _evict_one(self) -> None:
        waiting = [c for c in self.connections if isinstance(c, ConnectionGuard) and c.waiting_for_client()]
        if not waiting:
            return
        oldest = min(waiting, key=lambda c: c._waiting_since)
        log.warning(
            "more than %d open connections: closing the one from %s that waited longest for its request",
            self.max_connections,
            oldest.client,
        )
        oldest._close()

    def _close(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()


class GuardedH11Protocol(ConnectionGuard, H11Protocol):
    """uvicorn's h11 protocol with a request deadline and a connection cap (see the module doc)."""

    def waiting_for_client(self) -> bool:
        cycle = self.cycle
        answering = cycle is not None and cycle.response_started and not cycle.response_complete
        return not answering and not self._closing() and self.conn.their_state in _WAITING_FOR_CLIENT


def httptools_available() -> bool:
    return importlib.util.find_spec("httptools") is not None


def _httptools_protocol() -> type[ConnectionGuard]:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedHttpToolsProtocol(ConnectionGuard, HttpToolsProtocol):
        """uvicorn's httptools protocol with a request deadline and a connection cap (see the module doc)."""

        def waiting_for_client(self) -> bool:
            # httptools keeps no request state of its own: the cycle tells it. No cycle, or the last
            # one answered: the next request's headers are owed (perhaps half sent). A cycle not yet
            # answered whose body is still coming in: the body is owed. A queued (pipelined) request
            # or a request being answered: the service owes the client, not the reverse.
            if self._closing() or self.pipeline:
                return False
            cycle = self.cycle
            if cycle is None or cycle.response_complete:
                return True
            return not cycle.response_started and cycle.more_body

    return GuardedHttpToolsProtocol


def guarded_protocol(request_timeout: float, max_connections: int, http: str = "h11") -> type[ConnectionGuard]:
    """The protocol class to pass as uvicorn's ``http=`` with these limits.

    ``http``: "h11" (pure Python, the default), "httptools" (uvicorn's C parser; ``pip install
    httptools``), or "auto": httptools when it is installed, else h11.
    """
    if not request_timeout > 0:
        raise ValueError(f"request_timeout: must be > 0 seconds, got {request_timeout}")
    if max_connections < 1:
        raise ValueError(f"max_connections: must be >= 1, got {max_connections}")
    if http not in HTTP_CHOICES:
        raise ValueError(f"http: must be one of {', '.join(HTTP_CHOICES)}, got {http!r}")
    if http == "httptools" and not httptools_available():
        raise ValueError("http: httptools is not installed (pip install httptools, or use --http h11)")
    use_httptools = http == "httptools" or (http == "auto" and httptools_available())
    base = _httptools_protocol() if use_httptools else GuardedH11Protocol
    attrs = {"request_timeout": float(request_timeout), "max_connections": int(max_connections)}
    return type(base.__name__, (base,), attrs)


LIVE_RETRY_AFTER_S = 5
"""What a refused live request is told to wait (``Retry-After``) before it asks again."""


class LiveConnectionCap:
    """ASGI middleware: at most ``per_client`` open live requests (long polls and streams, ``paths``)
    from one client and ``total`` in all; the excess is refused before its stream starts, 429 (that
    client's share) or 503 (the service's), with ``Retry-After`` and a message naming the setting.

    The client is ``scope["client"]``: the peer address, or the address a trusted proxy forwarded
    (uvicorn's ``--proxy-headers`` with ``--forwarded-allow-ips``, as for every other route), so
    pages behind one proxy that forwards no address share one client's share.
    """

    def __init__(self, app: ASGIApp, paths: tuple[str, ...], per_client: int, total: int) -> None:
        if per_client < 1 or total < 1:
            raise ValueError(
                f"HYPERWATCH_LIVE_MAX_PER_CLIENT ({per_client}) and HYPERWATCH_LIVE_MAX_TOTAL ({total}) must be >= 1"
            )
        self.app, self.paths, self.per_client, self.total = app, frozenset(paths), per_client, total
        self.open: dict[str, int] = {}
        self.open_total = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        who = str(client[0]) if client else "unknown"
        refusal = self._refusal(who)
        if refusal is not None:
            await _refuse(send, *refusal)
            return
        self.open[who] = self.open.get(who, 0) + 1
        self.open_total += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.open_total -= 1
            left = self.open[who] - 1
            if left:
                self.open[who] = left
            else:
                del self.open[who]

    def _refusal(self, who: str) -> tuple[int, str] | None:
        if self.open.get(who, 0) >= self.per_client:
            return 429, (
                f"{self.per_client} live requests from {who} are open already, the limit per client "
                f"(HYPERWATCH_LIVE_MAX_PER_CLIENT): close some live pages, or raise the limit; retry after "
                f"{LIVE_RETRY_AFTER_S} s"
            )
        if self.open_total >= self.total:
            return 503, (
                f"{self.total} live requests are open, the service's limit (HYPERWATCH_LIVE_MAX_TOTAL): "
                f"retry after {LIVE_RETRY_AFTER_S} s, or raise the limit"
            )
        return None


async def _refuse(send: Send, status: int, message: str) -> None:
    body = json.dumps({"detail": message}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(LIVE_RETRY_AFTER_S).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
