"""Migration 0013 (webhooks and their outbox): up and down on both databases, nothing else touched."""

from __future__ import annotations

from alembic.script import ScriptDirectory
from sqlalchemy import inspect, select

from hyperwatch.monitor.store import SqlStore, migrate
from hyperwatch.monitor.store.models import ProjectRow

NEW_TABLES = {"webhooks", "webhook_deliveries"}


def test_revision_chain() -> None:
    script = ScriptDirectory.from_config(migrate.alembic_config()).get_revision("0013_webhooks")
    assert script is not None and script.down_revision == "0012_run_archived"


def test_upgrade_and_downgrade(db_url: str) -> None:
    store = SqlStore(db_url)
    try:
        migrate.upgrade(store.engine, "0012_run_archived")
        assert not NEW_TABLES & set(inspect(store.engine).get_table_names())
        migrate.upgrade(store.engine, "0013_webhooks")
        assert set(inspect(store.engine).get_table_names()) >= NEW_TABLES
        hook, created = store.upsert_webhook("p1", "https://example.org/hook/abcd", {"format": "generic"})
        assert created and hook.project == "p1" and hook.min_severity == "warning"
        migrate.downgrade(store.engine, "0012_run_archived")
        assert migrate.current_revision(store.engine) == "0012_run_archived"
        assert not NEW_TABLES & set(inspect(store.engine).get_table_names())
        with store.engine.connect() as conn:  # the project it created stays
            assert conn.execute(select(ProjectRow.name)).scalars().all() == ["p1"]
        migrate.upgrade(store.engine, "0013_webhooks")
        assert store.list_webhooks("p1") == []
        migrate.upgrade(store.engine)  # and on to the head, whatever comes after
        assert migrate.current_revision(store.engine) == migrate.head_revision()
    finally:
        store.close()
