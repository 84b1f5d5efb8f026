"""``hyperwatch db upgrade|downgrade|current|compact [--db URL]``: the schema, owned by Alembic
migrations; ``compact`` rewrites a SQLite file with its free pages given back and the store's page
size (``monitor.store.engine.SQLITE_PAGE_SIZE``), which a file made before it does not get otherwise."""

from __future__ import annotations

import argparse
import sys


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Database schema commands (Alembic migrations/).")
    p.add_argument(
        "action",
        choices=["upgrade", "downgrade", "current", "compact"],
        help="what to do (compact: SQLite only, with the service stopped)",
    )
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
    if args.action == "compact":
        return _compact(url)
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


def _compact(url: str) -> int:
    """VACUUM a SQLite file at the store's page size (rollback-journal mode for the rewrite: WAL keeps
    a file's page size); the file is untouched when another connection holds it."""
    import sqlite3
    from pathlib import Path

    from sqlalchemy.engine import make_url

    from hyperwatch.monitor.store.engine import SQLITE_PAGE_SIZE

    parsed = make_url(url)
    shown = parsed.render_as_string(hide_password=True)
    if not url.startswith("sqlite:"):
        print(
            f"hyperwatch db compact: {shown} is PostgreSQL, which keeps freed space for later writes and is "
            "vacuumed by the service and autovacuum; nothing to do (VACUUM FULL would lock every table)",
            file=sys.stderr,
        )
        return 2
    path = parsed.database
    if not path or not Path(path).is_file():
        print(f"hyperwatch db compact: no SQLite file at {shown}; give --db sqlite:///path.db", file=sys.stderr)
        return 2
    before = Path(path).stat().st_size
    con = sqlite3.connect(path, timeout=0.5, isolation_level=None)
    try:
        old_page = int(con.execute("PRAGMA page_size").fetchone()[0])
        if str(con.execute("PRAGMA journal_mode=DELETE").fetchone()[0]).lower() != "delete":
            raise sqlite3.OperationalError("database is locked")
        con.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")
        con.execute("VACUUM")
        con.execute("PRAGMA journal_mode=WAL")
        new_page = int(con.execute("PRAGMA page_size").fetchone()[0])
    except sqlite3.OperationalError as exc:
        print(
            f"hyperwatch db compact: {shown} is in use ({exc}); stop the service and anything else that has "
            "the file open, then run it again (nothing was changed)",
            file=sys.stderr,
        )
        return 1
    finally:
        con.close()
    after = Path(path).stat().st_size
    print(f"{shown}: {before:,} -> {after:,} bytes, page size {old_page} -> {new_page}")
    return 0
