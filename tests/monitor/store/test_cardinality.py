"""Bounded cardinality (issue 37): series per run and per project, names per database; bounded reads.

Every test runs on SQLite and on PostgreSQL (``store`` / ``db_url``). The limits are set low so a
flood of a few thousand names stands for the million of the attack (bench/cardinality.py measures
that one).
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import inspect, text

from hyperwatch.hooks.columns import PointColumns
from hyperwatch.hooks.sinks import client as sink_client
from hyperwatch.monitor.store import SqlStore, migrate
from hyperwatch.monitor.store.cardinality import SeriesLimitError, SeriesLimits
from hyperwatch.monitor.store.ingest import LatestSteps
from tests.monitor.conftest import AUTH, create_run, make_client, post_points


def _points(names: list[str], step: int = 1, layers: tuple[int | None, ...] = (None,)) -> list[dict[str, object]]:
    return [{"name": n, "layer": la, "step": step, "value": 1.0} for n in names for la in layers]


def _user(start: int, count: int, prefix: str = "user.m") -> list[str]:
    return [f"{prefix}{i:06d}" for i in range(start, start + count)]


def _post(client: TestClient, run: str, points: list[dict[str, object]], project: str = "default") -> Any:
    body = {"batch_id": uuid.uuid4().hex, "run": run, "points": points}
    return client.post(f"/api/v1/points?project={project}", json=body, headers=AUTH)


def _count(store: SqlStore, sql: str, **params: object) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text(sql), params).scalar() or 0)


def _series_rows(store: SqlStore, run_id: int) -> int:
    return _count(store, "SELECT count(*) FROM series_latest WHERE run_id = :r", r=run_id)


def test_run_limit_refuses_the_whole_batch_with_the_setting_named(store: SqlStore) -> None:
    client = make_client(store, max_series_per_run=50)
    run_id = int(str(create_run(client, "r1")["id"]))
    post_points(client, "r1", _points(_user(0, 20), layers=(None, 0)))  # 40 series
    names_before = _count(store, "SELECT count(*) FROM metric_names")
    r = _post(client, "r1", [*_points(["loss"], step=2), *_points(_user(20, 11), step=2)])  # 12 new: 52 > 50
    assert r.status_code == 409, r.text
    msg = r.json()["detail"]
    assert "HYPERWATCH_MAX_SERIES_PER_RUN" in msg and "50" in msg and "40 series" in msg and "12 new" in msg
    # nothing of it: no point (not even the loss), no name id drawn, no count moved, the step unchanged
    assert _series_rows(store, run_id) == 40
    assert _count(store, "SELECT count(*) FROM metric_names") == names_before
    assert _count(store, "SELECT series_count FROM runs WHERE id = :r", r=run_id) == 40
    assert store.get_run(run_id).last_step == 1
    # known series are still stored, and new ones up to the limit
    post_points(client, "r1", _points(_user(0, 20), step=3, layers=(None, 0)))
    post_points(client, "r1", _points(_user(20, 10), step=3))
    assert _series_rows(store, run_id) == 50
    assert _count(store, "SELECT series_count FROM runs WHERE id = :r", r=run_id) == 50
    assert _post(client, "r1", _points(["loss"], step=4)).status_code == 409


def test_project_and_name_limits(store: SqlStore) -> None:
    client = make_client(store, max_series_per_project=70, max_metric_names=90)
    for name in ("a", "b"):
        create_run(client, name, project="p")
    create_run(client, "c", project="q")
    assert _post(client, "a", _points(_user(0, 40)), "p").status_code == 201
    r = _post(client, "b", _points(_user(0, 31)), "p")  # known names, but 31 new series for the project
    assert r.status_code == 409
    msg = r.json()["detail"]
    assert "HYPERWATCH_MAX_SERIES_PER_PROJECT" in msg and "'p'" in msg and "40 series" in msg and "70" in msg
    assert _count(store, "SELECT series_count FROM projects WHERE name = 'p'") == 40
    assert _post(client, "b", _points(_user(0, 30)), "p").status_code == 201
    assert _count(store, "SELECT series_count FROM projects WHERE name = 'p'") == 70
    # another project has its own count; the names are shared by the database: 40 + 51 > 90
    r = _post(client, "c", _points(_user(40, 51)), "q")
    assert r.status_code == 409
    msg = r.json()["detail"]
    assert "HYPERWATCH_MAX_METRIC_NAMES" in msg and "holds 40 metric names" in msg and "51 new" in msg, msg
    assert _count(store, "SELECT series_count FROM projects WHERE name = 'q'") == 0
    assert _count(store, "SELECT count(*) FROM metric_names WHERE name LIKE 'user.%'") == 40
    assert _post(client, "c", _points(_user(40, 50)), "q").status_code == 201


def test_counts_stay_exact_under_concurrent_writers(db_url: str) -> None:
    """Two store instances (two service processes) x 4 threads race new series into 2 runs of one
    project at the run and project limits: no count passes a limit, and the kept counts equal the rows."""
    stores = [SqlStore(db_url) for _ in range(2)]
    migrate.upgrade(stores[0].engine)
    for s in stores:
        s.series_limits = SeriesLimits(per_run=100, per_project=150, names=10_000)
    runs = [stores[0].upsert_run("p", name, {})[0] for name in ("r1", "r2")]
    refused: list[str] = []
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        store = stores[k % 2]
        try:
            for j in range(12):
                run = ("r1", "r2")[(k + j) % 2]
                names = _user(k * 1000 + j * 10, 10)  # 10 new series, half of them names another writer also sends
                names[:5] = [f"user.shared{j:03d}.{i}" for i in range(5)]
                cols = PointColumns.build(names, [j + 1] * 10, [1.0] * 10, [None] * 10, [None] * 10)
                try:
                    store.ingest_named("p", run, uuid.uuid4().hex, cols)
                except SeriesLimitError as exc:
                    refused.append(str(exc))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors
        assert refused  # the limits were reached
        counts = [_series_rows(stores[0], r.id) for r in runs]
        kept = [_count(stores[0], "SELECT series_count FROM runs WHERE id = :r", r=r.id) for r in runs]
        assert kept == counts and all(c <= 100 for c in counts), (kept, counts)
        assert _count(stores[0], "SELECT series_count FROM projects WHERE name = 'p'") == sum(counts) <= 150
        assert sum(counts) > 140  # the refusals were the limits', not a lost race (batches add <= 10)
    finally:
        for s in stores:
            s.close()


def test_metrics_and_series_index_stay_bounded_after_a_flood(store: SqlStore) -> None:
    client = make_client(store, max_series_per_run=2000)
    run = create_run(client, "r1")
    post_points(client, "r1", _points(["loss", "attention_z"], layers=(None,)))
    before = client.get("/metrics").text
    outcomes = [
        _post(client, "r1", _points(_user(i * 500, 500), step=2)).status_code
        for i in range(8)  # 4,000 new names; the limit of 2,000 lets 1,500 of them in
    ]
    assert outcomes == [201, 201, 201, 409, 409, 409, 409, 409]
    after = client.get("/metrics").text
    assert 'hyperwatch_run_series{project="default",run="r1"} 1502.0' in after
    strip = [ln for ln in after.splitlines() if not ln.startswith(("hyperwatch_run_series", "hyperwatch_http"))]
    assert len(strip) <= len(before.splitlines()) + 5 and "user." not in after
    # the store's read for /metrics holds the gauges' series only, however many others the run has
    assert {lv.name for lv in store.latest_for_active_runs(["loss", "attention_z"])} == {"loss", "attention_z"}
    # the series index: pages of `limit`, each with the cursor of the next, in (name, layer) order
    seen: list[tuple[str, int | None]] = []
    url = f"/api/v1/runs/{run['id']}/series_index"
    cursor: str | None = None
    pages = 0
    while True:
        r = client.get(url, params={"limit": 400, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.text
        assert len(r.json()) <= 400
        seen += [(s["name"], s["layer"]) for s in r.json()]
        pages += 1
        cursor = r.headers.get("x-next-cursor")
        if cursor is None:
            break
    assert pages == 4 and len(seen) == 1502 == len(set(seen)) and seen == sorted(seen, key=lambda k: (k[0], k[1] or -1))
    assert len(client.get(url).json()) == 1502  # the default page holds a real run whole


def test_series_index_cursor_walks_layers_and_refuses_bad_input(store: SqlStore) -> None:
    client = make_client(store)
    run = create_run(client, "r1")
    post_points(client, "r1", _points(["attention_z", "loss"], layers=(None, 0, 1, 2)))
    url = f"/api/v1/runs/{run['id']}/series_index"
    got: list[tuple[str, int | None]] = []
    cursor = None
    while True:
        r = client.get(url, params={"limit": 3, **({"cursor": cursor} if cursor else {})})
        got += [(s["name"], s["layer"]) for s in r.json()]
        cursor = r.headers.get("x-next-cursor")
        if cursor is None:
            break
    assert got == [(n, la) for n in ("attention_z", "loss") for la in (None, 0, 1, 2)]
    for bad in ("not-a-cursor!", "eDpsb3Nz", ""):  # "eDpsb3Nz" = "x:loss"
        r = client.get(url, params={"cursor": bad})
        assert r.status_code == 422 and "cursor" in r.text, (bad, r.text)
    for bad in ("0", "20001", "²"):
        r = client.get(url, params={"limit": bad})
        assert r.status_code == 422 and "limit" in r.text, (bad, r.text)


def test_latest_steps_cache_is_bounded_by_series() -> None:
    cache = LatestSteps(max_runs=100, max_series=1000)
    for run_id in range(10):
        cache.put(run_id, 1, {i: 1 for i in range(400)}, {i: 1.0 for i in range(400)})
    assert cache.get(9, 1) is not None and cache.get(8, 1) is not None and cache.get(7, 1) is None
    cache.put(9, 2, {1: 1}, {1: 1.0})  # a run replaced counts its new size only
    assert cache.get(8, 1) is not None and cache.get(9, 2) is not None


def test_hooks_sink_treats_the_refusal_as_permanent() -> None:
    """The hooks' HTTP sink sets a 409 aside in rejected/ (REFUSED) instead of retrying it forever."""
    response = sink_client.Response(409, "run full")
    assert sink_client.classify(response) == sink_client.REFUSED


