"""``hyperwatch db upgrade|downgrade|current [--db URL]``: the schema, owned by Alembic migrations."""

from __future__ import annotations

import argparse
import sys


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Database schema commands (Alembic migrations/).")
    p.add_argument("action", choices=["upgrade", "downgrade", "current"], help="what to do")
    p.add_argument("revision", nargs="?", help="target revision (upgrade: head; downgrade: base, or e.g. -1)")
    p.add_argument(
        "--db", metavar="URL", help="database URL (default: HYPERWATCH_DATABASE_URL or sqlite:///./hyperwatch.db)"
    )
    return p


def _url(arg: str | None) -> str:
    import os

    from hyperwatch.monitor.core.config import DEFAULT_DATABASE_URL

    return arg or os.environ.get("HYPERWATCH_DATABASE_URL") or DEFAULT_DATABASE_URL


def run(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from hyperwatch.monitor.store import migrate
    from hyperwatch.monitor.store.engine import make_engine

    url = _url(args.db)
    if not url.startswith(("sqlite:", "postgresql+")):
        print(
            f"hyperwatch db: --db {url!r} is not supported; use sqlite:///path.db or postgresql+psycopg://...",
            file=sys.stderr,
        )
        return 2
    engine = make_engine(url)
    shown = engine.url.render_as_string(hide_password=True)
    try:
        if args.action == "upgrade":
            migrate.upgrade(engine, args.revision or "head")
        elif args.action == "downgrade":
            if not args.revision:
                print("hyperwatch db downgrade: give a target revision (e.g. base or -1)", file=sys.stderr)
                return 2
            migrate.downgrade(engine, args.revision)
        current = migrate.current_revision(engine)
    except SQLAlchemyError as exc:
        print(f"hyperwatch db {args.action}: database error on {shown}: {exc}", file=sys.stderr)
        return 1
    finally:
        engine.dispose()
    head = migrate.head_revision()
    state = "current" if current == head else f"out of date (head is {head}; run: hyperwatch db upgrade)"
    print(f"{shown}: schema revision {current or 'none'} - {state}")
    return 0
