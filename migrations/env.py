"""Alembic environment: migrations run online against the URL or connection handed in.

``hyperwatch db upgrade`` passes an open connection in ``config.attributes["connection"]``;
``alembic -c migrations/alembic.ini upgrade head`` uses ``sqlalchemy.url`` or
``HYPERWATCH_DATABASE_URL``. SQLite gets batch mode (copy-and-move ALTERs).

Rule: a migration that moves data (reads rows and writes or deletes them elsewhere) locks the
tables it moves between before its first read (``monitor.store.packing.lock_for_move``), and is
tested with a writer committing in the gap on both databases; see ``migrations/README.md``.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection

config = context.config


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=None,
        render_as_batch=connection.dialect.name == "sqlite",
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("HYPERWATCH_DATABASE_URL")
    if not url:
        raise SystemExit("no database URL: set HYPERWATCH_DATABASE_URL or sqlalchemy.url in alembic.ini")
    engine = create_engine(url)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
run_migrations_online()