def test_migration_0011_counts_the_series_there_and_goes_back(db_url: str) -> None:
    store = SqlStore(db_url)
    try:
        migrate.upgrade(store.engine, "0010_group_learning")
        with store.engine.begin() as conn:
            conn.execute(text("INSERT INTO projects (id, name, created_at) VALUES (1, 'p', CURRENT_TIMESTAMP)"))
            for rid in (1, 2, 3):
                conn.execute(
                    text(
                        "INSERT INTO runs (id, project_id, name, status, config, summary, export_layers, created_at, "
                        "updated_at) VALUES (:r, 1, :n, 'running', '{}', '{}', false, CURRENT_TIMESTAMP, "
                        "CURRENT_TIMESTAMP)"
                    ),
                    {"r": rid, "n": f"r{rid}"},
                )
            conn.execute(text("INSERT INTO metric_names (id, name) VALUES (1, 'loss'), (2, 'attention_z')"))
            rows = [(1, 1, -1), (1, 2, 0), (1, 2, 1), (2, 1, -1)]  # run 3: no series
            conn.execute(
                text("INSERT INTO series_latest (run_id, name_id, layer, step, value) VALUES (:r, :n, :l, 5, 1.0)"),
                [{"r": r, "n": n, "l": la} for r, n, la in rows],
            )
        migrate.upgrade(store.engine)
        assert [_count(store, "SELECT series_count FROM runs WHERE id = :r", r=r) for r in (1, 2, 3)] == [3, 1, 0]
        assert _count(store, "SELECT series_count FROM projects WHERE id = 1") == 4
        # the counts go on from there: a new series of run 2 is counted, a known one is not
        store.ingest(2, "b1", PointColumns.build(["loss", "grad_norm"], [6, 6], [1.0, 2.0], [None, None], [None, None]))
        assert _count(store, "SELECT series_count FROM runs WHERE id = 2") == 2
        assert _count(store, "SELECT series_count FROM projects WHERE id = 1") == 5
        migrate.downgrade(store.engine, "0010_group_learning")
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM series_latest")).scalar() == 5
            for table in ("runs", "projects"):
                cols = {c["name"] for c in inspect(conn).get_columns(table)}
                assert "series_count" not in cols
        migrate.upgrade(store.engine)
        assert _count(store, "SELECT series_count FROM projects WHERE id = 1") == 5
    finally:
        store.close()
