"""``hyperwatch db upgrade|downgrade|current|compact|size [--db URL] [--json]``: the schema, owned by
Alembic migrations; ``compact`` rewrites a SQLite file with its free pages given back and the store's
page size (``monitor.store.engine.SQLITE_PAGE_SIZE``), which a file made before it does not get
otherwise; ``size`` says where the database's bytes are and what a point costs (``monitor.store.sizes``,
read-only: it runs beside the service)."""

from __future__ import annotations

import argparse
import sys


def build_parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Database schema commands (Alembic migrations/).")
    p.add_argument(
        "action",
        choices=["upgrade", "downgrade", "current", "compact", "size"],
        help="what to do (compact: SQLite only, with the service stopped; size: bytes per table and per point)",
    )
    p.add_argument("revision", nargs="?", help="target revision (upgrade: head; downgrade: base, or e.g. -1)")
    p.add_argument(
        "--db", metavar="URL", help="database URL (default: HYPERWATCH_DATABASE_URL or sqlite:///./hyperwatch.db)"
    )
    p.add_argument("--json", action="store_true", help="size: one JSON object instead of the table")
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
    if args.json and args.action != "size":
        print(f"hyperwatch db {args.action}: --json goes with size only", file=sys.stderr)
        return 2
    if args.action == "size":
        return _size(url, args.json)
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


def _size(url: str, as_json: bool) -> int:
    import json
    from pathlib import Path

    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from hyperwatch.monitor.store.engine import make_engine
    from hyperwatch.monitor.store.sizes import measure

    parsed = make_url(url)
    shown = parsed.render_as_string(hide_password=True)
    if url.startswith("sqlite:") and not (parsed.database and Path(parsed.database).is_file()):
        print(f"hyperwatch db size: no SQLite file at {shown}; give --db sqlite:///path.db", file=sys.stderr)
        return 2
    engine = make_engine(url)
    try:
        sizes = measure(engine)
    except SQLAlchemyError as exc:
        print(f"hyperwatch db size: database error on {shown}: {exc}", file=sys.stderr)
        return 1
    finally:
        engine.dispose()
    if as_json:
        print(json.dumps({"database": shown, **sizes.as_json()}))
        return 0
    free = "" if sizes.free_bytes is None else f" ({sizes.free_bytes:,} of them free pages, reused by later writes)"
    print(f"{shown}: {sizes.total_bytes:,} bytes{free}")
    if sizes.points is None:
        print("points received: unknown (the schema is older than this version; run: hyperwatch db upgrade)")
    else:
        per = "-" if sizes.bytes_per_point is None else f"{sizes.bytes_per_point:.2f}"
        runs = f"{sizes.runs:,} run" + ("" if sizes.runs == 1 else "s")
        print(f"points received: {sizes.points:,} in {runs}; bytes per point: {per}")
    if sizes.tables:
        width = max(len(t.table) for t in sizes.tables)
        print(f"{'table':<{width}}  {'bytes':>15}  {'of which indexes':>16}  {'share':>6}")
        for t in sizes.tables:
            share = t.bytes / sizes.total_bytes if sizes.total_bytes else 0.0
            print(f"{t.table:<{width}}  {t.bytes:>15,}  {t.index_bytes:>16,}  {share:>6.1%}")
    return 0
