"""``hyperwatch serve``: run the monitoring service with uvicorn (localhost unless told)."""

from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError


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
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return p


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from hyperwatch.app import create_app
    from hyperwatch.monitor.core.config import Settings
    from hyperwatch.monitor.core.errors import MonitorError

    if not 0 < args.port < 65536:
        print(f"hyperwatch serve: --port {args.port} is not a port number (1-65535)", file=sys.stderr)
        return 2
    overrides: dict[str, object] = {}
    if args.db:
        overrides["database_url"] = args.db
    if args.dev:
        overrides["dev_mode"] = True
    try:
        settings = Settings(**overrides)  # type: ignore[arg-type]
        app = create_app(settings)
    except ValidationError as exc:
        for err in exc.errors():
            print(f"hyperwatch serve: {err['msg'].removeprefix('Value error, ')}", file=sys.stderr)
        return 2
    except MonitorError as exc:
        print(f"hyperwatch serve: {exc}", file=sys.stderr)
        return 2
    if args.host not in ("127.0.0.1", "localhost", "::1") and settings.dev_mode:
        print(f"hyperwatch serve: warning: dev mode on {args.host} is reachable from other machines", file=sys.stderr)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
