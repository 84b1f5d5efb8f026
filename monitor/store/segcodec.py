"""The codec of a *segment*: a sealed range of up to ``SEGMENT_STEPS`` steps of one series in one
``metric_chunks`` row, compressed (issue 36; why and how it is measured: ``bench/README_storage.md``).

A segment row's key is the first chunk of its aligned range, ``chunk = s * SEGMENT_CHUNKS``; it
covers ``span`` chunks of 16 steps from there (``span = SEGMENT_CHUNKS`` once the whole range is
sealed, fewer for the open range of a series packed early: :mod:`monitor.store.segments`). The blob,
version 3 (written since revision 0022; little-endian, ``uv`` an unsigned LEB128 varint, ``sv`` a
zigzag one)::

    u8 version | u8 flags | uv span | uv n | 2 bytes: pcodec's file header | steps | tokens | values

- steps (offsets from the range's first step, ``chunk * CHUNK_STEPS``): ``REGULAR`` (``first +
  stride * i``, what a fixed logging rhythm gives): uv first, uv stride; otherwise uv length and
  the offsets as int64 by pcodec (``ModeSpec.classic()``: the auto mode can cost ~15x on strides);
- tokens: ``TOK_NONE`` (all NULL): nothing; ``TOK_LINEAR`` (``t0 + dt * (step - first step)``): sv t0,
  sv dt; otherwise uv length and the tokens as int64 by pcodec, with ``TOK_MASK`` (some NULL) a bitmap
  of ceil(n / 8) bytes first (set = NULL, the token there stored as 0);
- values: the rest of the blob, float64 by pcodec's default chunk config (it finds float32-valued
  doubles by itself), NaN and +-Inf as themselves: bit for bit what was stored. The store's NaN <->
  NULL mapping is applied by the readers (:mod:`monitor.store.chunks`), as for version 1.

Each pcodec column is its *wrapped* form (chunk metadata and one page; the count is ``n``), which
leaves out what the standalone form repeats per column (its magic, version, type and count: 15-16
bytes); the file header is kept once per blob, so a later pcodec reads it. Version 2 (revisions
0014-0021) has the same parts at fixed widths (u16 span, u32 count, u32 first step and stride, i64
t0 and dt, u32 column lengths) and each column in pcodec's standalone form; it is still read, and
written by the revisions before 0022 (:func:`writing`). On the real-hooks fixture of
``bench/storage.py`` (50-point series) version 3 is ~35 bytes a series shorter: ~19 of header, ~16 of
pcodec's standalone framing. :data:`_FILE` is shared: pcodec's compressors hold no state between
calls.

pcodec's compression level 4: on the issue's workload 4.41 B/pt for values at ~0.06 s per million
points, against 4.40 at the default level 8 and ~0.16 s (measured while building this module).
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator

import numpy as np
from pcodec import ChunkConfig, ModeSpec, wrapped
from pcodec import standalone as pco

from hyperwatch.hooks.columns import NULL_INT

V2, V3 = 2, 3
VERSION = V3  # what the store writes
SEGMENT_VERSIONS = (V2, V3)
REGULAR, TOK_NONE, TOK_LINEAR, TOK_MASK = 1, 2, 4, 8
LEVEL = 4
_HEAD = struct.Struct("<BBHI")
_U32 = struct.Struct("<I")
_PAIR32 = struct.Struct("<II")
_LINEAR = struct.Struct("<qq")
_VALUES = ChunkConfig(compression_level=LEVEL)
_INTS = ChunkConfig(compression_level=LEVEL, mode_spec=ModeSpec.classic())
_TOKENS_MAX = 2**58  # linear tokens checked in int64 without overflow
_writing = [VERSION]


@contextlib.contextmanager
def writing(version: int) -> Iterator[None]:
    """Blobs of ``version`` from :func:`encode` inside (a revision before 0022 writes version 2)."""
    if version not in SEGMENT_VERSIONS:
        raise ValueError(f"version: one of {SEGMENT_VERSIONS}, got {version}")
    _writing.append(version)
    try:
        yield
    finally:
        _writing.pop()


def is_segment(blob: bytes) -> bool:
    """Whether a chunk row's blob is a segment (either version), not a 16-step chunk (version 1)."""
    return blob[0] in SEGMENT_VERSIONS


