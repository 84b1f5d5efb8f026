"""``hyperwatch serve``: run the whole app (API and pages) with uvicorn (localhost unless told).

The command sits above monitor/ and web/ (it runs :func:`hyperwatch.app.create_app`), so no import
runs back up from either.
"""

from __future__ import annotations

import argparse
import importlib.util
import ipaddress
import os
import sys
from typing import TYPE_CHECKING

from hyperwatch.monitor.core.serve_options import (
    DEFAULT_MAX_CONCURRENT_READS,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_REQUEST_TIMEOUT_S,
    HTTP_CHOICES,
)

if TYPE_CHECKING:
    from hyperwatch.monitor.store import SqlStore


ALLOW_OPEN_ENV = "HYPERWATCH_ALLOW_OPEN"
LOOPBACK_NAMES = ("localhost", "ip6-localhost")


def is_loopback(host: str) -> bool:
    """Whether ``host`` binds this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to any address


def open_refusal(host: str, dev_mode: bool, write_token: str | None, allow_open: bool) -> str | None:
    """Why ``serve`` must not start (None: it may): dev mode lets a missing or weak write token pass,
    which is harmless on localhost and an open door on any other address, unless asked explicitly."""
    from hyperwatch.monitor.core.config import token_weakness

    if not dev_mode or is_loopback(host) or allow_open:
        return None
    weak = token_weakness(write_token) if write_token is not None else ""
    if write_token is not None and not weak:
        return None
    what = "no write token" if write_token is None else f"a write token that {weak}"
    return (
        f"refusing to start: dev mode on --host {host} with {what} lets anyone who can "
        "reach this port write and read runs. Set HYPERWATCH_WRITE_TOKEN to a random secret (python -c "
        "'import secrets; print(secrets.token_urlsafe(32))') and drop --dev, or bind --host 127.0.0.1, or "
        f"pass --allow-open ({ALLOW_OPEN_ENV}=1) if an open service on {host} is what you want"
    )


FLAGS = {"database_url": "--db", "dev_mode": "--dev", "max_concurrent_reads": "--max-concurrent-reads"}
"""The settings a flag of ``serve`` overrides: an invalid value's message names both."""


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Run the HyperWatch monitoring service. Settings come from HYPERWATCH_* environment "
        "variables (DATABASE_URL, WRITE_TOKEN, READ_TOKEN, DEV_MODE, CORS_ORIGINS, MAX_BODY_BYTES, ...); "
        "flags override them.",
    )
    p.add_argument(
        "--db", metavar="URL", help="database URL (default: HYPERWATCH_DATABASE_URL or sqlite:///./hyperwatch.db)"
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 to expose it)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--dev", action="store_true", help="dev mode: allow a missing or placeholder write token")
    p.add_argument(
        "--allow-open",
        action="store_true",
        help=f"start even in dev mode on a non-local --host with no real write token, where anyone who can reach "
        f"the port can write and read (refused without it; also {ALLOW_OPEN_ENV}=1)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=DEFAULT_REQUEST_TIMEOUT_S,
        metavar="S",
        help=f"seconds a client has to send a whole request (headers and body) before its connection is "
        f"closed (default {DEFAULT_REQUEST_TIMEOUT_S:.0f})",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help=f"open connections kept at most; above it the one that waited longest for its request is closed "
        f"(default {DEFAULT_MAX_CONNECTIONS})",
    )
    p.add_argument(
        "--max-concurrent-reads",
        type=int,
        metavar="N",
        help="series and figure reads computed at once; the others wait without holding a thread, so a "
        "page opening does not hold ingest back (default HYPERWATCH_MAX_CONCURRENT_READS, else "
        + ", ".join(f"{n} on {db}" for db, n in DEFAULT_MAX_CONCURRENT_READS.items())
        + "; 0 = no limit)",
    )
    p.add_argument(
        "--http",
        choices=HTTP_CHOICES,
        default="h11",
        help="HTTP/1.1 parser: h11 (pure Python, default) or httptools (C; pip install httptools); auto: "
        "httptools when installed, else h11. Both keep --request-timeout and --max-connections",
    )
    p.add_argument(
        "--loop",
        choices=("auto", "uvloop", "asyncio"),
        default="auto",
        help="event loop: uvloop or asyncio's own; auto (default): uvloop when installed, else asyncio",
    )
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return p


