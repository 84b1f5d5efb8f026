"""LitGPT "packed dataset" token files (``LITPKDS``): the format ArchScale's pre-tokenized corpora use.

Byte layout of one file (all integers little-endian)::

    offset  size  field
    0       7     magic b"LITPKDS"
    7       8     version, uint64 (= 1)
    15      1     dtype code, uint8: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
                                    6 float32, 7 float64, 8 uint16
    16      8     chunk_size, uint64: the number of tokens in this file
    24      ...   chunk_size tokens of that dtype

A folder of such files holds ``train*.bin`` and optionally ``validation*.bin``; each file is one
chunk and the corpus is their concatenation in sorted name order. Files are read with
``numpy.memmap`` (no copy) after the header and the file size have been checked, so a truncated
or foreign file fails with a :class:`DataError` instead of yielding garbage tokens.
Our writer writes the exact token count of the last chunk (LitGPT's builder pads it with the
separator instead); readers take each file's own chunk_size, so both read the same way.
"""

from __future__ import annotations

import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hyperwatch.trainer.data.errors import DataError

MAGIC = b"LITPKDS"
VERSION = 1
HEADER = struct.Struct("<7sQBQ")  # magic, version, dtype code, chunk_size
HEADER_SIZE = HEADER.size  # 24 bytes

DTYPE_CODES: dict[int, np.dtype] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int8),
    3: np.dtype(np.int16),
    4: np.dtype(np.int32),
    5: np.dtype(np.int64),
    6: np.dtype(np.float32),
    7: np.dtype(np.float64),
    8: np.dtype(np.uint16),
}
CODE_OF_DTYPE: dict[np.dtype, int] = {dt: code for code, dt in DTYPE_CODES.items()}


@dataclass(frozen=True)
class PackedHeader:
    version: int
    dtype: np.dtype
    chunk_size: int


def token_dtype(vocab_size: int) -> np.dtype:
    """Storage dtype for token ids of a vocabulary: uint16 when every id fits, else int32."""
    if vocab_size <= 0:
        raise DataError(f"vocab_size {vocab_size}: must be positive")
    return np.dtype(np.uint16) if vocab_size <= 65535 else np.dtype(np.int32)


def read_header(path: str | Path) -> PackedHeader:
    """Parse and check a file's header and size; raise :class:`DataError` naming the file otherwise."""
    p = Path(path)
    try:
        size = p.stat().st_size
        with p.open("rb") as fh:
            raw = fh.read(HEADER_SIZE)
    except OSError as exc:
        raise DataError(f"{p}: cannot read the token file ({exc.strerror}); check the path and permissions") from exc
    if len(raw) < HEADER_SIZE:
        raise DataError(
            f"{p}: {len(raw)} bytes, shorter than the {HEADER_SIZE}-byte LITPKDS header; "
            "the file is truncated or not a packed token file: re-create it (hyperwatch data prepare)"
        )
    magic, version, code, chunk_size = HEADER.unpack(raw)
    if magic != MAGIC:
        raise DataError(
            f"{p}: starts with {magic!r}, not the LITPKDS magic {MAGIC!r}; this is not a LitGPT packed "
            "token file: point the data path at a folder of train*.bin files written by LitGPT or "
            "'hyperwatch data prepare'"
        )
    if version != VERSION:
        raise DataError(f"{p}: LITPKDS version {version} is not supported (only version {VERSION})")
    if code not in DTYPE_CODES:
        raise DataError(f"{p}: unknown dtype code {code} in the header (valid: {sorted(DTYPE_CODES)}); file corrupt")
    dtype = DTYPE_CODES[code]
    expected = HEADER_SIZE + chunk_size * dtype.itemsize
    if size != expected:
        what = "truncated" if size < expected else "longer than its header says (corrupt)"
        raise DataError(
            f"{p}: {what}: the header promises {chunk_size} {dtype.name} tokens, i.e. {expected} bytes, "
            f"but the file has {size} bytes; re-create or re-download the file"
        )
    return PackedHeader(version=version, dtype=dtype, chunk_size=chunk_size)