def encode(
    base: int, span: int, steps: np.ndarray, tokens: np.ndarray, values: np.ndarray, version: int | None = None
) -> bytes:
    """The blob of step-sorted, distinct points (``tokens``: NULL_INT for none; ``values``: NaN for NULL)
    of the segment whose first step is ``base`` and that covers ``span`` chunks; ``version``: the
    format, by default the one in force (:func:`writing`)."""
    version = _writing[-1] if version is None else version
    if version not in SEGMENT_VERSIONS:
        raise ValueError(f"version: one of {SEGMENT_VERSIONS}, got {version}")
    n = len(steps)
    if n == 0:
        raise ValueError("points: a segment holds at least 1 point")
    off = np.asarray(steps, dtype=np.int64) - base
    if off[0] < 0 or off[-1] >= 2**32:
        raise ValueError(f"points: steps {steps[0]}..{steps[-1]} lie outside the segment at step {base}")
    v3 = version == V3
    flags = 0
    parts: list[bytes] = []
    stride = int(off[1] - off[0]) if n > 1 else 0
    if n == 1 or (stride > 0 and stride < 2**32 and bool(np.all(np.diff(off) == stride))):
        flags |= REGULAR
        parts.append(_uv(int(off[0])) + _uv(stride) if v3 else _PAIR32.pack(int(off[0]), stride))
    else:
        parts.append(_column(off, _INTS, v3))
    tok = np.asarray(tokens, dtype=np.int64)
    null = tok == NULL_INT
    if null.all():
        flags |= TOK_NONE
    elif not null.any() and (linear := _linear(off, tok)) is not None:
        flags |= TOK_LINEAR
        parts.append(_sv(linear[0]) + _sv(linear[1]) if v3 else _LINEAR.pack(*linear))
    else:
        if null.any():
            flags |= TOK_MASK
            parts.append(np.packbits(null, bitorder="little").tobytes())
            tok = np.where(null, 0, tok)
        parts.append(_column(tok, _INTS, v3))
    vals = np.ascontiguousarray(values, dtype=np.float64)
    if not v3:
        return _HEAD.pack(V2, flags, span, n) + b"".join(parts) + pco.simple_compress(vals, _VALUES)
    head = bytes((V3, flags)) + _uv(span) + _uv(n) + _FILE.write_header()
    return head + b"".join(parts) + _wrapped(vals, _VALUES)


_FILE = wrapped.FileCompressor()


def _wrapped(column: np.ndarray, config: ChunkConfig) -> bytes:
    """A column's chunk metadata and its one page (a segment's at most 1,024 points are one page)."""
    chunk = _FILE.chunk_compressor(column, config)
    if len(chunk.n_per_page()) != 1:
        raise ValueError(f"points: {len(column)} points do not fit one pcodec page")
    return chunk.write_meta() + chunk.write_page(0)


def _column(column: np.ndarray, config: ChunkConfig, v3: bool) -> bytes:
    """An int64 column with its length first (uv in version 3, u32 in version 2)."""
    if v3:
        data = _wrapped(np.ascontiguousarray(column, dtype=np.int64), config)
        return _uv(len(data)) + data
    return _blob(pco.simple_compress(column, config))


def _uv(x: int) -> bytes:
    out = bytearray()
    while True:
        byte, x = x & 0x7F, x >> 7
        if not x:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def _sv(x: int) -> bytes:
    return _uv(x * 2 if x >= 0 else -x * 2 - 1)


def _read_uv(blob: bytes, pos: int) -> tuple[int, int]:
    x = shift = 0
    while True:
        byte = blob[pos]
        pos += 1
        x |= (byte & 0x7F) << shift
        if byte < 0x80:
            return x, pos
        shift += 7


def _read_sv(blob: bytes, pos: int) -> tuple[int, int]:
    z, pos = _read_uv(blob, pos)
    return (z >> 1) ^ -(z & 1), pos


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


def span(blob: bytes) -> int:
    """The chunks of 16 steps a segment blob covers from its row's ``chunk`` (its first 8 bytes suffice)."""
    if blob[0] == V3:
        return _read_uv(blob, 2)[0]
    return int(_HEAD.unpack_from(blob, 0)[2])


