"""CSV reading shared by the CSV formats (native, Azure, BurstGPT): the wanted columns as raw
strings, parsed to numbers with errors that explain the bad row.

:func:`scan_csv` checks a file (a regular file within the size limit, all UTF-8) in blocks;
:func:`read_csv_chunks` then reads it in chunks of :data:`CHUNK_ROWS` rows, so that the raw
strings of only one chunk are alive at a time and the memory a load needs is the typed
columns plus a fixed amount, not a multiple of the file (it was about 20 times the file when
every field of the whole file was held as a string).
"""

from __future__ import annotations

import codecs
import csv
import io
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from diloco_gym.sim import limits as _limits
from diloco_gym.sim.loaders.checks import check_file, check_ints, short
from diloco_gym.sim.traces import TraceFormatError

#: Data rows :func:`read_csv_chunks` parses at a time (about 4 MB of a native file; the
#: chunk's raw strings take about 20 times that while it is converted).
CHUNK_ROWS = 65_536
#: Bytes read at a time when scanning a file (UTF-8 check, end of data, one line).
_BLOCK = 1 << 20
#: The most of one line read back for a header or a message (a longer line is cut).
_LINE_BYTES = 1 << 24
#: What ``str.rstrip()`` strips among single bytes (trailing blank lines are ignored).
_BLANK = b" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"


@dataclass
class CsvTable:
    """Raw string columns of a chunk of a CSV file, with what is needed to explain bad rows.

    Attributes:
        path: the file, for messages.
        header_line: 0-based line index of the header in the file (after a BOM).
        ncols: number of header fields.
        raw: the wanted columns as object arrays of ``str``.
        rows: number of data rows of this chunk.
        first_row: data rows of the file before this chunk's first; every row an error
            names counts from the file's first data row.
        line_of: the raw text of a 0-based line of the file (after the BOM), read back from
            the file to explain an error.
    """

    path: str
    header_line: int
    ncols: int
    raw: dict[str, np.ndarray]
    rows: int
    line_of: Callable[[int], str] = field(repr=False)
    first_row: int = 0

    def line(self, row: int) -> str:
        """The raw text of 1-based data ``row`` of the file (used only to explain an error)."""
        return self.line_of(self.header_line + row).rstrip("\r")

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
        return check_ints(
            self.path,
            column,
            self.numbers(column),
            limit,
            raw=self.raw[column],
            first_row=self.first_row,
        )

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
            row += self.first_row
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


def _malformed(path: str, exc: pd.errors.ParserError) -> TraceFormatError:
    """pandas' tokenizer error as a :class:`TraceFormatError` naming the data row."""
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
    return TraceFormatError(path, f"malformed CSV: {message}", row=row)


def _check_columns(
    path: str, header_line: str, frame: pd.DataFrame, columns: tuple[str, ...]
) -> list[str]:
    """The header's names (stripped, also set on ``frame``); each wanted column must be
    there exactly once."""
    header = [name.strip() for name in csv_fields(header_line)]
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
    return names


# ------------------------------------------------------------------ reading in chunks


@dataclass(frozen=True)
class CsvFile:
    """A CSV file checked for :func:`read_csv_chunks`: a regular file within the trace size
    limit, all UTF-8.

    Attributes:
        path: the file.
        start: offset of the text (3 after a UTF-8 byte-order mark, else 0).
        end: offset just after the last byte that is not blank (trailing blank lines and
            spaces are ignored).
    """

    path: str
    start: int
    end: int

    def line_at(self, offset: int) -> tuple[str, int]:
        """The line that begins at byte ``offset`` (without its ``\\n``; its first
        :data:`_LINE_BYTES` bytes) and the offset of the next line."""
        with open(self.path, "rb") as handle:
            handle.seek(offset)
            data = handle.readline(_LINE_BYTES)
        return data.decode("utf-8", errors="replace").removesuffix("\n"), offset + len(data)

    def line_of(self, index: int) -> str:
        """The text of 0-based line ``index`` of the file (counted after the byte-order
        mark), read back to explain an error."""
        offset = self.start
        with open(self.path, "rb") as handle:
            handle.seek(offset)
            seen = 0
            while seen < index:
                block = handle.read(_BLOCK)
                if not block:
                    return ""
                found = block.count(b"\n")
                if seen + found < index:
                    seen += found
                    offset += len(block)
                    continue
                at = -1
                for _ in range(index - seen):
                    at = block.index(b"\n", at + 1)
                offset += at + 1
                seen = index
        return self.line_at(offset)[0]


