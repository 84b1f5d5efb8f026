"""The codec of a *segment*: a sealed range of up to ``SEGMENT_STEPS`` steps of one series in one
``metric_chunks`` row, compressed (issue 36; why and how it is measured: ``bench/README_storage.md``).

A segment row's key is the first chunk of its aligned range, ``chunk = s * SEGMENT_CHUNKS``; it
covers ``span`` chunks of 16 steps from there (``span = SEGMENT_CHUNKS`` once the whole range is
sealed, fewer for the open range of a series packed early: :mod:`monitor.store.segments`). The blob,
little-endian, version 2::

    u8 version | u8 flags | u16 span | u32 n | steps | tokens | values

- steps (offsets from the range's first step, ``chunk * CHUNK_STEPS``): ``REGULAR`` (``first +
  stride * i``, what a fixed logging rhythm gives): u32 first, u32 stride; otherwise u32 length and
  the offsets as int64 by pcodec (``ModeSpec.classic()``: the auto mode can cost ~15x on strides);
- tokens: ``TOK_NONE`` (all NULL): nothing; ``TOK_LINEAR`` (``t0 + dt * (step - first step)``): i64
  t0, i64 dt; otherwise u32 length and the tokens as int64 by pcodec, with ``TOK_MASK`` (some NULL)
  a bitmap of ceil(n / 8) bytes first (set = NULL, the token there stored as 0);
- values: the rest of the blob, float64 by pcodec's default chunk config (it finds float32-valued
  doubles by itself), NaN and +-Inf as themselves: bit for bit what was stored. The store's NaN <->
  NULL mapping is applied by the readers (:mod:`monitor.store.chunks`), as for version 1.

pcodec's compression level 4: on the issue's workload 4.41 B/pt for values at ~0.06 s per million
points, against 4.40 at the default level 8 and ~0.16 s (measured while building this module).
"""

from __future__ import annotations

import struct

import numpy as np
from pcodec import ChunkConfig, ModeSpec
from pcodec import standalone as pco

from hyperwatch.hooks.columns import NULL_INT

VERSION = 2
REGULAR, TOK_NONE, TOK_LINEAR, TOK_MASK = 1, 2, 4, 8
LEVEL = 4
_HEAD = struct.Struct("<BBHI")
_U32 = struct.Struct("<I")
_PAIR32 = struct.Struct("<II")
_LINEAR = struct.Struct("<qq")
_VALUES = ChunkConfig(compression_level=LEVEL)
_INTS = ChunkConfig(compression_level=LEVEL, mode_spec=ModeSpec.classic())
_TOKENS_MAX = 2**58  # linear tokens checked in int64 without overflow


def encode(base: int, span: int, steps: np.ndarray, tokens: np.ndarray, values: np.ndarray) -> bytes:
    """The blob of step-sorted, distinct points (``tokens``: NULL_INT for none; ``values``: NaN for NULL)
    of the segment whose first step is ``base`` and that covers ``span`` chunks."""
    n = len(steps)
    if n == 0:
        raise ValueError("points: a segment holds at least 1 point")
    off = np.asarray(steps, dtype=np.int64) - base
    if off[0] < 0 or off[-1] >= 2**32:
        raise ValueError(f"points: steps {steps[0]}..{steps[-1]} lie outside the segment at step {base}")
    flags = 0
    parts: list[bytes] = []
    stride = int(off[1] - off[0]) if n > 1 else 0
    if n == 1 or (stride > 0 and stride < 2**32 and bool(np.all(np.diff(off) == stride))):
        flags |= REGULAR
        parts.append(_PAIR32.pack(int(off[0]), stride))
    else:
        parts.append(_blob(pco.simple_compress(off, _INTS)))
    tok = np.asarray(tokens, dtype=np.int64)
    null = tok == NULL_INT
    if null.all():
        flags |= TOK_NONE
    elif not null.any() and (linear := _linear(off, tok)) is not None:
        flags |= TOK_LINEAR
        parts.append(_LINEAR.pack(*linear))
    else:
        if null.any():
            flags |= TOK_MASK
            parts.append(np.packbits(null, bitorder="little").tobytes())
            tok = np.where(null, 0, tok)
        parts.append(_blob(pco.simple_compress(tok, _INTS)))
    parts.append(pco.simple_compress(np.ascontiguousarray(values, dtype=np.float64), _VALUES))
    return _HEAD.pack(VERSION, flags, span, n) + b"".join(parts)


