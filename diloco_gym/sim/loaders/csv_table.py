"""CSV reading shared by the CSV formats (native, Azure, BurstGPT): the wanted columns as raw
strings, parsed to numbers with errors that explain the bad row."""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from diloco_gym.sim.loaders.checks import check_ints, short
from diloco_gym.sim.traces import TraceFormatError


@dataclass
class CsvTable:
    """Raw string columns of a CSV file, with what is needed to explain bad rows.

    Attributes:
        path: the file, for messages.
        text: the whole file text.
        header_line: 0-based line index of the header in ``text``.
        ncols: number of header fields.
        raw: the wanted columns as object arrays of ``str``.
        rows: number of data rows.
    """

    path: str
    text: str
    header_line: int
    ncols: int
    raw: dict[str, np.ndarray]
    rows: int
    _lines: list[str] | None = field(default=None, repr=False)

    def line(self, row: int) -> str:
        """The raw text of 1-based data ``row`` (used only to explain an error)."""
        if self._lines is None:
            self._lines = self.text.split("\n")
        return self._lines[self.header_line + row].rstrip("\r")

    def empty_reason(self, row: int) -> str:
        """Explain why data ``row`` has an empty value: blank, short or just empty."""
        line = self.line(row)
        if not line.strip():
            return "blank line"
        found = len(csv_fields(line))
        if found < self.ncols:
            return f"line has {found} of {self.ncols} fields (truncated line?)"
        return "empty value"

    def token_counts(self, column: str, limit: int) -> np.ndarray:
        """``column`` as validated token counts (:func:`check_ints`), int64."""
        return check_ints(self.path, column, self.numbers(column), limit, raw=self.raw[column])

    def numbers(self, column: str) -> np.ndarray:
        """Parse ``column`` to numbers (int64 when all are integers, else float64).

        Raises:
            TraceFormatError: at the first empty or unparseable value.
        """
        raw = self.raw[column]
        parsed = pd.to_numeric(pd.Series(raw, dtype=object), errors="coerce").to_numpy()
        if parsed.dtype.kind == "i":
            return parsed.astype(np.int64, copy=False)
        parsed = parsed.astype(np.float64)
        bad = np.isnan(parsed)
        if bad.any():
            row = int(np.argmax(bad)) + 1
            value = str(raw[row - 1])
            if not value.strip():
                reason = self.empty_reason(row)
            elif value.strip().lower() in ("nan", "+nan", "-nan"):
                reason = f"value {value.strip()} is not a finite number"
            else:
                reason = f"cannot parse '{short(value.strip())}' as a number"
            raise TraceFormatError(self.path, reason, row=row, field=column)
        return parsed


def csv_fields(line: str) -> list[str]:
    """The fields of one CSV line (a plain comma split where the csv module gives up, e.g.
    on a bare carriage return); used only to recognise a header or explain an error."""
    try:
        return next(csv.reader([line]), [])
    except csv.Error:
        return line.split(",")


def read_csv(path: str, text: str, columns: tuple[str, ...], *, header_line: int = 0) -> CsvTable:
    """Read the CSV in ``text`` (header at line ``header_line``) as string columns.

    Trailing blank lines are ignored; blank lines elsewhere become rows of empty values
    (so they are reported, not skipped, and row numbers match the file).

    Raises:
        TraceFormatError: empty file, no data rows, missing column, too many fields.
    """
    parts = text.split("\n", header_line)
    body = parts[header_line].rstrip() if len(parts) > header_line else ""
    if not body:
        raise TraceFormatError(path, "empty file" if not text.strip() else "no header line")
    try:
        frame = pd.read_csv(
            io.StringIO(body + "\n"),
            dtype=str,
            keep_default_na=False,
            skip_blank_lines=False,
            engine="c",
        )
    except pd.errors.EmptyDataError as exc:
        raise TraceFormatError(path, "empty file") from exc
    except pd.errors.ParserError as exc:
        message = str(exc)
        row = None
        match = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", message)
        if match:
            row = int(match.group(2)) - 1
            message = f"line has {match.group(3)} fields, header has {match.group(1)}"
        else:
            match = re.search(r"starting at row (\d+)", message)
            if match:
                row = int(match.group(1))
            message = message.replace("Error tokenizing data. C error: ", "")
        raise TraceFormatError(path, f"malformed CSV: {message}", row=row) from exc
    header = [name.strip() for name in csv_fields(body.split("\n", 1)[0].rstrip("\r"))]
    for column in columns:
        where = [i + 1 for i, name in enumerate(header) if name == column]
        if len(where) > 1:
            raise TraceFormatError(
                path,
                f"column {column!r} appears {len(where)} times in the header (columns "
                f"{', '.join(map(str, where))}); which one is meant is ambiguous",
                field=column,
            )
    names = [str(name).strip() for name in frame.columns]
    frame.columns = names
    for column in columns:
        if column not in names:
            raise TraceFormatError(
                path, f"missing column {column!r} (header: {short(str(names), 200)})", field=column
            )
    if len(frame) == 0:
        raise TraceFormatError(path, "no data rows")
    raw = {column: frame[column].to_numpy(dtype=object) for column in columns}
    return CsvTable(path, text, header_line, len(names), raw, len(frame))