class _Reader:
    """A segment blob's parts, read in order: the header at construction, then :meth:`steps`,
    :meth:`tokens` (or :meth:`skip_tokens`) and :meth:`values`."""

    def __init__(self, blob: bytes) -> None:
        self.blob, ver = blob, blob[0]
        if ver == V3:
            self.flags = blob[1]
            _span, pos = _read_uv(blob, 2)
            self.n, pos = _read_uv(blob, pos)
            self.file, used = wrapped.FileDecompressor.new(blob[pos:])
            self.pos = pos + used
        elif ver == V2:
            _ver, self.flags, _span, self.n = _HEAD.unpack_from(blob, 0)
            self.pos = _HEAD.size
        else:
            raise ValueError(f"metric_chunks.data: not a segment (format version {ver})")
        self.v3 = ver == V3

    def steps(self, base: int) -> np.ndarray:
        blob, n = self.blob, self.n
        if self.flags & REGULAR:
            if self.v3:
                first, pos = _read_uv(blob, self.pos)
                stride, self.pos = _read_uv(blob, pos)
            else:
                first, stride = _PAIR32.unpack_from(blob, self.pos)
                self.pos += _PAIR32.size
            return base + first + stride * np.arange(n, dtype=np.int64)
        return base + self._int_column()

    def tokens(self, steps: np.ndarray) -> np.ndarray:
        flags, n = self.flags, self.n
        if flags & TOK_NONE:
            return np.full(n, NULL_INT, dtype=np.int64)
        if flags & TOK_LINEAR:
            t0, dt = self._linear()
            return t0 + dt * (steps - steps[0])
        null = None
        if flags & TOK_MASK:
            size = -(-n // 8)
            null = np.unpackbits(np.frombuffer(self.blob, np.uint8, size, self.pos), count=n, bitorder="little")
            self.pos += size
        tokens = self._int_column()
        return tokens if null is None else np.where(null.astype(bool), NULL_INT, tokens)

    def skip_tokens(self) -> None:
        flags = self.flags
        if flags & TOK_LINEAR:
            self._linear()
        elif not flags & TOK_NONE:
            if flags & TOK_MASK:
                self.pos += -(-self.n // 8)
            self._column_bytes()

    def values(self) -> np.ndarray:
        rest = self.blob[self.pos :]
        return self._decompress(rest, "f64") if self.v3 else pco.simple_decompress(rest)

    def _linear(self) -> tuple[int, int]:
        if not self.v3:
            pair = _LINEAR.unpack_from(self.blob, self.pos)
            self.pos += _LINEAR.size
            return int(pair[0]), int(pair[1])
        t0, pos = _read_sv(self.blob, self.pos)
        dt, self.pos = _read_sv(self.blob, pos)
        return t0, dt

    def _column_bytes(self) -> bytes:
        """A length-prefixed column's bytes (u32 in version 2, uv in version 3); the reader moves past them."""
        if self.v3:
            size, pos = _read_uv(self.blob, self.pos)
        else:
            size, pos = _U32.unpack_from(self.blob, self.pos)[0], self.pos + _U32.size
        self.pos = pos + size
        return self.blob[pos : pos + size]

    def _int_column(self) -> np.ndarray:
        data = self._column_bytes()
        return self._decompress(data, "i64") if self.v3 else pco.simple_decompress(data).astype(np.int64)

    def _decompress(self, data: bytes, dtype: str) -> np.ndarray:
        chunk, used = self.file.chunk_decompressor(data, dtype)
        out = np.empty(self.n, dtype=np.float64 if dtype == "f64" else np.int64)
        chunk.read_page_into(data[used:], self.n, out)
        return out


def decode(base: int, blob: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, tokens with NULL_INT for none, values with NaN) of a segment blob whose first step is ``base``."""
    read = _Reader(blob)
    steps = read.steps(base)
    tokens = read.tokens(steps)
    return steps.astype(np.int64), tokens.astype(np.int64), read.values()


def decode_steps_values(base: int, blob: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values with NaN) of a segment blob, its tokens skipped (not decompressed): what the
    readers of values alone need (:mod:`monitor.store.matrix`)."""
    read = _Reader(blob)
    steps = read.steps(base)
    read.skip_tokens()
    return steps.astype(np.int64), read.values()
