"""The columnar seal of appended steps (monitor/store/seal.py) writes what the general path writes.

The same random histories of appended steps go into two runs, one with the columnar seal and one
without (``points.SEAL_ON_COLUMNS``); every chunk row (byte for byte) and every rollup row must be
equal, and the run must read back what was sent. The histories hold what the fast packing
must recognise or hand to ``chunks.encode``: gaps, series that start mid-chunk, NaN and +-Inf,
tokens absent, linear, partly absent, non-linear and beyond 2^58, batches of one step and of many.
"""

from __future__ import annotations

import math
import random
import uuid

import pytest
from sqlalchemy import text

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store import SqlStore, points, segcodec

Table = list[tuple[object, ...]]


def _history(seed: int) -> list[list[Point]]:
    rng = random.Random(seed)
    batches: list[list[Point]] = []
    step = 0
    tokens_kind = {la: la % 5 for la in range(4)}
    start = {la: rng.choice([0, 0, 7, 21]) for la in range(4)}  # some series start mid-chunk
    while step < 300:
        width = rng.choice([1, 1, 1, 3, 8, 20])
        pts = []
        for s in range(step, step + width):
            for la in range(4):
                if s < start[la] or (la == 3 and rng.random() < 0.3):  # a gappy series
                    continue
                kind = tokens_kind[la]
                tokens = [s * 4096, None, 2**60 + s, s * s, None if s % 5 == 0 else s][kind]
                value = rng.choice([rng.gauss(0, 1), rng.gauss(0, 1), math.nan, math.inf, -math.inf, 0.0, -0.0])
                pts.append(Point("attention_z", s, value, layer=la, tokens=tokens))
            pts.append(Point("loss", s, rng.gauss(3, 0.1), tokens=s * 4096))
        batches.append(pts)
        step += width
    return batches


def _tables(store: SqlStore, run_id: int) -> tuple[Table, Table]:
    """The run's chunk rows (blob as bytes) and rollup rows, without the run id."""
    with store.engine.connect() as conn:
        packed = [
            (*r[1:5], bytes(r[5]), *r[6:])
            for r in conn.execute(text("SELECT * FROM chunk_rows WHERE run_id = :r ORDER BY 2, 3, 4"), {"r": run_id})
        ]
        sql = "SELECT * FROM metric_rollups WHERE run_id = :r ORDER BY 2, 3, 4, 5"
        rollups = [tuple(r[1:]) for r in conn.execute(text(sql), {"r": run_id})]
    return packed, rollups


@pytest.mark.parametrize("seed", range(4))
def test_columnar_seal_writes_the_rows_of_the_general_path(
    store: SqlStore, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = _history(seed)
    runs = []
    for on in (True, False):
        monkeypatch.setattr(points, "SEAL_ON_COLUMNS", on)
        run, _ = store.upsert_run("default", f"seal-{on}", {})
        for pts in history:
            store.ingest(run.id, uuid.uuid4().hex, pts)
        runs.append(run.id)
    fast, general = (_tables(store, r) for r in runs)
    assert fast == general
    packed, rollups = fast
    # 16-step chunks and partial segments (packed at every 256th step: monitor.store.segments) were sealed
    assert {r[4][0] for r in packed} == {1, segcodec.VERSION} and not rollups  # no 1,024-step block in 300 steps
    want: dict[tuple[int | None, int], float] = {}
    for pts in history:
        for p in pts:
            if p.name == "attention_z":
                want[(p.layer, p.step)] = p.value
    for layer in range(4):
        got = {p.step: p.value for p in store.series(runs[0], "attention_z", layer, 10**6, None, None).points}
        expected = {s: v for (la, s), v in want.items() if la == layer}
        assert got.keys() == expected.keys()
        assert all(got[s] == v or (math.isnan(got[s]) and math.isnan(v)) for s, v in expected.items())
