"""The run's peak of a series (what /alerts shows as "Run peak", issue 35): its largest value over every
layer and step, read from the rollups, NaN and inf kept, on SQLite and PostgreSQL."""

from __future__ import annotations

import math
import uuid

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.read.lines import series_peak
from hyperwatch.monitor.read.reader import Reader
from hyperwatch.monitor.store import SqlStore
from hyperwatch.monitor.store.entities import NewAlert
from tests.monitor.conftest import make_client


def test_the_series_peak_is_its_largest_value_over_the_run(store: SqlStore) -> None:
    run, _ = store.upsert_run("p", "r", {})
    steps = 3000  # past the raw range: the read goes through the downsampled extremes
    pts = [Point("attention_z", s, 50.0 + s % 7, layer=la) for s in range(steps) for la in range(3)]
    pts.append(Point("attention_z", 1234, 2.2e7, layer=1))
    pts += [Point("loss", s, 3.0) for s in range(steps)] + [Point("grad_norm", s, 1.0) for s in range(steps)]
    pts += [Point("loss", 2000, math.nan), Point("grad_norm", 10, math.inf)]
    store.ingest(run.id, uuid.uuid4().hex, pts)
    assert series_peak(store, run, "attention_z") == 2.2e7  # one layer, one step of 9,000 points
    assert math.isnan(series_peak(store, run, "loss") or 0.0)  # NaN wins, as the incidents' peak
    assert series_peak(store, run, "grad_norm") == math.inf
    assert series_peak(store, run, "router_z") is None  # never logged
    store.add_alerts(run.id, [NewAlert("z_spike", "critical", "attention_z", 1, 5, 1.7e4, 60.0, "spike")])
    client = make_client(store)
    reader = Reader(store, client.app.state.settings)  # type: ignore[attr-defined]
    assert reader.incident_peaks(run_id=run.id) == {(run.id, "attention_z"): 2.2e7}