def read_packed(path: str | Path) -> np.ndarray:
    """The tokens of one LITPKDS file as a read-only 1-D memmap (an empty array for chunk_size 0)."""
    header = read_header(path)
    if header.dtype.kind == "f":
        raise DataError(
            f"{path}: stores {header.dtype.name} values, not integer token ids; "
            "the trainer reads integer token files only"
        )
    if header.chunk_size == 0:
        return np.zeros(0, dtype=header.dtype)
    return np.memmap(path, dtype=header.dtype, mode="r", offset=HEADER_SIZE, shape=(header.chunk_size,))


def write_packed(path: str | Path, tokens: np.ndarray, dtype: np.dtype | type = np.uint16) -> Path:
    """Write ``tokens`` as one LITPKDS file, atomically (temp file in the same folder, then rename).

    Values must fit ``dtype`` exactly; an id that would wrap around raises :class:`DataError`.
    """
    p = Path(path)
    dt = np.dtype(dtype)
    if dt not in CODE_OF_DTYPE:
        raise DataError(f"dtype {dt.name}: LITPKDS stores only {sorted(d.name for d in CODE_OF_DTYPE)}")
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise DataError(f"{p}: tokens must be a 1-D array, got shape {arr.shape}")
    if arr.size and dt.kind in "iu" and arr.dtype.kind in "iu":
        info = np.iinfo(dt)
        lo, hi = int(arr.min()), int(arr.max())
        if lo < info.min or hi > info.max:
            raise DataError(f"{p}: token ids span {lo}..{hi}, outside {dt.name}; write with a wider dtype (int32)")
    data = np.ascontiguousarray(arr, dtype=dt)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(HEADER.pack(MAGIC, VERSION, CODE_OF_DTYPE[dt], data.size))
            fh.write(data.tobytes(order="C"))
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def write_shards(
    out_dir: str | Path, prefix: str, tokens: np.ndarray, chunk_tokens: int, dtype: np.dtype | type
) -> list[Path]:
    """Split ``tokens`` into ``{prefix}_000.bin, {prefix}_001.bin, ...`` of ``chunk_tokens`` each
    (the last one shorter); an empty array still writes one empty file so the split exists."""
    if chunk_tokens <= 0:
        raise DataError(f"--chunk-tokens {chunk_tokens}: must be a positive number of tokens")
    out = Path(out_dir)
    n = int(tokens.shape[0])
    starts = range(0, max(n, 1), chunk_tokens)
    return [
        write_packed(out / f"{prefix}_{i:03d}.bin", tokens[s : s + chunk_tokens], dtype) for i, s in enumerate(starts)
    ]


def find_packed_files(folder: str | Path) -> tuple[list[Path], list[Path]]:
    """``(train files, validation files)`` of a packed folder, each sorted by name.

    A single ``.bin`` file path is accepted too: it is the training split.
    """
    p = Path(folder)
    if p.is_file():
        return [p], []
    if not p.is_dir():
        raise DataError(
            f"data path {str(folder)!r}: no such file or folder; for source 'packed' give a folder of "
            "train*.bin / validation*.bin files (hyperwatch data prepare --out DIR writes one)"
        )
    train = sorted(f for f in p.glob("train*.bin") if f.is_file())
    val = sorted(f for f in p.glob("validation*.bin") if f.is_file())
    if not train:
        raise DataError(
            f"{p}: no train*.bin files; a packed corpus folder holds train*.bin (and optionally "
            "validation*.bin) LITPKDS files, e.g. written by 'hyperwatch data prepare --out DIR'"
        )
    return train, val


def read_packed_files(files: list[Path]) -> np.ndarray:
    """Concatenate several files' tokens; one file stays a memmap (no copy)."""
    arrays = [read_packed(f) for f in files]
    if len(arrays) == 1:
        return arrays[0]
    return np.concatenate(arrays)  # mixed dtypes promote to a common one (numpy's rule)
