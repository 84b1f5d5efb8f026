"""Bounded connections for ``hyperwatch serve``: slow or half-open clients cannot starve the service.

uvicorn by itself waits forever for a request's headers and body, and accepts connections until
the process runs out of file descriptors: one local client holding ~20,000 half-open connections
made ``/healthz`` hang. :func:`guarded_protocol` builds uvicorn's h11 protocol with two limits:

- ``request_timeout``: a client has this many seconds, from connecting (or from the end of its
  previous response), to send a whole request, headers and body; then the connection is closed.
  Time the service spends answering does not count.
- ``max_connections``: above this many open connections, each new one closes the connection that
  has waited longest for its client's request (a half-open one first, never one whose request
  is being answered). A fresh client, like a health probe that sends its request at once, is
  served even while the table is full of stalled ones; file descriptors stay bounded.

On a network (``--host 0.0.0.0``) a fronting proxy (nginx, Caddy, a cloud load balancer) with its
own timeouts remains the recommended setup; these limits keep the bare service safe without one.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)
DEFAULT_REQUEST_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 1000
_WAITING_FOR_CLIENT = (h11.IDLE, h11.SEND_BODY)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request deadline and a connection cap (see the module doc)."""

    request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS

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
        super().on_response_complete()
        self._start_waiting()

    def _start_waiting(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._waiting_since = self.loop.time()
        self._deadline = self.loop.call_later(self.request_timeout, self._check_deadline)

    def waiting_for_client(self) -> bool:
        """True while the client still owes its request (nothing of it is being answered)."""
        cycle = self.cycle
        answering = cycle is not None and cycle.response_started and not cycle.response_complete
        closing = self.transport is None or self.transport.is_closing()  # closed, not yet removed from the set
        return not answering and not closing and self.conn.their_state in _WAITING_FOR_CLIENT

    def _check_deadline(self) -> None:
        self._deadline = None
        if not self.waiting_for_client():
            return
        log.info("closing a connection from %s: no complete request in %.0f s", self.client, self.request_timeout)
        self._close()

    def _evict_one(self) -> None:
        waiting = [c for c in self.connections if isinstance(c, GuardedH11Protocol) and c.waiting_for_client()]
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


def guarded_protocol(request_timeout: float, max_connections: int) -> type[GuardedH11Protocol]:
    """The protocol class to pass as uvicorn's ``http=`` with these limits."""
    if not request_timeout > 0:
        raise ValueError(f"request_timeout: must be > 0 seconds, got {request_timeout}")
    if max_connections < 1:
        raise ValueError(f"max_connections: must be >= 1, got {max_connections}")
    attrs = {"request_timeout": float(request_timeout), "max_connections": int(max_connections)}
    return type("GuardedH11Protocol", (GuardedH11Protocol,), attrs)
