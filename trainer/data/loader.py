"""Batches of token windows for training (random, resumable) and evaluation (fixed).

Training: :class:`TokenLoader` draws ``micro_batch`` windows of ``seq_len + 1`` tokens at uniform
random offsets; ``x`` is a window's first ``seq_len`` tokens and ``y`` the same shifted by one.
Under data parallelism the token array is cut into ``world_size`` contiguous, disjoint parts and
rank ``r`` draws only inside part ``r`` (each rank reads its own part; no window crosses parts).
The randomness of batch ``k`` comes from a fresh ``numpy.random.Generator`` seeded by
``SeedSequence([seed, rank, k])``, so the loader's whole state is the counter ``k``: saving it and
loading it reproduces the following batches exactly, and ranks draw independent streams.

Evaluation: :func:`iter_eval_batches` yields the same held-out windows every time it is called:
non-overlapping windows spread evenly over the whole split, dealt round-robin to the ranks, and
every rank gets the same number of full batches (so an all-reduced mean is well defined).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from hyperwatch.trainer.data.errors import DataError

STATE_VERSION = 1


def _check_common(tokens: np.ndarray, seq_len: int, micro_batch: int, rank: int, world_size: int) -> None:
    if not isinstance(tokens, np.ndarray) or tokens.ndim != 1 or tokens.dtype.kind not in "iu":
        raise DataError(
            "tokens: expected a 1-D integer numpy array (e.g. Corpus.train), got "
            f"{type(tokens).__name__} {getattr(tokens, 'dtype', '')} {getattr(tokens, 'shape', '')}"
        )
    for name, value, low in (
        ("seq_len", seq_len, 1),
        ("micro_batch", micro_batch, 1),
        ("world_size", world_size, 1),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise DataError(f"{name} {value!r}: must be an integer >= {low}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise DataError(f"rank {rank!r}: must be an integer in [0, world_size={world_size})")


def _to_xy(windows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    w = np.asarray(windows, dtype=np.int64)
    x = torch.from_numpy(np.ascontiguousarray(w[:, :-1]))
    y = torch.from_numpy(np.ascontiguousarray(w[:, 1:]))
    return x, y


class TokenLoader:
    """Deterministic random windows of ``seq_len + 1`` tokens from this rank's part of ``tokens``."""

    def __init__(
        self,
        tokens: np.ndarray,
        seq_len: int,
        micro_batch: int,
        *,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        _check_common(tokens, seq_len, micro_batch, rank, world_size)
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise DataError(f"seed {seed!r}: must be a non-negative integer")
        n = int(tokens.shape[0])
        self.lo = rank * n // world_size
        self.hi = (rank + 1) * n // world_size
        if self.hi - self.lo < seq_len + 1:
            raise DataError(
                f"training tokens: rank {rank}'s part holds {self.hi - self.lo} tokens ({n} in all over "
                f"{world_size} ranks) but one window needs seq_len + 1 = {seq_len + 1}; use more data "
                "(raise max_bytes) or a shorter seq_len"
            )
        self.tokens = tokens
        self.seq_len = seq_len
        self.micro_batch = micro_batch
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.step = 0  # batches drawn so far: the whole mutable state
        self._arange = np.arange(seq_len + 1)

    def offsets(self, step: int) -> np.ndarray:
        """Start offsets (into ``tokens``) of batch number ``step``'s windows; pure, no state change."""
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, self.rank, step]))
        return self.lo + rng.integers(0, self.hi - self.lo - self.seq_len, size=self.micro_batch)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)``, both ``(micro_batch, seq_len)`` int64 on the CPU; ``y[:, t] == x[:, t + 1]``."""
        starts = self.offsets(self.step)
        self.step += 1
        return _to_xy(self.tokens[starts[:, None] + self._arange])  # (B, T+1)

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "step": self.step,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "seq_len": self.seq_len,
            "micro_batch": self.micro_batch,
            "n_tokens": int(self.tokens.shape[0]),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where the saved loader stopped; the data and settings must be the same."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise DataError(
                f"loader state: expected a dict with version {STATE_VERSION} from TokenLoader.state_dict(), "
                f"got {type(state).__name__}"
            )
        mine = self.state_dict()
        for key in ("seed", "rank", "world_size", "seq_len", "micro_batch", "n_tokens"):
            if state.get(key) != mine[key]:
                raise DataError(
                    f"loader state: {key} is {state.get(key)!r} in the checkpoint but {mine[key]!r} now; "
                    "an exact resume needs the same corpus, seed, seq_len, micro_batch and number of ranks"
                )
        step = state.get("step")
        if not isinstance(step, int) or step < 0:
            raise DataError(f"loader state: step {step!r} must be a non-negative integer")
        self.step = step


def iter_eval_batches(
    tokens: np.ndarray,
    seq_len: int,
    micro_batch: int,
    max_batches: int,
    rank: int = 0,
    world_size: int = 1,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed held-out batches: ``min(max_batches, what the split allows)`` full batches per rank.

    The same on every call and every rank count's ranks get equally many batches; raises
    :class:`DataError` when the split cannot give each rank one full batch.
    """
    _check_common(tokens, seq_len, micro_batch, rank, world_size)
    if not isinstance(max_batches, int) or max_batches < 1:
        raise DataError(f"max_batches {max_batches!r}: must be an integer >= 1")
    n = int(tokens.shape[0])
    available = max(0, (n - 1) // seq_len)  # window i starts at i * seq_len and spans seq_len + 1 tokens
    n_batches = min(max_batches, available // world_size // micro_batch)
    if n_batches == 0:
        need = world_size * micro_batch * seq_len + 1
        raise DataError(
            f"validation tokens: {n} held-out tokens give {available} windows of {seq_len + 1} tokens, "
            f"fewer than world_size * micro_batch = {world_size * micro_batch}; need at least {need} tokens: "
            "raise val_fraction or max_bytes, or lower seq_len or micro_batch"
        )
    total = n_batches * micro_batch * world_size
    chosen = (np.arange(total) * available) // total  # strictly increasing: distinct windows, evenly spread
    mine = chosen[rank::world_size] * seq_len
    arange = np.arange(seq_len + 1)
    for b in range(n_batches):
        starts = mine[b * micro_batch : (b + 1) * micro_batch]
        yield _to_xy(tokens[starts[:, None] + arange])
