"""CSV reading: every bad file gets an error naming the file, line and column."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hyperwatch.monitor.analysis import CSVError, read_csv


def write(tmp_path: Path, text: str, name: str = "runs.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_numbers_and_non_finite_spellings_are_read(tmp_path: Path) -> None:
    table = read_csv(write(tmp_path, "lr,loss\n0.01,3.0\n\n0.02,NaN\n0.04,Infinity\n0.08,-inf\n"))
    assert table.columns == ("lr", "loss")
    assert table.lines == (2, 4, 5, 6)  # the blank line is skipped, line numbers stay physical
    loss = table.numeric("loss")
    assert loss[0] == 3.0 and math.isnan(loss[1]) and loss[2] == math.inf and loss[3] == -math.inf


def test_a_byte_order_mark_does_not_rename_the_first_column(tmp_path: Path) -> None:
    path = tmp_path / "excel.csv"
    path.write_bytes("\ufefflr,loss\n0.01,3\n".encode())
    assert read_csv(path).columns == ("lr", "loss")


def test_missing_column_names_the_header_and_the_flag(tmp_path: Path) -> None:
    table = read_csv(write(tmp_path, "rate,loss\n0.01,3\n"))
    with pytest.raises(CSVError, match=r"no column 'lr'; the header has \['rate', 'loss'\]; pass --lr-col") as info:
        table.numeric("lr", "--lr-col")
    assert str(info.value).startswith(str(tmp_path / "runs.csv"))
    assert info.value.field == "lr"


def test_non_numeric_cell_names_line_and_column(tmp_path: Path) -> None:
    table = read_csv(write(tmp_path, "lr,loss\n0.01,3\n0.02,abc\n"))
    with pytest.raises(CSVError, match=r"line 3, column 'loss': 'abc' is not a number"):
        table.numeric("loss")


def test_empty_cell_names_line_and_column(tmp_path: Path) -> None:
    table = read_csv(write(tmp_path, "lr,loss\n0.01,\n"))
    with pytest.raises(CSVError, match=r"line 2, column 'loss' is empty"):
        table.numeric("loss")


def test_non_positive_and_non_finite_cells_are_refused_where_required(tmp_path: Path) -> None:
    table = read_csv(write(tmp_path, "x,y\n1,2\n0,3\n2,nan\n"))
    with pytest.raises(CSVError, match=r"line 3, column 'x': 0.0 is not a positive finite"):
        table.positive("x")
    with pytest.raises(CSVError, match=r"line 4, column 'y': nan is not finite"):
        table.finite("y")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is empty; the first line must name the columns"),
        ("lr,loss\n", "no data rows"),
        ("lr,loss\n0.01,3,7\n", "line 2 has 3 fields but the header has 2"),
        ("lr,lr\n1,2\n", "repeats column name"),
        ("lr,\n1,2\n", "have no name"),
    ],
)
def test_malformed_files_are_refused(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(CSVError, match=message):
        read_csv(write(tmp_path, text))


def test_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CSVError, match="no such file"):
        read_csv(tmp_path / "nope.csv")


def test_non_utf8_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "latin.csv"
    path.write_bytes(b"lr,loss\n0.01,\xff\xfe\n")
    with pytest.raises(CSVError, match="not UTF-8"):
        read_csv(path)
