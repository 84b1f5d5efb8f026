"""The store's side of learned thresholds (monitor.store.learning, migration 0010), on SQLite and PostgreSQL:
each run's peak per metric read from the rollups equals the max over its points, wherever the peak
lies; a run's health facts; the later read of a group's runs stands; the migration both ways."""

from __future__ import annotations

import math
import uuid

from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store import SqlStore, migrate
from hyperwatch.monitor.store.entities import NewAlert

REVISION = "0010_group_learning"
STEPS = 5000
# latest step 4999: level-3 rollups cover 0-4095, level-2 4096-4863, level-1 4864-4991, hot points 4992-4999
PEAK_AT = {"attention_z": 100, "output_z": 4200, "attention_rms": 4900, "mlp_rms": 4995, "attention_lse_max.h3": 3000}


def _value(name: str, step: int, layer: int | None) -> float:
    if step == PEAK_AT[name]:
        return 1000.0 + (layer or 0)
    if name == "attention_z" and step == 50:
        return math.nan  # NaN is no peak
    if name == "mlp_rms" and step == 10:
        return math.inf  # nor is +Inf: its block is left out, the peak elsewhere stands
    return 1.0 + (step % 7) * 0.1 + (layer or 0)


def _fill(store: SqlStore, run_id: int) -> dict[str, float]:
    """STEPS steps of each PEAK_AT series (two layers, output_z run-level) in batches; the true peaks."""
    truth: dict[str, float] = {}
    for start in range(0, STEPS, 500):
        points = []
        for step in range(start, start + 500):
            for name in PEAK_AT:
                for layer in [None] if name == "output_z" else [0, 1]:
                    value = _value(name, step, layer)
                    points.append(Point(name=name, step=step, value=value, layer=layer))
                    if math.isfinite(value):
                        truth[name] = max(truth.get(name, -math.inf), value)
        store.ingest(run_id, uuid.uuid4().hex, points)
    return truth


def test_peaks_from_the_rollups_equal_the_max_over_the_points_wherever_the_peak_lies(store: SqlStore) -> None:
    run, _ = store.upsert_run("p", "long", {"group": "g"})
    other, _ = store.upsert_run("p", "short", {"group": "g"})
    truth = _fill(store, run.id)
    store.ingest(other.id, "b1", [Point(name="attention_z", step=s, value=7.0 + s, layer=0) for s in range(3)])
    bases = ["attention_z", "output_z", "attention_rms", "mlp_rms", "attention_lse_max"]
    peaks = store.series_peaks([run.id, other.id], bases)
    assert peaks == {**{(run.id, n): v for n, v in truth.items()}, (other.id, "attention_z"): 9.0}
    assert truth["mlp_rms"] == 1001.0 and truth["output_z"] == 1000.0
    assert store.series_peaks([run.id], ["router_z"]) == {}  # never logged
    assert store.series_peaks([], bases) == {}


def test_run_health_reads_status_last_loss_and_incident_kinds(store: SqlStore) -> None:
    store.upsert_group("p", "g", {})
    runs = {name: store.upsert_run("p", name, {"group": "g", "status": "finished"})[0] for name in ("a", "b", "c")}
    store.ingest(runs["a"].id, "a1", [Point(name="loss", step=s, value=3.0 - s * 0.1) for s in range(4)])
    store.ingest(
        runs["b"].id, "b1", [Point(name="loss", step=0, value=3.0), Point(name="loss", step=1, value=math.nan)]
    )
    alert = NewAlert("logit_ceiling", "critical", "attention_lse_max.h0", 0, 1, 70.0, 50.0, "m")
    store.add_alerts(runs["c"].id, [alert, NewAlert("max_vio_collapse", "warning", "max_vio", 0, 2, 3.0, 2.0, "m")])
    group_id = runs["a"].group_id
    assert group_id is not None
    health = {h.name: h for h in store.group_run_health(group_id)}
    assert health["a"].status == "finished" and health["a"].last_loss == 2.7 and health["a"].incidents == ()
    last_b = health["b"].last_loss
    assert last_b is not None and math.isnan(last_b)
    assert health["c"].last_loss is None
    assert health["c"].incidents == (("logit_ceiling", "critical"), ("max_vio_collapse", "warning"))


def test_the_later_read_of_a_groups_runs_stands(store: SqlStore) -> None:
    group, _ = store.upsert_group("p", "g", {})
    assert store.get_group(group.id).learned is None  # not read yet
    assert store.save_learned(group.id, {"runs": ["a", "b"]}, read_at=200.0)
    assert not store.save_learned(group.id, {"runs": ["a"]}, read_at=100.0)  # read before: dropped
    learned = store.get_group(group.id).learned
    assert learned is not None and learned["runs"] == ["a", "b"]


def _before() -> str:
    script = ScriptDirectory.from_config(migrate.alembic_config()).get_revision(REVISION)
    assert script is not None and isinstance(script.down_revision, str)
    return script.down_revision


def test_migration_adds_the_learning_columns_and_drops_them_keeping_groups_and_runs(db_url: str) -> None:
    store = SqlStore(db_url)
    try:
        migrate.upgrade(store.engine, _before())
        with store.engine.begin() as conn:
            conn.execute(text("INSERT INTO projects (id, name, created_at) VALUES (1, 'p', CURRENT_TIMESTAMP)"))
            conn.execute(
                text(
                    "INSERT INTO groups (id, project_id, name, description, config, thresholds, created_at, "
                    "updated_at) VALUES (1, 1, 'g', '', '{}', '{\"growth_factor\": 3}', CURRENT_TIMESTAMP, "
                    "CURRENT_TIMESTAMP)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO runs (id, project_id, group_id, name, status, config, summary, export_layers, "
                    "created_at, updated_at) VALUES (1, 1, 1, 'r', 'finished', '{}', '{}', false, "
                    "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )
        migrate.upgrade(store.engine)
        group = store.get_group(1)
        assert group.learn_thresholds is None and group.learned is None and group.thresholds == {"growth_factor": 3}
        store.update_group(1, {"learn_thresholds": True})
        assert store.get_group(1).learn_thresholds is True
        migrate.downgrade(store.engine, _before())
        columns = {c["name"] for c in inspect(store.engine).get_columns("groups")}
        assert "learn_thresholds" not in columns and "learned" not in columns
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT group_id FROM runs WHERE id = 1")).scalar() == 1  # the run keeps its group
        migrate.upgrade(store.engine)
        assert store.get_group(1).learn_thresholds is None
    finally:
        store.close()
