"""A key sent twice in one batch: the last value is stored, and only it is judged (issue 25)."""

from __future__ import annotations

import math
import uuid

import numpy as np

from hyperwatch.hooks.columns import PointColumns
from hyperwatch.monitor.store import SqlStore
from hyperwatch.monitor.store.points import last_per_key
from tests.monitor.conftest import AUTH, create_run, make_client


def _alerts(client: object, run_id: int) -> list[tuple[str, str, int]]:
    r = client.get("/api/v1/alerts", params={"run_id": run_id}, headers=AUTH)  # type: ignore[attr-defined]
    assert r.status_code == 200, r.text
    return sorted((a["rule"], a["name"], a["step"]) for a in r.json())


def test_nan_then_a_number_for_one_key_stores_the_number_and_raises_nothing(store: SqlStore) -> None:
    client = make_client(store)
    run_id = int(create_run(client)["id"])  # type: ignore[call-overload]
    points = [
        {"name": "user.x", "step": 5, "value": "NaN"},
        {"name": "user.y", "step": 5, "value": 2.0},
        {"name": "user.x", "step": 5, "value": 1.0},  # overwrites the NaN within the batch
        {"name": "user.y", "step": 5, "value": "Infinity"},  # overwrites 2.0: stored, and alarming
    ]
    r = client.post("/api/v1/points", json={"batch_id": uuid.uuid4().hex, "run": "r1", "points": points}, headers=AUTH)
    assert r.status_code == 201, r.text
    assert r.json()["alerts"] == 1 and r.json()["accepted"] == 4  # every point sent counts, as before
    assert _alerts(client, run_id) == [("nonfinite_value", "user.y", 5)]
    x = store.series(run_id, "user.x", None, 1000, None, None).points
    y = store.series(run_id, "user.y", None, 1000, None, None).points
    assert [(p.step, p.value) for p in x] == [(5, 1.0)]
    assert [p.step for p in y] == [5] and math.isinf(y[0].value)


def test_last_per_key_keeps_arrival_order_and_the_batch_when_no_key_repeats() -> None:
    cols = PointColumns.build(["a", "b", "a", "a"], [1, 1, 1, 2], [np.nan, 2.0, 3.0, 4.0], [0, None, 0, 0], [None] * 4)
    out = last_per_key(cols)
    assert [(p.name, p.step, p.value, p.layer) for p in out.points()] == [
        ("b", 1, 2.0, None),
        ("a", 1, 3.0, 0),
        ("a", 2, 4.0, 0),
    ]
    same = PointColumns.build(["a", "a"], [1, 1], [1.0, 2.0], [0, 1], [None, None])  # other layers: no repeat
    assert last_per_key(same) is same
