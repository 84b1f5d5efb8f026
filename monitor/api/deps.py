"""FastAPI dependencies: settings, the store, and bearer-token checks for writes and reads.

All of them are ``async def``: none blocks, and FastAPI runs every plain ``def`` dependency in its
threadpool, a round trip between the event loop and a worker thread each. With three of them per
request, those hops (and the GIL handovers they cost) took more of an ingest request's wall time
than parsing its 512 points (py-spy, issue 16).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import weakref
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from hyperwatch.monitor.api.params import check_id
from hyperwatch.monitor.core.config import Settings
from hyperwatch.monitor.read.reader import Reader
from hyperwatch.monitor.store.base import Store

_bearer = HTTPBearer(auto_error=False, description="HYPERWATCH_WRITE_TOKEN (or HYPERWATCH_READ_TOKEN for reads)")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]


def _matches(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


async def require_write(settings: SettingsDep, creds: Credentials) -> None:
    """Writes need ``Authorization: Bearer <write token>`` (open only in dev mode with no token set)."""
    if settings.write_token is None:
        return
    if creds is None:
        raise HTTPException(
            401,
            "missing bearer token: this endpoint writes, send 'Authorization: Bearer <HYPERWATCH_WRITE_TOKEN>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not _matches(creds.credentials, settings.write_token):
        raise HTTPException(
            403, "bearer token is not the write token (HYPERWATCH_WRITE_TOKEN); check the client's token"
        )


async def require_read(settings: SettingsDep, creds: Credentials) -> None:
    """Reads are open unless a read token is set; then the read or the write token is accepted."""
    if settings.read_token is None:
        return
    if creds is None:
        raise HTTPException(
            401,
            "missing bearer token: reads need 'Authorization: Bearer <HYPERWATCH_READ_TOKEN>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    tokens = [settings.read_token] + ([settings.write_token] if settings.write_token else [])
    if not any(_matches(creds.credentials, t) for t in tokens):
        raise HTTPException(403, "bearer token is neither the read nor the write token; check the client's token")


async def ids_in_range(request: Request) -> None:
    """Every id of the request, in the path (``/runs/{run_id}``) and in the query (``?run_id=``,
    repeated or not, ``?group_id=``), read by :func:`monitor.api.params.check_id` before the route
    runs: not ASCII digits (``"²"``, ``" 12"``, ``"1_0"``) is a 422 naming the parameter; beyond the
    integer range it names no row and never can: 404.

    Left to the database, an id beyond the range was a 422 (SQLite cannot bind it, PostgreSQL
    refuses it for an integer column) that blamed the request's value. An unknown id inside the
    range keeps the route's own answer (a lookup's 404, a filter's empty list)."""
    params = [*request.path_params.items(), *request.query_params.multi_items()]
    for name, value in params:
        if (name == "id" or name.endswith("_id")) and isinstance(value, str):
            check_id(value, name)


WriteAuth = Depends(require_write)
ReadAuth = Depends(require_read)


class ReadSlots:
    """At most ``n`` heavy reads (series, figures) computed at once (0: no limit).

    A request waits for its slot on the event loop, holding no worker thread, so a burst of reads
    (a page opening asks for every indicator at once) can neither fill the threadpool nor share the
    GIL many ways with ingest. The semaphore is made per event loop (test clients run their own).
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        if self.n <= 0:
            yield
            return
        loop = asyncio.get_running_loop()
        slots = self._slots.get(loop)
        if slots is None:
            slots = self._slots[loop] = asyncio.Semaphore(self.n)
        async with slots:
            yield


async def reader(request: Request, _: Annotated[None, Depends(require_read)]) -> Reader:
    """Read auth (the read token when one is set), then the app's store and settings."""
    return Reader(await get_store(request), await get_settings(request))


ReaderDep = Annotated[Reader, Depends(reader)]


async def query_reader(request: Request, read: ReaderDep) -> AsyncIterator[Reader]:
    """The reader of a series or figure read: the request holds one of the service's read slots while
    it runs (``HYPERWATCH_MAX_CONCURRENT_READS``, :class:`monitor.api.deps.ReadSlots`). The live
    stream's reads (small, and a stream waits most of its life) take :data:`ReaderDep` instead."""
    async with request.app.state.read_slots.hold():
        yield read


QueryReaderDep = Annotated[Reader, Depends(query_reader)]
