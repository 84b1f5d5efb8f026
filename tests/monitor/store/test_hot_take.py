"""Reads and deletes of many series at once: what a seal takes back, and joins over ``chunk_rows``.

A one-step batch that seals takes back every sealed series' hot rows (``seal._take_hot``): on SQLite
one read of the run's hot rows in the ranges' steps, kept where a range holds them, and one delete
when they are all the rows read. Rows of series the batch does not seal, in the same steps, must stay.
``bulk.read_in_ranges`` over the view ``chunk_rows`` reads SQLite's two tables through their keys.
"""

from __future__ import annotations

import math
import uuid

import numpy as np
import pytest
from sqlalchemy import text

from hyperwatch.hooks.columns import NULL_INT
from hyperwatch.hooks.schema import Point
from hyperwatch.monitor.store import SqlStore
from hyperwatch.monitor.store.bulk import read_in_ranges
from hyperwatch.monitor.store.chunks import all_points
from hyperwatch.monitor.store.models import CHUNK_ROWS
from hyperwatch.monitor.store.seal import Columns


def test_rows_become_columns_exactly_beyond_the_float64_integers() -> None:
    rows = [
        (1, -1, 0, None, None),
        (1, -1, 1, 2**53 - 1, math.inf),
        (2, 7, 2**40, 0, -math.inf),
        (2, 7, 2**40 + 1, 5, -0.0),
    ]
    cols = Columns.of_rows(rows)
    assert cols.ids.tolist() == [1, 1, 2, 2] and cols.layer.tolist() == [-1, -1, 7, 7]
    assert cols.step.tolist() == [0, 1, 2**40, 2**40 + 1]
    assert cols.tokens.tolist() == [NULL_INT, 2**53 - 1, 0, 5]
    assert math.isnan(cols.value[0]) and cols.value[1:].tolist() == [math.inf, -math.inf, 0.0]
    assert math.copysign(1, cols.value[3]) == -1
    # an integer float64 cannot hold: every column taken as it is, not rounded
    big = Columns.of_rows([*rows, (3, 0, 9, 2**53 + 1, 1.5), (3, 0, 10, 2**62 + 3, None)])
    assert big.tokens.tolist()[-2:] == [2**53 + 1, 2**62 + 3]
    assert big.tokens.tolist()[:4] == cols.tokens.tolist() and big.step.tolist()[-2:] == [9, 10]
    assert big.value[4] == 1.5 and math.isnan(big.value[5]) and big.value.dtype == np.float64


def _points(store: SqlStore, run_id: int) -> dict[tuple[int, int], float]:
    """(layer, step) -> value of every stored point of the run (NaN for NULL)."""
    with store.engine.connect() as conn:
        return {(la, s): math.nan if v is None else v for _r, _n, la, s, _t, v in all_points(conn, run_id)}


def test_a_seal_takes_only_the_series_it_seals_and_leaves_the_others_hot(store: SqlStore) -> None:
    run, _ = store.upsert_run("default", "take", {})
    sent: dict[tuple[int, int], float] = {}

    def send(step: int, layers: list[int]) -> None:
        pts = [Point("attention_z", step, step + la / 10, layer=la, tokens=step * 64) for la in layers]
        sent.update({(la, step): step + la / 10 for la in layers})
        store.ingest(run.id, uuid.uuid4().hex, pts)

    for step in range(15):
        send(step, [0, 1, 2])
    send(15, [0, 2])  # seals layers 0 and 2; layer 1's 15 rows in the same steps stay hot
    with store.engine.connect() as conn:
        hot = conn.execute(
            text("SELECT layer, count(*) FROM metric_points WHERE run_id = :r GROUP BY layer"), {"r": run.id}
        )
        assert dict(hot.all()) == {1: 15}
        chunk_layers = conn.execute(
            text(f"SELECT layer FROM {CHUNK_ROWS} WHERE run_id = :r ORDER BY layer"), {"r": run.id}
        )
        assert [r[0] for r in chunk_layers] == [0, 2]
    for step in range(16, 33):
        send(step, [0, 1, 2])  # layer 1 seals chunk 0 now, with its step 15 missing
    assert _points(store, run.id) == sent


def test_a_join_over_the_chunk_view_reads_each_table_through_its_key(sqlite_store: SqlStore) -> None:
    store = sqlite_store
    run, _ = store.upsert_run("default", "plan", {})
    for step in range(40):
        pts = [Point(n, step, float(step * la), layer=la) for n in ("a", "b") for la in range(3)]
        store.ingest(run.id, uuid.uuid4().hex, pts)
    with store.engine.connect() as conn:
        ids: dict[str, int] = {}
        for n in ("a", "b"):
            found = store._name_id(conn, n, create=False)
            assert found is not None
            ids[n] = found
        ranges = [(ids[n], la, 0, 1) for n in ("a", "b") for la in range(3)]
        got = sorted(
            (n, la, c, bytes(d))
            for n, la, c, d in read_in_ranges(conn, run.id, "t.chunk, t.data", CHUNK_ROWS, "chunk", "", ranges)
        )
        sql = f"SELECT name_id, layer, chunk, data FROM {CHUNK_ROWS} WHERE run_id = :r AND chunk <= 1"
        want = sorted((n, la, c, bytes(d)) for n, la, c, d in conn.execute(text(sql), {"r": run.id}))
        assert got == want and len(got) == 12  # 6 series, chunks 0 and 1
        # the plan: no copy of the whole view scanned once per range (quadratic in the series)
        raw = conn.connection.dbapi_connection
        assert raw is not None
        statements: list[str] = []
        raw.set_trace_callback(statements.append)
        read_in_ranges(conn, run.id, "t.chunk, t.data", CHUNK_ROWS, "chunk", "", ranges)
        raw.set_trace_callback(None)
        (sql_read,) = [s for s in statements if s.lstrip().startswith("WITH")]
        plan = " | ".join(r[3] for r in raw.execute("EXPLAIN QUERY PLAN " + sql_read))
        assert "MATERIALIZE chunk_rows" not in plan and "SCAN t" not in plan, plan
        assert plan.count("USING PRIMARY KEY") + plan.count("USING INDEX") == 2, plan


@pytest.mark.parametrize("seal_all", [True, False])
def test_what_a_seal_takes_reads_back_bit_for_bit(store: SqlStore, seal_all: bool) -> None:
    run, _ = store.upsert_run("default", f"bits-{seal_all}", {})
    rng = np.random.default_rng(3)
    sent: dict[tuple[int, int], float] = {}
    specials = [math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308]
    for step in range(48):
        layers = [0, 1, 2, 3] if seal_all or step % 16 != 15 else [0, 1]
        vals = rng.normal(size=len(layers)) * 10.0 ** rng.integers(-300, 300, size=len(layers))
        if step % 7 == 3:
            vals[0] = specials[step % len(specials)]
        pts = [
            Point("mlp_rms", step, float(v), layer=la, tokens=step * 4096 if seal_all else 2**60 + step)
            for la, v in zip(layers, vals)
        ]
        sent.update({(la, step): float(v) for la, v in zip(layers, vals)})
        store.ingest(run.id, uuid.uuid4().hex, pts)
    got = _points(store, run.id)
    assert set(got) == set(sent)
    for key, v in sent.items():
        back = got[key]
        if v == 0:  # SQLite keeps a REAL with no fraction as an integer: -0.0 reads back as 0.0
            assert back == 0, key
            continue
        assert np.float64(v).tobytes() == np.float64(back).tobytes() or (math.isnan(v) and math.isnan(back)), key
