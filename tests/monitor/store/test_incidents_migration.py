"""Migration 0008_incidents on both databases: existing alert events are grouped on upgrade; downgrade drops them."""

from __future__ import annotations

import math

from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from hyperwatch.monitor.store import SqlStore, migrate

REVISION = "0008_incidents"


def _before() -> str:
    """The revision 0008 revises (the lead chains it at merge: read it, never hard-code it)."""
    script = ScriptDirectory.from_config(migrate.alembic_config()).get_revision(REVISION)
    assert script is not None and isinstance(script.down_revision, str)
    return script.down_revision


def test_existing_alert_events_become_incidents_and_downgrade_drops_them(db_url: str) -> None:
    store = SqlStore(db_url)
    try:
        migrate.upgrade(store.engine, _before())
        rows = [  # (rule, name, layer, step, value): a NaN episode, a later one, and a spike per layer
            ("nan_loss", "loss", -1, 10, None),
            ("nan_loss", "loss", -1, 12, None),
            ("nan_loss", "loss", -1, 9000, None),
            ("z_spike", "attention_z", 0, 40, 900.0),
            ("z_spike", "attention_z", 2, 41, 1200.0),
        ]
        with store.engine.begin() as conn:
            conn.execute(text("INSERT INTO projects (id, name, created_at) VALUES (1, 'p', CURRENT_TIMESTAMP)"))
            conn.execute(
                text(
                    "INSERT INTO runs (id, project_id, name, status, config, summary, export_layers, created_at, "
                    "updated_at) VALUES (1, 1, 'r', 'running', '{}', '{}', false, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO alert_events (run_id, rule, severity, name, layer, step, value, baseline, message, "
                    "created_at, source) VALUES (1, :rule, 'warning', :name, :layer, :step, :value, 100.0, 'm', "
                    "CURRENT_TIMESTAMP, 'service')"
                ),
                [{"rule": r, "name": n, "layer": la, "step": s, "value": v} for r, n, la, s, v in rows],
            )
        migrate.upgrade(store.engine)
        got = sorted(store.list_incidents(run_id=1), key=lambda i: (i.rule, i.first_step))
        assert [(i.rule, i.first_step, i.last_step, i.events, i.layers) for i in got] == [
            ("nan_loss", 10, 12, 2, []),
            ("nan_loss", 9000, 9000, 1, []),
            ("z_spike", 40, 41, 2, [0, 2]),
        ]
        assert math.isnan(got[0].peak_value) and got[2].peak_value == 1200.0 and got[2].first_value == 900.0
        migrate.downgrade(store.engine, _before())
        assert "incidents" not in inspect(store.engine).get_table_names()
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM alert_events")).scalar() == len(rows)  # events kept
        migrate.upgrade(store.engine)
        assert len(store.list_incidents(run_id=1)) == 3  # and grouped again on the way back up
    finally:
        store.close()
