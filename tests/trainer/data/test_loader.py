"""TokenLoader and iter_eval_batches: shapes, determinism, exact resume, rank disjointness, errors.

The token array is ``arange`` so a token's value is its position: a window's content shows where
it was cut from.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hyperwatch.trainer.data import TokenLoader, iter_eval_batches
from hyperwatch.trainer.data.errors import DataError

TOKENS = np.arange(10_000, dtype=np.int64)


def test_batch_shapes_dtype_and_shift() -> None:
    loader = TokenLoader(TOKENS.astype(np.uint16), seq_len=16, micro_batch=4, seed=0)
    x, y = loader.next_batch()
    assert x.shape == y.shape == (4, 16)
    assert x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(y - x, torch.ones_like(x))  # consecutive positions: contiguous windows


def test_same_seed_same_batches_other_seed_other_batches() -> None:
    a = TokenLoader(TOKENS, 8, 4, seed=1)
    b = TokenLoader(TOKENS, 8, 4, seed=1)
    c = TokenLoader(TOKENS, 8, 4, seed=2)
    batches_a = [a.next_batch()[0] for _ in range(5)]
    batches_b = [b.next_batch()[0] for _ in range(5)]
    batches_c = [c.next_batch()[0] for _ in range(5)]
    assert all(torch.equal(p, q) for p, q in zip(batches_a, batches_b))
    assert not all(torch.equal(p, q) for p, q in zip(batches_a, batches_c))
    assert len({tuple(b[:, 0].tolist()) for b in batches_a}) == 5  # successive batches differ


def test_exact_resume_mid_stream() -> None:
    reference = TokenLoader(TOKENS, 8, 4, seed=3)
    expected = [reference.next_batch() for _ in range(10)]

    first = TokenLoader(TOKENS, 8, 4, seed=3)
    for _ in range(6):
        first.next_batch()
    state = first.state_dict()
    assert state["step"] == 6

    resumed = TokenLoader(TOKENS, 8, 4, seed=3)
    resumed.load_state_dict(state)
    for x_exp, y_exp in expected[6:]:
        x, y = resumed.next_batch()
        assert torch.equal(x, x_exp) and torch.equal(y, y_exp)


def test_state_from_a_different_setup_is_refused() -> None:
    state = TokenLoader(TOKENS, 8, 4, seed=3).state_dict()
    with pytest.raises(DataError, match="seq_len is 8 in the checkpoint but 16 now"):
        TokenLoader(TOKENS, 16, 4, seed=3).load_state_dict(state)
    with pytest.raises(DataError, match="n_tokens is 10000 in the checkpoint but 5000 now"):
        TokenLoader(TOKENS[:5000], 8, 4, seed=3).load_state_dict(state)
    with pytest.raises(DataError, match="expected a dict with version 1"):
        TokenLoader(TOKENS, 8, 4, seed=3).load_state_dict({"step": 1})
    with pytest.raises(DataError, match="step -1"):
        TokenLoader(TOKENS, 8, 4, seed=3).load_state_dict({**state, "step": -1})


def test_ranks_read_disjoint_parts_and_cover_the_data() -> None:
    world = 4
    seen: list[set[int]] = []
    for rank in range(world):
        loader = TokenLoader(TOKENS, 32, 8, seed=0, rank=rank, world_size=world)
        positions: set[int] = set()
        for _ in range(50):
            x, y = loader.next_batch()
            positions.update(x.flatten().tolist())
            positions.update(y.flatten().tolist())
        lo, hi = rank * 2500, (rank + 1) * 2500
        assert min(positions) >= lo and max(positions) < hi  # never crosses into a neighbour's part
        seen.append(positions)
    for i in range(world):
        for j in range(i + 1, world):
            assert not seen[i] & seen[j]
    assert len(set().union(*seen)) > 0.9 * TOKENS.size  # the union covers nearly all the data


def test_window_can_reach_the_last_token_of_a_part() -> None:
    loader = TokenLoader(np.arange(10), seq_len=8, micro_batch=64, seed=0)
    x, y = loader.next_batch()
    starts = set(x[:, 0].tolist())
    assert starts == {0, 1}  # 10 tokens hold exactly two windows of 9
    assert int(y.max()) == 9


def test_loader_argument_errors() -> None:
    with pytest.raises(DataError, match="rank 0's part holds 5 tokens"):
        TokenLoader(TOKENS[:10], 8, 2, seed=0, rank=0, world_size=2)
    with pytest.raises(DataError, match="rank 2"):
        TokenLoader(TOKENS, 8, 2, seed=0, rank=2, world_size=2)
    with pytest.raises(DataError, match="seq_len 0"):
        TokenLoader(TOKENS, 0, 2, seed=0)
    with pytest.raises(DataError, match="seed -1"):
        TokenLoader(TOKENS, 8, 2, seed=-1)
    with pytest.raises(DataError, match="1-D integer numpy array"):
        TokenLoader(TOKENS.astype(np.float32), 8, 2, seed=0)


def test_eval_batches_fixed_disjoint_and_equal_per_rank() -> None:
    val = np.arange(1_000, dtype=np.int64)
    first = list(iter_eval_batches(val, 10, 4, max_batches=100))
    again = list(iter_eval_batches(val, 10, 4, max_batches=100))
    assert len(first) == 24  # 99 windows // 4 per batch
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(first, again))
    for x, y in first:
        assert x.shape == (4, 10) and torch.equal(x[:, 1:], y[:, :-1])

    per_rank = [list(iter_eval_batches(val, 10, 4, max_batches=100, rank=r, world_size=3)) for r in range(3)]
    assert {len(b) for b in per_rank} == {8}  # 99 windows // 3 ranks // 4
    starts = [set(int(s) for x, _ in batches for s in x[:, 0]) for batches in per_rank]
    assert not (starts[0] & starts[1]) and not (starts[1] & starts[2]) and not (starts[0] & starts[2])
    assert all(s % 10 == 0 for st in starts for s in st)  # non-overlapping window grid


def test_eval_batches_spread_over_the_whole_split_when_capped() -> None:
    val = np.arange(1_000, dtype=np.int64)
    batches = list(iter_eval_batches(val, 10, 2, max_batches=2))
    starts = [int(s) for x, _ in batches for s in x[:, 0]]
    assert len(starts) == 4 and starts == sorted(starts)
    assert starts[0] == 0 and starts[-1] >= 700  # not just the first few windows


def test_eval_batches_too_few_tokens() -> None:
    with pytest.raises(DataError, match=r"validation tokens: 30 held-out tokens give 2 windows.*raise val_fraction"):
        list(iter_eval_batches(np.arange(30), 14, 4, max_batches=2))
