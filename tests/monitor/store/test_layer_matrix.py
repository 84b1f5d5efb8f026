"""``Store.layer_matrix`` read for all layers at once (:mod:`monitor.store.matrix`) against a brute-force
reduction over every stored point (``chunks.all_points``), on both databases: NaN, +-Inf and 0.0/-0.0
at segment and chunk edges, strided and explicit-token layouts, layers of different extents, windows,
the hot tail, and a stopped run (everything in segments); wide buckets against the per-layer read."""

from __future__ import annotations

import math
import random
import uuid
from typing import Any

import numpy as np
import pytest

from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store import SqlStore, chunks, matrix
from hyperwatch.monitor.store import downsample as ds

EDGES = (0, 15, 16, 255, 256, 1023, 1024, 1025, 2047, 2048, 2303, 2304, 2319, 2320, 2599)
SPECIAL = (math.nan, math.inf, -math.inf, 0.0, -0.0)


def _cell(v: float | None) -> object:
    """A cell as compared: None, "nan", or the value with its sign (0.0 and -0.0 differ)."""
    return None if v is None else "nan" if math.isnan(v) else (v, math.copysign(1.0, v))


def _brute(
    store: SqlStore, run_id: int, name: str, buckets: int, start: int | None, end: int | None
) -> tuple[list[int], list[int], int, list[list[object]]] | None:
    """The matrix from every point: per layer and bucket, the largest non-NaN value (the earliest step's
    between equal ones), NaN if the bucket holds one. None when the buckets are a rollup block wide."""
    with store.engine.connect() as conn:
        nid = store._name_id(conn, name, create=False)
        every = [p for p in chunks.all_points(conn, run_id) if p[1] == nid and p[2] >= 0]
    layers = sorted({p[2] for p in every})
    a, b = start or 0, 2**62 if end is None else end
    inside = [p for p in every if a <= p[3] <= b]
    if not inside:
        return [], [], 1, []
    lo, hi = min(p[3] for p in inside), max(p[3] for p in inside)
    w = -(-(hi - lo + 1) // buckets)
    if w >= 1024:
        return None
    n = (hi - lo) // w + 1
    rows: list[list[object]] = []
    for la in layers:
        best: list[tuple[float, int] | None] = [None] * n
        nan = [False] * n
        for _r, _n, pla, s, _t, v in inside:
            if pla != la:
                continue
            j = (s - lo) // w
            if v is None or math.isnan(v):
                nan[j] = True
            elif best[j] is None or v > best[j][0] or (v == best[j][0] and s < best[j][1]):  # type: ignore[index]
                best[j] = (v, s)
        rows.append([_cell(math.nan) if nan[j] else None if best[j] is None else _cell(best[j][0]) for j in range(n)])  # type: ignore[index]
    return layers, [lo + i * w for i in range(n)], w, rows


def _per_layer(store: SqlStore, run_id: int, name: str, buckets: int, start: int | None, end: int | None) -> Any:
    """The matrix read one layer at a time (the read before issue 35's change, kept for wide buckets)."""
    with store.engine.connect() as conn:
        nid = store._name_id(conn, name, create=False)
        with_latest = store.layer_matrix(run_id, name, 1, None, None).layers
        base = {"run_id": run_id, "name_id": nid, "start": start or 0, "end": 2**62 if end is None else end}
        ends = [e for e in (ds.step_range(conn, {**base, "layer": la}) for la in with_latest) if e is not None]
        if not ends:
            return [], [], 1, []
        lo, hi = min(e[0][0] for e in ends), max(e[1][0] for e in ends)
        w = -(-(hi - lo + 1) // buckets)
        n = (hi - lo) // w + 1
        rows = [matrix._per_layer(conn, {**base, "layer": la}, lo, hi, w, n) for la in with_latest]
    return with_latest, [lo + i * w for i in range(n)], w, [[_cell(v) for v in r] for r in rows]


def _read(store: SqlStore, run_id: int, name: str, buckets: int, start: int | None, end: int | None) -> Any:
    m = store.layer_matrix(run_id, name, buckets, start, end)
    return m.layers, m.bucket_starts, m.bucket_width, [[_cell(v) for v in r] for r in m.values]


def _seed(store: SqlStore, run_id: int, rng: random.Random) -> None:
    """Layers 0-4 of attention_z over steps 0..2609 (layer 2 every 3rd step, layer 3 with explicit
    tokens some of them NULL, layer 4 from step 300), run-level attention_z and layer-0 loss beside them."""

    def value(s: int, la: int) -> float:
        if (s in EDGES and rng.random() < 0.7) or rng.random() < 0.01:
            return rng.choice(SPECIAL)
        return float(np.float32(math.exp(rng.gauss(0, 2)))) if la % 2 else math.exp(rng.gauss(0, 2))

    def points(s: int) -> list[Point]:
        out = [Point("attention_z", s, value(s, -1)), Point("loss", s, 1e9, layer=0, tokens=s)]
        for la in range(5):
            if (la == 2 and s % 3) or (la == 4 and s < 300):
                continue
            tokens = s * 4096 if la != 3 else (None if s % 5 == 0 else s * s)
            out.append(Point("attention_z", s, value(s, la), layer=la, tokens=tokens))
        return out

    step = 0
    while step < 2610:
        width = rng.choice([1, 2, 16, 37, 100])
        store.ingest(run_id, uuid.uuid4().hex, [p for s in range(step, min(step + width, 2610)) for p in points(s)])
        step += width
    late = [Point("attention_z", s, v, layer=1) for s, v in ((7, math.nan), (1500, math.inf), (2600, -0.0))]
    store.ingest(run_id, uuid.uuid4().hex, late)  # late writes: into a segment, a partial one, the tail
    ties = [(600, -0.0), (601, 0.0), (602, -math.inf), (603, 0.0), (604, -0.0), (605, math.nan)]
    store.ingest(run_id, uuid.uuid4().hex, [Point("attention_z", s, v, layer=0) for s, v in ties])  # 0.0 == -0.0


CASES = [
    (1, None, None),
    (2, None, None),
    (7, None, None),
    (100, None, None),
    (445, None, None),
    (1000, None, None),
    (2610, None, None),
    (5000, None, None),
    (445, 100, 900),
    (3, 1020, 1030),
    (4, 2300, 2330),
    (2, 2590, None),
    (9, 5000, None),
    (50, None, 20),
]


@pytest.mark.parametrize("slots", [matrix.MAX_SLOTS, 6000])
def test_matrix_equals_every_point_reduced(store: SqlStore, slots: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """All layers in one read, and (``slots``: 6,000) in groups of two after the per-layer ends."""
    monkeypatch.setattr(matrix, "MAX_SLOTS", slots)
    rng = random.Random(35)
    run, _ = store.upsert_run("default", "matrix", {})
    _seed(store, run.id, rng)
    brute = 0
    for status in ("running", "finished"):  # chunks, a partial segment and hot points; then segments only
        if status == "finished":
            store.update_run(run.id, {"status": status})
        for buckets, start, end in CASES:
            got = _read(store, run.id, "attention_z", buckets, start, end)
            want = _brute(store, run.id, "attention_z", buckets, start, end)
            if want is not None:  # narrower than a rollup block
                assert got == want, (status, buckets, start, end)
                brute += 1
            assert got == _per_layer(store, run.id, "attention_z", buckets, start, end), (status, buckets, start, end)
        assert _read(store, run.id, "loss", 10, None, None)[0] == [0]
        assert _read(store, run.id, "absent", 10, None, None) == ([], [], 1, [])
    assert brute == 2 * (len(CASES) - 2)


@pytest.mark.parametrize("buckets", [1, 2, 3])
def test_wide_buckets_read_the_rollups_as_before(store: SqlStore, buckets: int) -> None:
    """Buckets a rollup block wide or wider: each layer read on its own (a block counts in the bucket of
    its first step), the same as the read before issue 35's change."""
    run, _ = store.upsert_run("default", "wide-matrix", {})
    rng = random.Random(buckets)
    for lo in range(0, 9000, 1500):
        pts = [
            Point("attention_z", s, rng.choice(SPECIAL) if rng.random() < 0.002 else rng.gauss(0, 1), layer=la)
            for s in range(lo, lo + 1500)
            for la in range(3)
        ]
        store.ingest(run.id, uuid.uuid4().hex, pts)
    for start, end in ((None, None), (500, None), (1000, 8000)):
        got = _read(store, run.id, "attention_z", buckets, start, end)
        assert got[2] >= 1024
        assert got == _per_layer(store, run.id, "attention_z", buckets, start, end)
