"""The heatmap's wide buckets hold whole logging intervals (issue 24: "bucket of 9 steps" when
logging every 10 left empty stripes and cells out of step with the line chart)."""

from __future__ import annotations

import uuid

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.read.lines import layer_matrix
from hyperwatch.monitor.store import SqlStore


def test_buckets_are_a_multiple_of_the_hooks_logging_interval(store: SqlStore) -> None:
    run, _ = store.upsert_run("p", "every-10", {"config": {"_hyperwatch": {"every": 10}}})
    steps = range(0, 1800, 10)  # 180 logged steps: 200 buckets would be 9 steps wide
    store.ingest(
        run.id, uuid.uuid4().hex, [Point("attention_z", s, float(s), layer=la) for s in steps for la in (0, 1)]
    )
    assert store.layer_matrix(run.id, "attention_z", 200, None, None).bucket_width == 9  # what the store gives
    m = layer_matrix(store, store.get_run(run.id), "attention_z", 200)
    assert m.bucket_width % 10 == 0
    assert all(start % 10 == 0 for start in m.bucket_starts)  # cells start on logged steps, as the line's points
    assert all(v is not None for row in m.values for v in row)  # no empty stripe
    assert m.values[0][-1] == 1790.0  # the last logged step's max is kept


def test_a_run_without_an_interval_keeps_the_stores_buckets(store: SqlStore) -> None:
    run, _ = store.upsert_run("p", "api-run", {})
    store.ingest(run.id, uuid.uuid4().hex, [Point("attention_z", s, 1.0, layer=0) for s in range(0, 1800, 10)])
    assert layer_matrix(store, store.get_run(run.id), "attention_z", 200).bucket_width == 9