def create_schema_if_empty(store: SqlStore) -> str | None:
    """On a SQLite database with no tables at all (a new file), create the schema; the revision made.

    As MLflow's server does: a new file is not a schema to protect. A database that has any table
    (an older schema included) is left alone, for the start-up check to refuse with the upgrade
    command: upgrading data is the operator's decision (``hyperwatch db upgrade``). PostgreSQL
    databases are created by an administrator, who runs ``db upgrade`` as part of that."""
    from sqlalchemy import inspect
    from sqlalchemy.exc import SQLAlchemyError

    from hyperwatch.monitor.store import migrate

    if store.engine.dialect.name != "sqlite":
        return None
    try:
        if inspect(store.engine).get_table_names():
            return None
    except SQLAlchemyError:
        return None  # cannot be opened (its folder missing, ...): the service answers 503 and says why
    migrate.upgrade(store.engine)  # one write transaction; a second server starting with it finds head
    return migrate.head_revision()


def run(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import ValidationError

    from hyperwatch.app import create_app
    from hyperwatch.monitor.api.connections import guarded_protocol
    from hyperwatch.monitor.core.config import Settings
    from hyperwatch.monitor.core.errors import MonitorError
    from hyperwatch.monitor.store import SqlStore

    if not 0 < args.port < 65536:
        print(f"hyperwatch serve: --port {args.port} is not a port number (1-65535)", file=sys.stderr)
        return 2
    try:
        protocol = guarded_protocol(args.request_timeout, args.max_connections, args.http)
    except ValueError as exc:
        print(f"hyperwatch serve: --{exc}".replace("_", "-", 1), file=sys.stderr)
        return 2
    if args.loop == "uvloop" and importlib.util.find_spec("uvloop") is None:
        print("hyperwatch serve: --loop uvloop: uvloop is not installed (pip install uvloop)", file=sys.stderr)
        return 2
    overrides: dict[str, object] = {}
    if args.db:
        overrides["database_url"] = args.db
    if args.dev:
        overrides["dev_mode"] = True
    if args.max_concurrent_reads is not None:
        overrides["max_concurrent_reads"] = args.max_concurrent_reads
    allow_open = args.allow_open or os.environ.get(ALLOW_OPEN_ENV, "").strip().lower() in ("1", "true", "yes")
    try:
        settings = Settings(**overrides)  # type: ignore[arg-type]
        refusal = open_refusal(args.host, settings.dev_mode, settings.write_token, allow_open)
        if refusal:  # before anything is created or bound
            print(f"hyperwatch serve: {refusal}", file=sys.stderr)
            return 2
        store = SqlStore(settings.database_url)
        created = create_schema_if_empty(store) if settings.check_schema else None
        if created:
            print(f"hyperwatch serve: a new, empty database: created its schema ({created})", file=sys.stderr)
        app = create_app(settings, store=store)
    except ValidationError as exc:
        for err in exc.errors():
            msg = err["msg"].removeprefix("Value error, ")
            field = str(err["loc"][0]) if err["loc"] else ""
            if field and field.upper() not in msg:  # a field check (the model's own checks name theirs)
                flag = FLAGS.get(field)
                msg = f"HYPERWATCH_{field.upper()}{f' / {flag}' if flag else ''}: {msg}"
            print(f"hyperwatch serve: {msg}", file=sys.stderr)
        return 2
    except MonitorError as exc:
        print(f"hyperwatch serve: {exc}", file=sys.stderr)
        return 2
    if not is_loopback(args.host) and settings.dev_mode:
        print(f"hyperwatch serve: warning: dev mode on {args.host} is reachable from other machines", file=sys.stderr)
    # Slow or half-open clients are bounded here (monitor.api.connections); on a network a fronting
    # proxy with its own timeouts is still the recommended setup (README, "Serving").
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        http=protocol,
        loop=args.loop,
        timeout_keep_alive=5,
    )
    return 0
