"""Reading the CSV files given to ``hyperwatch fit``, with errors that point at the cell.

A file is a header row of column names and one row per run. Numeric cells accept what Python's
``float`` accepts, including ``NaN``, ``inf`` and the wire spellings ``Infinity``/``-Infinity``:
a diverged run's NaN loss is a fact the fits must see (and exclude visibly), not a parse error.
Every error names the file, the line and the column, and says how to fix it.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hyperwatch.monitor.analysis._common import AnalysisError, FloatArray


class CSVError(AnalysisError):
    """A CSV file that cannot be read as the fit needs it; ``field`` is the column (or "csv")."""

    def __init__(self, path: str, field: str, message: str) -> None:
        super().__init__(field, message)
        self.path = path
        self.args = (f"{path}: {message}",)

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Table:
    """The cells of a CSV file as text, with the physical line number of each data row."""

    path: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    lines: tuple[int, ...]

    def _index(self, name: str, flag: str | None) -> int:
        if name not in self.columns:
            how = f"pass {flag} NAME to use another column" if flag else "add the column"
            raise CSVError(self.path, name, f"no column {name!r}; the header has {list(self.columns)}; {how}")
        return self.columns.index(name)

    def text(self, name: str, flag: str | None = None) -> list[str]:
        """The column's cells, stripped; an empty cell is an error."""
        j = self._index(name, flag)
        out = []
        for row, line in zip(self.rows, self.lines, strict=True):
            cell = row[j].strip()
            if not cell:
                raise CSVError(self.path, name, f"line {line}, column {name!r} is empty; fill it or remove the row")
            out.append(cell)
        return out

    def numeric(self, name: str, flag: str | None = None) -> FloatArray:
        """The column as floats; a cell that is not a number is an error naming its line."""
        values = []
        for cell, line in zip(self.text(name, flag), self.lines, strict=True):
            try:
                values.append(float(cell))
            except ValueError:
                raise CSVError(
                    self.path,
                    name,
                    f"line {line}, column {name!r}: {cell!r} is not a number; write a number "
                    "(NaN or inf are accepted for diverged runs)",
                ) from None
        return np.asarray(values, dtype=np.float64)

    def finite(self, name: str, flag: str | None = None) -> FloatArray:
        """A numeric column whose every cell must be finite (for fits that cannot exclude a point)."""
        values = self.numeric(name, flag)
        for v, line in zip(values, self.lines, strict=True):
            if not math.isfinite(v):
                raise CSVError(
                    self.path, name, f"line {line}, column {name!r}: {v} is not finite; this fit needs finite values"
                )
        return values

    def positive(self, name: str, flag: str | None = None, what: str = "value") -> FloatArray:
        """A numeric column whose every cell must be positive and finite."""
        values = self.numeric(name, flag)
        for v, line in zip(values, self.lines, strict=True):
            if not (math.isfinite(v) and v > 0.0):
                raise CSVError(
                    self.path,
                    name,
                    f"line {line}, column {name!r}: {v} is not a positive finite {what}; fix or remove the row",
                )
        return values


def read_csv(path: str | Path) -> Table:
    """Read ``path``; raises :class:`CSVError` for a missing, empty or ragged file."""
    name = str(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            header: list[str] | None = None
            rows: list[tuple[str, ...]] = []
            lines: list[int] = []
            for row in reader:
                if not row or all(not c.strip() for c in row):
                    continue
                if header is None:
                    header = [c.strip() for c in row]
                    continue
                if len(row) != len(header):
                    raise CSVError(
                        name,
                        "csv",
                        f"line {reader.line_num} has {len(row)} fields but the header has {len(header)}; "
                        "give every row one cell per column",
                    )
                rows.append(tuple(row))
                lines.append(reader.line_num)
    except FileNotFoundError:
        raise CSVError(name, "csv", "no such file; check the path given to --csv") from None
    except UnicodeDecodeError:
        raise CSVError(name, "csv", "is not UTF-8 text; save the file as UTF-8 CSV") from None
    except csv.Error as exc:
        raise CSVError(name, "csv", f"is not valid CSV ({exc}); check its quoting") from None
    except OSError as exc:
        raise CSVError(name, "csv", f"cannot be read ({exc.strerror}); check the path and permissions") from None
    if header is None:
        raise CSVError(name, "csv", "is empty; the first line must name the columns, e.g. lr,loss")
    blank = [i + 1 for i, c in enumerate(header) if not c]
    if blank:
        raise CSVError(name, "csv", f"header column(s) {blank} have no name; name every column")
    dupes = sorted({c for c in header if header.count(c) > 1})
    if dupes:
        raise CSVError(name, "csv", f"header repeats column name(s) {dupes}; give each column one name")
    if not rows:
        raise CSVError(name, "csv", "has a header but no data rows; add one row per run")
    return Table(name, tuple(header), tuple(rows), tuple(lines))