def scan_csv(path: str) -> CsvFile:
    """Check ``path`` for :func:`read_csv_chunks`, reading it once in blocks of 1 MiB: a
    regular file of at most ``DILOCO_GYM_MAX_TRACE_BYTES`` bytes, all UTF-8 (an optional
    byte-order mark skipped); the messages are those of
    :func:`~diloco_gym.sim.loaders.checks.read_text`.

    Raises:
        TraceFormatError: missing, not a regular file, too large, or not UTF-8.
    """
    check_file(path)
    bound = _limits.limit("TRACE_BYTES")
    decoder = codecs.getincrementaldecoder("utf-8")()
    start = end = offset = 0
    try:
        with open(path, "rb") as handle:
            while True:
                block = handle.read(_BLOCK)
                if offset == 0 and block.startswith(codecs.BOM_UTF8):
                    start = end = len(codecs.BOM_UTF8)
                    offset = start
                    block = block[start:]
                pending = len(decoder.getstate()[0])
                try:
                    decoder.decode(block, final=not block)
                except UnicodeDecodeError as exc:
                    at = offset - pending - start + exc.start  # from the text's first byte
                    raise TraceFormatError(
                        path,
                        f"cannot read: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} "
                        f"at offset {at})",
                    ) from None
                if not block:
                    break
                kept = len(block.rstrip(_BLANK))
                if kept:
                    end = offset + kept
                offset += len(block)
                if offset > bound:  # the file grew since it was checked
                    raise TraceFormatError(
                        path,
                        f"file size in bytes is above the limit of {bound:,} "
                        f"(set {_limits.limit_env_var('TRACE_BYTES')} to raise it)",
                    )
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read: {exc}") from exc
    return CsvFile(path, start, end)


class _Window(io.RawIOBase):
    """Bytes ``[start, end)`` of an open binary file, then ``tail``: what pandas reads."""

    def __init__(self, handle: io.BufferedReader, start: int, end: int, tail: bytes) -> None:
        super().__init__()
        handle.seek(start)
        self._handle = handle
        self._left = end - start
        self._tail = tail

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        if self._left > 0:
            got = self._handle.readinto(view[: min(len(view), self._left)])
            if got:
                self._left -= got
                return got
            self._left = 0  # the file shrank meanwhile: what is there is read
        size = min(len(view), len(self._tail))
        view[:size] = self._tail[:size]
        self._tail = self._tail[size:]
        return size


def read_csv_chunks(
    source: CsvFile,
    columns: tuple[str, ...],
    *,
    body: int,
    header_line: int = 0,
    chunk_rows: int | None = None,
) -> Iterator[CsvTable]:
    """Read the CSV of ``source`` whose header line begins at byte ``body`` (line
    ``header_line``) as string columns, ``chunk_rows`` data rows at a time.

    Trailing blank lines are ignored; blank lines elsewhere become rows of empty values (so
    they are reported, not skipped, and row numbers match the file). Each chunk is a
    :class:`CsvTable` whose ``first_row`` says where it starts, so that every row an error
    names counts from the file's first data row. At least one chunk, of at least one row,
    is yielded. ``chunk_rows`` defaults to :data:`CHUNK_ROWS`.

    Raises:
        TraceFormatError: empty file, no data rows, missing column, too many fields.
    """
    path = source.path
    if body >= source.end:
        whole = source.start >= source.end
        raise TraceFormatError(path, "empty file" if whole else "no header line")
    first_row = 0
    names: list[str] = []
    with open(path, "rb") as handle:
        window = io.BufferedReader(_Window(handle, body, source.end, b"\n"), _BLOCK)
        try:
            reader = pd.read_csv(
                window,
                encoding="utf-8",
                dtype=str,
                keep_default_na=False,
                skip_blank_lines=False,
                engine="c",
                chunksize=chunk_rows or CHUNK_ROWS,
            )
        except pd.errors.EmptyDataError as exc:
            raise TraceFormatError(path, "empty file") from exc
        except pd.errors.ParserError as exc:
            raise _malformed(path, exc) from exc
        with reader:
            while True:
                try:
                    frame = next(reader, None)
                except pd.errors.ParserError as exc:
                    raise _malformed(path, exc) from exc
                if frame is None:
                    break
                if not names:
                    header = source.line_at(body)[0].rstrip("\r")
                    names = _check_columns(path, header, frame, columns)
                    if len(frame) == 0:
                        raise TraceFormatError(path, "no data rows")
                elif len(frame) == 0:
                    continue
                frame.columns = names
                raw = {column: frame[column].to_numpy(dtype=object) for column in columns}
                del frame
                yield CsvTable(
                    path,
                    header_line,
                    len(names),
                    raw,
                    len(raw[columns[0]]),
                    line_of=source.line_of,
                    first_row=first_row,
                )
                first_row += len(raw[columns[0]])
    if not names:
        raise TraceFormatError(path, "no data rows")