def _blob(data: bytes) -> bytes:
    return _U32.pack(len(data)) + data


def _linear(off: np.ndarray, tok: np.ndarray) -> tuple[int, int] | None:
    t0 = int(tok[0])
    if len(tok) == 1:
        return t0, 0
    if np.abs(tok).max() >= _TOKENS_MAX:
        return None
    dt, rest = divmod(int(tok[1]) - t0, int(off[1] - off[0]))
    if rest or abs(dt) >= _TOKENS_MAX // max(int(off[-1] - off[0]), 1):
        return None
    if bool(np.all(tok == t0 + dt * (off - off[0]))):
        return t0, dt
    return None


def version(blob: bytes) -> int:
    return blob[0]


def span(blob: bytes) -> int:
    """The chunks of 16 steps a version-2 blob covers from its row's ``chunk``."""
    return int(_HEAD.unpack_from(blob, 0)[2])


def _steps(base: int, blob: bytes) -> tuple[int, int, np.ndarray, int]:
    """(flags, points, steps as int64, offset of the tokens' part) of a version-2 blob."""
    ver, flags, _span, n = _HEAD.unpack_from(blob, 0)
    if ver != VERSION:
        raise ValueError(f"metric_chunks.data: not a segment (format version {ver})")
    pos = _HEAD.size
    if flags & REGULAR:
        first, stride = _PAIR32.unpack_from(blob, pos)
        return flags, n, base + first + stride * np.arange(n, dtype=np.int64), pos + _PAIR32.size
    raw, pos = _take(blob, pos)
    return flags, n, base + pco.simple_decompress(raw).astype(np.int64), pos


def decode(base: int, blob: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, tokens with NULL_INT for none, values with NaN) of a version-2 blob whose first step is ``base``."""
    flags, n, steps, pos = _steps(base, blob)
    if flags & TOK_NONE:
        tokens = np.full(n, NULL_INT, dtype=np.int64)
    elif flags & TOK_LINEAR:
        t0, dt = _LINEAR.unpack_from(blob, pos)
        pos += _LINEAR.size
        tokens = t0 + dt * (steps - steps[0])
    else:
        null = None
        if flags & TOK_MASK:
            size = -(-n // 8)
            null = np.unpackbits(np.frombuffer(blob, np.uint8, size, pos), count=n, bitorder="little").astype(bool)
            pos += size
        raw, pos = _take(blob, pos)
        tokens = pco.simple_decompress(raw)
        if null is not None:
            tokens = np.where(null, NULL_INT, tokens)
    values = pco.simple_decompress(blob[pos:])
    return steps.astype(np.int64), tokens.astype(np.int64), values


def decode_steps_values(base: int, blob: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values with NaN) of a version-2 blob, its tokens skipped (not decompressed): what the
    readers of values alone need (:mod:`monitor.store.matrix`)."""
    flags, n, steps, pos = _steps(base, blob)
    if flags & TOK_LINEAR:
        pos += _LINEAR.size
    elif not flags & TOK_NONE:
        if flags & TOK_MASK:
            pos += -(-n // 8)
        pos += _U32.size + _U32.unpack_from(blob, pos)[0]
    return steps.astype(np.int64), pco.simple_decompress(blob[pos:])


def _take(blob: bytes, pos: int) -> tuple[bytes, int]:
    size = _U32.unpack_from(blob, pos)[0]
    pos += _U32.size
    return blob[pos : pos + size], pos + size
