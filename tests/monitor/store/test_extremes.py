"""Group-wise extremes (monitor/store/rollups.extremes) and the decode of many chunk rows at once
(monitor/store/chunks.columns_of_rows), each against the one-at-a-time form they replace."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from hyperwatch.monitor.store import chunks, segcodec
from hyperwatch.monitor.store.rollups import extremes


def _by_sorting(steps: np.ndarray, values: np.ndarray, group: np.ndarray, starts: np.ndarray) -> tuple[list, list]:
    """The rule as a sort: the first row in (value, step) order, and in (-value, step) order."""
    return (
        np.lexsort((steps, values, group))[starts].tolist(),
        np.lexsort((steps, -values, group))[starts].tolist(),
    )


@pytest.mark.parametrize("seed", range(20))
def test_extremes_pick_the_rows_a_sort_picks(seed: int) -> None:
    rng = random.Random(seed)
    sizes = [rng.choice([1, 1, 2, 3, 16, 40]) for _ in range(rng.randint(1, 30))]
    pool = [rng.gauss(0, 1), 0.0, -0.0, 1.5, 1.5, -2.0, math.inf, -math.inf, math.nan, math.nan]
    values = np.array([rng.choice(pool) for _ in range(sum(sizes))])
    if seed % 4 == 0:  # a group of NaN alone
        values[: sizes[0]] = math.nan
    group = np.repeat(np.arange(len(sizes)), sizes)
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    steps = np.concatenate([np.sort(rng.sample(range(1000), n)) for n in sizes])
    lows, highs = extremes(values, group, starts)
    want_lows, want_highs = _by_sorting(steps, values, group, starts)
    for g, (lo, hi, wlo, whi) in enumerate(zip(lows.tolist(), highs.tolist(), want_lows, want_highs, strict=True)):
        assert group[lo] == g and group[hi] == g
        if math.isnan(values[wlo]):  # NaN alone: any of its rows, and NaN
            assert math.isnan(values[lo]) and math.isnan(values[hi])
            continue
        assert (lo, hi) == (wlo, whi), (g, values[group == g], steps[group == g])
    empty = np.empty(0, dtype=np.int64)
    assert [len(x) for x in extremes(np.empty(0), empty, empty)] == [0, 0]


def _rows(rng: random.Random) -> list[tuple[int, bytes]]:
    rows: list[tuple[int, bytes]] = []
    for chunk in rng.sample(range(200), 30):
        first = chunk * 16 + rng.choice([0, 0, 5])
        n = rng.randint(1, 16 - (first - chunk * 16))
        steps = list(range(first, first + n))
        if rng.random() < 0.2:  # a gap: not the common layout
            steps = sorted(rng.sample(range(chunk * 16, chunk * 16 + 16), n))
        kind = rng.choice(["none", "linear", "linear", "mixed"])
        pts = []
        for s in steps:
            tokens = {"none": None, "linear": 7 + 4096 * s, "mixed": None if s % 2 else s * s}[kind]
            pts.append((s, tokens, rng.choice([rng.gauss(0, 1), None, math.inf, -0.0])))
        rows.append((chunk, chunks.encode(chunk, pts)[0]))
    seg = np.arange(4096, 4096 + 300, dtype=np.int64)  # and a segment
    blob = segcodec.encode(4096, 64, seg, seg * 3, np.linspace(0, 1, 300))
    rows.append((256, blob))
    return rows


@pytest.mark.parametrize("seed", range(5))
def test_many_rows_decode_as_each_row_does(seed: int) -> None:
    rows = _rows(random.Random(seed))
    at, steps, tokens, values = chunks.columns_of_rows(rows)
    for i, (chunk, blob) in enumerate(rows):
        want = chunks.decode_columns(chunk, blob)
        got = (steps[at == i], tokens[at == i], values[at == i])
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()
        assert got[2].tobytes() == want[2].tobytes()
    at2, steps2, values2 = chunks.steps_values(rows)
    assert at2.tolist() == at.tolist() and steps2.tolist() == steps.tolist()
    assert values2.tobytes() == values.tobytes()
