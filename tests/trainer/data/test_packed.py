"""LitGPT LITPKDS token files: byte layout, round trip, and every way a file can be broken."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from hyperwatch.trainer.data.errors import DataError
from hyperwatch.trainer.data.packed import (
    HEADER_SIZE,
    find_packed_files,
    read_header,
    read_packed,
    read_packed_files,
    token_dtype,
    write_packed,
    write_shards,
)


def litpkds_bytes(tokens: np.ndarray, code: int, chunk_size: int | None = None, version: int = 1) -> bytes:
    """The layout written out by hand (independently of trainer.packed), as LitGPT's builder does."""
    n = tokens.size if chunk_size is None else chunk_size
    return b"LITPKDS" + version.to_bytes(8, "little") + bytes([code]) + n.to_bytes(8, "little") + tokens.tobytes()


def test_header_is_24_bytes_and_matches_the_hand_written_layout(tmp_path: Path) -> None:
    tokens = np.array([5, 0, 65535, 7], dtype=np.uint16)
    written = write_packed(tmp_path / "train_000.bin", tokens, np.uint16)
    assert HEADER_SIZE == 24
    assert written.read_bytes() == litpkds_bytes(tokens, code=8)


@pytest.mark.parametrize(
    ("dtype", "code"),
    [(np.uint8, 1), (np.int8, 2), (np.int16, 3), (np.int32, 4), (np.int64, 5), (np.uint16, 8)],
)
def test_reads_hand_written_files_of_each_integer_dtype(tmp_path: Path, dtype: type, code: int) -> None:
    tokens: np.ndarray = np.arange(0, 100, 3).astype(dtype)
    f = tmp_path / "train.bin"
    f.write_bytes(litpkds_bytes(tokens, code))
    header = read_header(f)
    assert (header.version, header.dtype, header.chunk_size) == (1, np.dtype(dtype), tokens.size)
    got = read_packed(f)
    assert isinstance(got, np.memmap)
    np.testing.assert_array_equal(got, tokens)


def test_round_trip_int32_for_large_vocabularies(tmp_path: Path) -> None:
    assert token_dtype(300) == np.uint16
    assert token_dtype(65535) == np.uint16
    assert token_dtype(100_000) == np.int32
    tokens = np.array([0, 70_000, 99_999], dtype=np.int64)
    np.testing.assert_array_equal(read_packed(write_packed(tmp_path / "a.bin", tokens, np.int32)), tokens)


def test_truncated_file_names_file_and_byte_counts(tmp_path: Path) -> None:
    f = tmp_path / "train_003.bin"
    data = litpkds_bytes(np.arange(10, dtype=np.uint16), code=8)
    f.write_bytes(data[:-3])
    with pytest.raises(DataError) as err:
        read_packed(f)
    msg = str(err.value)
    assert "train_003.bin" in msg and "truncated" in msg
    assert str(HEADER_SIZE + 20) in msg and str(HEADER_SIZE + 17) in msg


def test_file_longer_than_its_header_is_rejected(tmp_path: Path) -> None:
    f = tmp_path / "train.bin"
    f.write_bytes(litpkds_bytes(np.arange(10, dtype=np.uint16), code=8, chunk_size=8))
    with pytest.raises(DataError, match=r"longer than its header says.*\b40 bytes\b.*\b44 bytes"):
        read_packed(f)


def test_shorter_than_header(tmp_path: Path) -> None:
    f = tmp_path / "train.bin"
    f.write_bytes(b"LITPK")
    with pytest.raises(DataError, match=r"train\.bin: 5 bytes, shorter than the 24-byte LITPKDS header"):
        read_packed(f)


def test_wrong_magic(tmp_path: Path) -> None:
    f = tmp_path / "train.bin"
    f.write_bytes(b"NOTPKDS" + bytes(17))
    with pytest.raises(DataError, match="not the LITPKDS magic"):
        read_packed(f)


def test_unsupported_version(tmp_path: Path) -> None:
    f = tmp_path / "train.bin"
    f.write_bytes(litpkds_bytes(np.arange(4, dtype=np.uint16), code=8, version=2))
    with pytest.raises(DataError, match="version 2 is not supported"):
        read_packed(f)


def test_unknown_dtype_code(tmp_path: Path) -> None:
    f = tmp_path / "train.bin"
    f.write_bytes(litpkds_bytes(np.arange(4, dtype=np.uint16), code=9))
    with pytest.raises(DataError, match="unknown dtype code 9"):
        read_packed(f)


def test_float_tokens_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "train.bin"
    f.write_bytes(litpkds_bytes(np.ones(4, dtype=np.float32), code=6))
    assert read_header(f).dtype == np.float32
    with pytest.raises(DataError, match="not integer token ids"):
        read_packed(f)


def test_write_refuses_ids_that_would_wrap(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"span 0\.\.70000, outside uint16"):
        write_packed(tmp_path / "x.bin", np.array([0, 70_000]), np.uint16)
    assert not list(tmp_path.iterdir())  # nothing half-written left behind


def test_header_struct_agrees_with_litgpt_field_order(tmp_path: Path) -> None:
    f = write_packed(tmp_path / "x.bin", np.arange(3), np.int64)
    magic, version, code, chunk = struct.unpack("<7sQBQ", f.read_bytes()[:24])
    assert (magic, version, code, chunk) == (b"LITPKDS", 1, 5, 3)


def test_shards_split_and_concatenate_back(tmp_path: Path) -> None:
    tokens = np.arange(25, dtype=np.int64)
    files = write_shards(tmp_path, "train", tokens, chunk_tokens=10, dtype=np.uint16)
    assert [f.name for f in files] == ["train_000.bin", "train_001.bin", "train_002.bin"]
    assert [read_header(f).chunk_size for f in files] == [10, 10, 5]
    train, val = find_packed_files(tmp_path)
    assert train == files and val == []
    np.testing.assert_array_equal(read_packed_files(train), tokens)


def test_find_packed_files_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file or folder"):
        find_packed_files(tmp_path / "missing")
    (tmp_path / "validation_000.bin").write_bytes(litpkds_bytes(np.arange(3, dtype=np.uint16), code=8))
    with pytest.raises(DataError, match=r"no train\*\.bin files"):
        find_packed_files(tmp_path)
