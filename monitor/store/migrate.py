"""Alembic driven from code: ``hyperwatch db upgrade`` works from any working directory.

The migration scripts live in ``<repo>/migrations`` (next to this package); the configuration is
built here instead of read from an ini file relative to the current directory.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine

from hyperwatch.monitor.core.errors import SchemaOutOfDateError

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def alembic_config(engine: Engine | None = None) -> Config:
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise FileNotFoundError(
            f"migrations not found at {MIGRATIONS_DIR}; run from a source checkout "
            "(pip install -e .) so that migrations/ sits next to monitor/"
        )
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("path_separator", "os")
    if engine is not None:
        cfg.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%"))
    return cfg


def heads() -> list[str]:
    return list(ScriptDirectory.from_config(alembic_config()).get_heads())


def known_revisions() -> set[str]:
    """Every revision id in migrations/."""
    return {rev.revision for rev in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def head_revision() -> str:
    found = heads()
    if len(found) != 1:
        raise RuntimeError(f"migrations/ has {len(found)} heads {found}; merge them into one")
    return found[0]


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    _run(engine, command.upgrade, revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
    _run(engine, command.downgrade, revision)


def _run(engine: Engine, step: Callable[[Config, str], None], revision: str) -> None:
    """Run one Alembic command in one write transaction.

    The transaction is marked as a writer, so on SQLite it begins with ``BEGIN IMMEDIATE``: it takes
    the write lock before Alembic's first read and waits its turn under the busy timeout. A deferred
    one read the (empty) schema first, and when another connection committed anything in between (a
    service opening the fresh file turns it to WAL), its first ``CREATE TABLE`` failed at once with
    "database is locked" instead of waiting.
    """
    cfg = alembic_config(engine)
    with engine.connect() as conn:
        conn.execution_options(hyperwatch_write=True)
        with conn.begin():
            cfg.attributes["connection"] = conn
            step(cfg, revision)


def check_schema(engine: Engine) -> None:
    """Raise :class:`SchemaOutOfDateError` unless the database is at the code's head revision."""
    current = current_revision(engine)
    head = head_revision()
    if current != head:
        url = engine.url.render_as_string(hide_password=True)
        if current is not None and current not in known_revisions():
            # Not one of ours: a newer hyperwatch upgraded it. "db upgrade" here would fail; say what is true.
            raise SchemaOutOfDateError(
                f"database {url} is at schema revision {current}, newer than this version of hyperwatch "
                f"knows (its newest is {head}): a newer hyperwatch has upgraded it. Run that newer version, "
                f"or with it run 'hyperwatch db downgrade {head} --db ...' before using this one"
            )
        raise SchemaOutOfDateError(
            f"database {url} is at schema revision {current or 'none (empty database)'} but this "
            f"version of hyperwatch needs {head}; run: hyperwatch db upgrade --db '{url}'"
        )
