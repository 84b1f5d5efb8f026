"""Metric-name ids (issue 25): a refused batch allocates nothing, only used names are registered,
ids are INTEGER on both databases, and running out of them is told truthfully."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import inspect, text

from hyperwatch.hooks.columns import COLUMNS_MEDIA_TYPE, PointColumns, encode_body
from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.core.errors import InvalidInputError
from hyperwatch.monitor.store import SqlStore, migrate
from hyperwatch.monitor.store.names import MAX_NAMES_PER_BATCH
from tests.monitor.conftest import AUTH, create_run, make_client

NAME_TABLES = ("metric_points", "metric_chunks", "open_chunks", "metric_rollups", "series_latest", "point_batches")


def _names(store: SqlStore) -> list[tuple[int, str]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text("SELECT id, name FROM metric_names ORDER BY id"))]  # type: ignore[misc]


def _words(r: object) -> str:
    """The error's words, whether ``detail`` is a string or a list of errors (the schema's 422)."""
    return json.dumps(r.json())  # type: ignore[attr-defined]


def _post(client: TestClient, names: list[str], step: int = 0) -> object:
    body = {
        "batch_id": uuid.uuid4().hex,
        "run": "r1",
        "points": [{"name": n, "step": step, "value": 1.0} for n in names],
    }
    return client.post("/api/v1/points", json=body, headers=AUTH)


def test_refused_batch_allocates_no_id_and_a_new_name_still_goes_in_postgresql(pg_store: SqlStore) -> None:
    """Before issue 25, 32,768 distinct names were refused (422) but left the smallint sequence at
    its maximum: every later new name, in any project, was refused too."""
    client = make_client(pg_store)
    create_run(client)
    r = _post(client, ["loss", "grad_norm"])
    assert r.status_code == 201, r.text  # type: ignore[attr-defined]
    many = [f"user.m{i}" for i in range(32_768)]
    r = _post(client, many, step=1)
    assert r.status_code == 422  # type: ignore[attr-defined]
    detail = _words(r)
    assert "32768 distinct metric names" in detail and f"limit is {MAX_NAMES_PER_BATCH}" in detail
    with pg_store.engine.connect() as conn:
        assert conn.execute(text("SELECT last_value FROM metric_names_id_seq")).scalar() == 2  # nothing drawn
    r = _post(client, ["user.fresh", "loss"], step=2)
    assert r.status_code == 201, r.text  # type: ignore[attr-defined]
    assert _names(pg_store) == [(1, "grad_norm"), (2, "loss"), (3, "user.fresh")]
    # known names draw no id: 4 names in use, last_value 4 (the issue saw 5)
    r = _post(client, ["loss", "grad_norm", "user.fresh", "lr"], step=3)
    assert r.status_code == 201, r.text  # type: ignore[attr-defined]
    with pg_store.engine.connect() as conn:
        assert conn.execute(text("SELECT last_value FROM metric_names_id_seq")).scalar() == 4


def test_the_cap_is_checked_before_the_run_is_looked_up(store: SqlStore) -> None:
    """An over-the-cap batch for a run that does not exist is a 422 about the names, not a 404:
    nothing reached the database."""
    client = make_client(store)
    r = _post(client, [f"user.n{i}" for i in range(MAX_NAMES_PER_BATCH + 1)])
    assert r.status_code == 422, r.text  # type: ignore[attr-defined]
    assert "distinct metric names" in _words(r)
    assert _names(store) == []
    with pytest.raises(InvalidInputError, match="split it into batches with fewer names"):
        store.ingest(1, "b" * 16, [Point(f"user.n{i}", 0, 1.0) for i in range(MAX_NAMES_PER_BATCH + 1)])


def test_header_names_no_point_uses_are_not_registered(store: SqlStore) -> None:
    client = make_client(store)
    create_run(client)
    header = ("user.unused_a", "loss", "user.unused_b", "lr")
    columns = PointColumns(
        header,
        np.array([1, 3, 1], dtype=np.int32),
        np.array([0, 0, 1], dtype=np.int64),
        np.array([2.5, 0.1, 2.25]),
        np.array([-1, -1, -1], dtype=np.int64),
        np.array([-1, -1, -1], dtype=np.int64),
    )
    body = encode_body(uuid.uuid4().hex, "r1", columns)
    r = client.post("/api/v1/points", content=body, headers={**AUTH, "Content-Type": COLUMNS_MEDIA_TYPE})
    assert r.status_code == 201, r.text
    assert r.json()["accepted"] == 3
    assert [n for _, n in _names(store)] == ["loss", "lr"]  # one INSERT, in name order
    run_id = r.json()["run_id"]
    assert [(p.step, p.value) for p in store.series(run_id, "loss", None, 1000, None, None).points] == [
        (0, 2.5),
        (1, 2.25),
    ]


def test_name_ids_are_integer_on_both_databases(store: SqlStore) -> None:
    cols = inspect(store.engine)
    types = {"metric_names": str(next(c["type"] for c in cols.get_columns("metric_names") if c["name"] == "id"))}
    for table in NAME_TABLES:
        types[table] = str(next(c["type"] for c in cols.get_columns(table) if c["name"] == "name_id"))
    assert set(types.values()) == {"INTEGER"}, types
    if store.engine.dialect.name == "postgresql":
        with store.engine.connect() as conn:
            seq = conn.execute(
                text("SELECT data_type, max_value FROM pg_sequences WHERE sequencename = 'metric_names_id_seq'")
            )
            assert tuple(seq.one()) == ("integer", 2**31 - 1)


def test_ids_beyond_smallint_store_and_read_back_postgresql(pg_store: SqlStore) -> None:
    """Ids past 32,767 go through every path that names a type: binary COPY of hot rows, chunks, pending."""
    client = make_client(pg_store)
    run_id = create_run(client)["id"]
    with pg_store.engine.begin() as conn:
        conn.execute(text("SELECT setval('metric_names_id_seq', 40000)"))
    for step in range(40):  # seals chunks (16 steps each) and leaves pending batches
        r = _post(client, ["user.big", "loss"], step=step)
        assert r.status_code == 201, r.text  # type: ignore[attr-defined]
    assert [i for i, _ in _names(pg_store)] == [40001, 40002]
    read = pg_store.series(run_id, "user.big", None, 1000, None, None).points  # type: ignore[arg-type]
    assert [p.step for p in read] == list(range(40))


def test_exhausted_ids_say_so_and_known_names_still_store_postgresql(pg_store: SqlStore) -> None:
    client = make_client(pg_store)
    create_run(client)
    assert _post(client, ["loss"]).status_code == 201  # type: ignore[attr-defined]
    with pg_store.engine.begin() as conn:
        conn.execute(text("SELECT setval('metric_names_id_seq', 2147483647)"))
    r = _post(client, ["loss", "user.one_too_many"], step=1)
    assert r.status_code == 507, r.text  # type: ignore[attr-defined]
    detail = _words(r)
    assert "used every metric-name id" in detail and "the request is valid" in detail
    assert "fix that field" not in detail
    assert _post(client, ["loss"], step=1).status_code == 201  # type: ignore[attr-defined]


def test_downgrade_refuses_ids_a_smallint_cannot_hold_postgresql(pg_store: SqlStore) -> None:
    before = _revision_before_0007()
    with pg_store.engine.begin() as conn:
        conn.execute(text("INSERT INTO metric_names (name) VALUES ('loss')"))
        conn.execute(text("INSERT INTO metric_names (id, name) VALUES (40000, 'user.big')"))
        conn.execute(text("SELECT setval('metric_names_id_seq', 40000)"))  # as if drawn past 32,767
    with pytest.raises(RuntimeError, match="metric_names holds id 40000"):
        migrate.downgrade(pg_store.engine, before)
    assert migrate.current_revision(pg_store.engine) == migrate.head_revision()  # nothing changed
    with pg_store.engine.begin() as conn:
        conn.execute(text("DELETE FROM metric_names WHERE id = 40000"))
    migrate.downgrade(pg_store.engine, before)  # the sequence is set back to the highest id in use
    with pg_store.engine.begin() as conn:
        conn.execute(text("INSERT INTO metric_names (name) VALUES ('lr')"))
        kind = conn.execute(text("SELECT data_type FROM pg_sequences WHERE sequencename = 'metric_names_id_seq'"))
        assert kind.scalar() == "smallint"
    assert _names(pg_store) == [(1, "loss"), (2, "lr")]
    migrate.upgrade(pg_store.engine)
    assert _names(pg_store) == [(1, "loss"), (2, "lr")]


def _revision_before_0007() -> str:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(migrate.alembic_config())
    down = script.get_revision("0007_metric_name_ids").down_revision
    assert isinstance(down, str)
    return down


def test_metric_names_benchmark_runs_both_paths_on_both_databases() -> None:
    """The short version of ``bench/metric_names.py``: both paths register every name on both databases
    (the script asserts the count), and on PostgreSQL draw exactly one id per name."""
    bench = Path(__file__).resolve().parents[3] / "bench" / "metric_names.py"
    done = subprocess.run([sys.executable, str(bench), "--names", "300"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [ln for ln in done.stdout.splitlines() if "new names" in ln]
    assert [ln.split()[0] for ln in lines] == ["SQLite", "PostgreSQL"], done.stdout
    assert "ids drawn: before 300, now 300" in lines[1]
