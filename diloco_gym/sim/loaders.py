"""Readers (and one writer) for request-trace files.

Every loader turns one file into a :class:`~diloco_gym.sim.traces.Trace` whose arrivals
are seconds from the start of the file's window, and fills ``trace.meta`` with at least
``path``, ``format`` and ``rows_read`` (data rows in the file, header excluded). The
trace is named after the file stem.

Supported formats (see :data:`FORMATS`):

``native``
    This project's own format, CSV or Parquet, columns ``arrival_s``,
    ``prompt_tokens``, ``output_tokens`` (other columns are ignored). A CSV may start
    with one metadata line ``# duration_s=<seconds>``; a Parquet file may carry
    ``duration_s`` in its schema metadata. Without it the window ends at the last
    arrival rounded up to the next whole second. :func:`save_native` writes it. Parquet
    needs pyarrow, an optional extra: ``pip install "diloco-gym[parquet]"``.
``azure``
    Azure LLM inference trace 2023: CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``
    with wall-clock timestamps such as ``2023-11-16 18:17:03.2011450``.
``mooncake``
    Mooncake (Kimi) JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``
    per line. Its timestamps are 3 s buckets; requests are spread inside their bucket
    with a seeded generator (see :func:`load_mooncake`).
``burstgpt``
    BurstGPT CSV (``Timestamp``, ``Request tokens``, ``Response tokens``, ...). Failed
    requests (``Response tokens == 0``) are filtered out, counted in
    ``meta["filtered_failed"]`` and reported with a :class:`TraceFilterWarning`.

Malformed input never loads partially: it raises :class:`TraceFormatError` naming the
file, the 1-based data row (header and metadata lines excluded; for JSONL, the line)
and the field at fault, and showing the offending value as it is written in the file.
No other exception escapes a loader for any file content (a property test mutates valid
files of every format to check this).

Token counts must be integers in ``[0, max_tokens]``. The plausibility bound
``max_tokens`` defaults to :data:`DEFAULT_MAX_TOKENS` (2**24 = 16,777,216 tokens per
request and field, well above the largest served context windows, a few million
tokens); pass ``max_tokens=`` to any loader, or set the environment variable
``DILOCO_GYM_MAX_TOKENS`` (which also reaches the command line), to change it. NaN and
infinities are reported as "not a finite number". In JSON Lines files blank lines are
skipped (as JSON Lines readers do); line numbers still count them.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import math
import os
import re
import stat
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import pandas as pd

from diloco_gym.sim import limits as _limits
from diloco_gym.sim.traces import Trace, TraceFormatError

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "FORMATS",
    "MAX_TOKENS_ENV",
    "max_tokens_bound",
    "TraceFilterWarning",
    "detect_format",
    "load_azure",
    "load_burstgpt",
    "load_mooncake",
    "load_native",
    "load_trace",
    "save_native",
]

StrPath: TypeAlias = str | os.PathLike[str]

#: Names accepted by :func:`load_trace` (besides ``"auto"``).
FORMATS: tuple[str, ...] = ("native", "azure", "mooncake", "burstgpt")

_PARQUET_SUFFIXES = (".parquet", ".pq")
_JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
_NATIVE_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")
_MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
_DURATION_LINE = re.compile(r"#\s*duration_s\s*=\s*(\S+)\s*")
_TIMESTAMP_RE = r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?"
_LEAP_SECOND = r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:)60(?:\.\d*)?$"
_INT_LIMIT = 2**62  # int64 head-room for sums; timestamps beyond it cannot be stored

#: Default plausibility bound on a request's prompt or output tokens (see module doc).
DEFAULT_MAX_TOKENS = 2**24
#: Environment variable that overrides :data:`DEFAULT_MAX_TOKENS`.
MAX_TOKENS_ENV = "DILOCO_GYM_MAX_TOKENS"


class TraceFilterWarning(UserWarning):
    """Rows of a trace file were deliberately left out (e.g. failed requests)."""


# --------------------------------------------------------------------------- public API


def load_trace(
    path: StrPath, format: str = "auto", *, seed: int = 0, max_tokens: int | None = None
) -> Trace:
    """Load a trace file in any supported format.

    Args:
        path: the trace file.
        format: one of :data:`FORMATS`, or ``"auto"`` to pick by extension and header
            (see :func:`detect_format`).
        seed: seed for formats that need randomness (``mooncake`` bucket spreading);
            ignored by the others.
        max_tokens: plausibility bound on token counts (``None``: see
            :func:`max_tokens_bound`).

    Returns:
        The trace, named after the file stem.

    Raises:
        ValueError: ``format`` is not a known format name, or a bad ``max_tokens``.
        TraceFormatError: the file is missing, unreadable or malformed, or ``"auto"``
            cannot tell its format.
        ModuleNotFoundError: a Parquet file, and pyarrow (the ``parquet`` extra) is not
            installed.
    """
    if format != "auto" and format not in FORMATS:
        raise ValueError(
            f"unknown trace format {format!r}; valid formats: {', '.join(('auto',) + FORMATS)}"
        )
    limit = max_tokens_bound(max_tokens)
    fmt = detect_format(path) if format == "auto" else format
    if fmt == "native":
        return load_native(path, max_tokens=limit)
    if fmt == "azure":
        return load_azure(path, max_tokens=limit)
    if fmt == "mooncake":
        return load_mooncake(path, seed=seed, max_tokens=limit)
    return load_burstgpt(path, max_tokens=limit)


def max_tokens_bound(max_tokens: int | None = None) -> int:
    """The token-count bound in force: ``max_tokens``, else ``$DILOCO_GYM_MAX_TOKENS``, else
    :data:`DEFAULT_MAX_TOKENS`.

    Raises:
        ValueError: the bound (argument or environment variable) is not an integer in
            ``[1, 2**62]``.
    """
    where = "max_tokens"
    value: object = max_tokens
    if max_tokens is None:
        text = os.environ.get(MAX_TOKENS_ENV, "").strip()
        if not text:
            return DEFAULT_MAX_TOKENS
        where = f"environment variable {MAX_TOKENS_ENV}"
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"{where} must be an integer, got {text!r}") from None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | np.integer)
        or not 1 <= value <= _INT_LIMIT
    ):
        raise ValueError(f"{where} must be an integer in [1, 2**62], got {value!r}")
    return int(value)


def detect_format(path: StrPath) -> str:
    """Guess the format of a trace file from its extension and first line.

    Parquet files (by extension or magic bytes) are ``native``; files whose first line
    starts with ``{`` or with a JSONL extension are ``mooncake``; a CSV is told apart by
    a ``#`` metadata line (``native``) or by its header columns.

    Args:
        path: the trace file.

    Returns:
        One of :data:`FORMATS`.

    Raises:
        TraceFormatError: the file cannot be read, is empty, or matches no format.
    """
    suffix = Path(path).suffix.lower()
    _check_file(str(path))
    if suffix in _PARQUET_SUFFIXES:
        return "native"
    try:
        with open(path, "rb") as handle:
            head = handle.read(65536)
    except OSError as exc:
        raise TraceFormatError(str(path), f"cannot read: {exc}") from exc
    if head.startswith(b"PAR1"):
        return "native"
    if head.startswith(b"\x1f\x8b"):
        raise TraceFormatError(str(path), "gzip-compressed file; decompress it first")
    try:  # incremental: a character cut at the end of the 64 KiB head is not an error
        text = codecs.getincrementaldecoder("utf-8-sig")().decode(head, final=False).lstrip()
    except UnicodeDecodeError as exc:
        raise TraceFormatError(
            str(path), f"cannot detect the trace format: not UTF-8 text ({_undecodable(exc)})"
        ) from None
    if not text:
        raise TraceFormatError(str(path), "empty file")
    if text.startswith("{") or suffix in _JSONL_SUFFIXES:
        return "mooncake"
    if text.startswith("#"):
        return "native"
    first = text.split("\n", 1)[0].rstrip("\r")
    header = {name.strip() for name in _csv_fields(first)}
    if "arrival_s" in header:
        return "native"
    if header & {"TIMESTAMP", "ContextTokens", "GeneratedTokens"}:
        return "azure"
    if header & {"Request tokens", "Response tokens", "Log Type"}:
        return "burstgpt"
    shown = first[:200] if first.isprintable() else ascii(first[:200])[1:-1]
    raise TraceFormatError(
        str(path),
        f"cannot detect the trace format from header '{shown}'; pass "
        f"format= one of {', '.join(FORMATS)}",
    )


def load_native(path: StrPath, *, max_tokens: int | None = None) -> Trace:
    """Load a trace in this project's native CSV or Parquet format.

    Columns ``arrival_s`` (finite seconds, ``>= 0``, sorted), ``prompt_tokens`` and
    ``output_tokens`` (non-negative integers) are required; any other column (e.g.
    pressure columns, which are not per-request) is ignored. The window length comes
    from the ``# duration_s=<seconds>`` first line of a CSV or the ``duration_s`` key
    of the Parquet schema metadata; when absent it is the last arrival plus 1e-6 s,
    rounded up to the next whole second.

    Args:
        path: a ``.parquet``/``.pq`` file, or a CSV file (any other extension).
        max_tokens: plausibility bound on token counts (see :func:`max_tokens_bound`).

    Returns:
        The trace; ``meta["duration_source"]`` says whether the length was stored in
        the file (``"file"``) or inferred (``"inferred"``).

    Raises:
        TraceFormatError: the file is missing, unreadable or malformed.
        ModuleNotFoundError: a Parquet file, and pyarrow (the ``parquet`` extra) is not
            installed.
    """
    spath = str(path)
    limit = max_tokens_bound(max_tokens)
    raw: dict[str, np.ndarray | None] = dict.fromkeys(_NATIVE_COLUMNS)
    if Path(path).suffix.lower() in _PARQUET_SUFFIXES:
        columns, rows, duration = _read_native_parquet(spath)
        arrival = _check_floats(spath, "arrival_s", columns["arrival_s"], nonnegative=True)
        prompt = _check_ints(spath, "prompt_tokens", columns["prompt_tokens"], limit)
        output = _check_ints(spath, "output_tokens", columns["output_tokens"], limit)
    else:
        text = _read_text(spath)
        duration = None
        header_line = 0
        if text.startswith("#"):
            duration = _parse_duration(spath, text.split("\n", 1)[0].rstrip("\r"))
            header_line = 1
        table = _read_csv(spath, text, _NATIVE_COLUMNS, header_line=header_line)
        rows = table.rows
        raw = dict(table.raw)
        arrival = _check_floats(
            spath, "arrival_s", table.numbers("arrival_s"), nonnegative=True, raw=raw["arrival_s"]
        )
        prompt = table.token_counts("prompt_tokens", limit)
        output = table.token_counts("output_tokens", limit)
    _check_sorted(spath, "arrival_s", arrival, raw=raw["arrival_s"])
    if duration is None:
        duration = _default_duration(spath, float(arrival[-1]))
        source = "inferred"
    else:
        source = "file"
        late = int(np.searchsorted(arrival, duration, side="left"))
        if late < arrival.size:
            raise TraceFormatError(
                spath,
                f"arrival {_as_written(arrival, raw['arrival_s'], late)} s is not "
                f"before duration_s={duration!r}",
                row=late + 1,
                field="arrival_s",
            )
    return _make_trace(
        spath, "native", arrival, prompt, output, duration, rows, duration_source=source
    )


def save_native(trace: Trace, path: StrPath) -> None:
    """Write ``trace`` in the native format, chosen by the extension of ``path``.

    ``.parquet``/``.pq`` writes Parquet with ``duration_s`` in the schema metadata; any
    other extension writes CSV with a ``# duration_s=...`` first line. Floats are
    written at round-trip precision, so :func:`load_native` gives back a trace equal
    (``==``) to ``trace``.

    Args:
        trace: the trace to write. It must have no pressure series: the native format
            holds only per-request data, and pressures are never dropped silently.
        path: destination file (overwritten).

    Raises:
        ValueError: ``trace`` carries a ``network`` or ``checkpoint`` series.
        ModuleNotFoundError: a Parquet destination, and pyarrow (the ``parquet`` extra) is
            not installed.
    """
    if trace.network is not None or trace.checkpoint is not None:
        raise ValueError(
            "the native trace format stores requests only; drop the pressure series first "
            "(dataclasses.replace(trace, network=None, checkpoint=None))"
        )
    duration = float(trace.duration_s)
    if Path(path).suffix.lower() in _PARQUET_SUFFIXES:
        pa, pq = _pyarrow(path, "writing")
        table = pa.table(
            {
                "arrival_s": pa.array(trace.arrival_s, type=pa.float64()),
                "prompt_tokens": pa.array(trace.prompt_tokens, type=pa.int64()),
                "output_tokens": pa.array(trace.output_tokens, type=pa.int64()),
            }
        ).replace_schema_metadata({"duration_s": repr(duration)})
        pq.write_table(table, path)
        return
    rows = zip(
        trace.arrival_s.tolist(),
        trace.prompt_tokens.tolist(),
        trace.output_tokens.tolist(),
        strict=True,
    )
    body = "".join(f"{a!r},{p},{o}\n" for a, p, o in rows)
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(f"# duration_s={duration!r}\n{','.join(_NATIVE_COLUMNS)}\n{body}")


def load_azure(path: StrPath, *, max_tokens: int | None = None) -> Trace:
    """Load an Azure LLM inference trace (2023) CSV.

    The header must hold ``TIMESTAMP``, ``ContextTokens`` and ``GeneratedTokens``.
    Timestamps look like ``2023-11-16 18:17:03.2011450``; fractional digits beyond the
    sixth are truncated (microsecond resolution) and fewer digits, or none, are
    accepted. Arrivals are seconds since the first timestamp, which must be sorted;
    the window ends at the last arrival (plus 1e-6 s) rounded up to a whole second.

    Args:
        path: the CSV file.
        max_tokens: plausibility bound on token counts (see :func:`max_tokens_bound`).

    Returns:
        The trace, with ``meta["start_time"]`` holding the first raw timestamp.

    Raises:
        TraceFormatError: the file is missing, unreadable or malformed.
    """
    spath = str(path)
    table = _read_csv(spath, _read_text(spath), _AZURE_COLUMNS)
    micros = table.timestamps_us("TIMESTAMP")
    _check_sorted(spath, "TIMESTAMP", micros, raw=table.raw["TIMESTAMP"])
    arrival = (micros - micros[0]) / 1e6
    limit = max_tokens_bound(max_tokens)
    prompt = table.token_counts("ContextTokens", limit)
    output = table.token_counts("GeneratedTokens", limit)
    return _make_trace(
        spath,
        "azure",
        arrival,
        prompt,
        output,
        _default_duration(spath, float(arrival[-1])),
        table.rows,
        start_time=str(table.raw["TIMESTAMP"][0]).strip(),
    )


def load_mooncake(
    path: StrPath, *, seed: int = 0, bucket_s: float = 3.0, max_tokens: int | None = None
) -> Trace:
    """Load a Mooncake (FAST'25) JSONL trace, spreading each timestamp bucket.

    Each line is a JSON object with integer ``timestamp`` (ms, relative; not re-based),
    ``input_length`` and ``output_length``; other keys (``hash_ids``) are ignored.
    Timestamps must be non-decreasing. Mooncake timestamps are quantised to buckets of
    about ``bucket_s``, so every distinct timestamp value ``t`` is a bucket
    ``[t, end)`` with ``end = min(t + bucket_s, next distinct timestamp)``: the cap
    matters because real bucket starts are sometimes 2997-2999 ms apart, and without it
    spread requests would leave their bucket and overtake the next one. For a bucket of
    ``k`` requests, ``k`` uniform offsets are drawn from ``np.random.default_rng(seed)``
    (one draw per request, in file order, for the whole file), sorted, and assigned to
    the bucket's requests in file order: the i-th request of a bucket gets the i-th
    smallest arrival, so token counts stay in file order. The window ends at the last
    bucket's ``t + bucket_s``, rounded up to a whole second.

    Args:
        path: the JSONL file.
        seed: seed of the spreading generator; the same seed gives the same trace.
        bucket_s: nominal bucket width in seconds.
        max_tokens: plausibility bound on token counts (see :func:`max_tokens_bound`).

    Returns:
        The trace, with ``meta`` also holding ``bucket_s``, ``seed`` and ``num_buckets``.

    Raises:
        ValueError: ``bucket_s`` is not a positive finite number.
        TraceFormatError: the file is missing, unreadable or malformed.
    """
    if not (math.isfinite(bucket_s) and bucket_s > 0):
        raise ValueError(f"bucket_s must be positive, got {bucket_s}")
    spath = str(path)
    limit = max_tokens_bound(max_tokens)
    lines = _read_text(spath).rstrip().split("\n")
    if lines == [""]:
        raise TraceFormatError(spath, "empty file")
    values: dict[str, list[int]] = {key: [] for key in _MOONCAKE_KEYS}
    rows_read = 0
    for row, line in enumerate(lines, start=1):
        if not line.strip():
            continue  # JSON Lines readers skip blank lines; row numbers still count them
        rows_read += 1
        try:
            obj = json.loads(
                line,
                parse_float=_JsonFloat,
                parse_constant=_JsonFloat,
                object_pairs_hook=_unique_keys,
            )
        except json.JSONDecodeError as exc:
            hint = " (truncated last line?)" if row == len(lines) else ""
            raise TraceFormatError(
                spath, f"invalid JSON ({exc.msg}, column {exc.colno}){hint}", row=row
            ) from exc
        except (RecursionError, ValueError) as exc:  # deep nesting, huge integer literals
            raise TraceFormatError(
                spath, f"invalid JSON ({type(exc).__name__}: {str(exc)[:100]})", row=row
            ) from None
        if not isinstance(obj, dict):
            raise TraceFormatError(
                spath, f"expected a JSON object, got {type(obj).__name__}", row=row
            )
        for key, sink in values.items():
            bound = _INT_LIMIT if key == "timestamp" else limit
            sink.append(_json_count(spath, obj, key, row, bound))
    stamps = np.asarray(values["timestamp"], dtype=np.int64)
    _check_sorted(spath, "timestamp", stamps)

    starts_ms, counts = np.unique(stamps, return_counts=True)
    starts = starts_ms / 1000.0
    ends = np.minimum(starts + bucket_s, np.append(starts[1:], np.inf))
    bucket = np.repeat(np.arange(starts.size), counts)
    draws = np.random.default_rng(seed).random(stamps.size)
    # Buckets are contiguous and in order, so sorting by (bucket, draw) only reorders
    # draws inside each bucket.
    draws = draws[np.lexsort((draws, bucket))]
    lo, hi = starts[bucket], ends[bucket]
    arrival = np.minimum(lo + (hi - lo) * draws, np.nextafter(hi, -np.inf))
    duration = float(math.ceil(starts[-1] + bucket_s))
    return _make_trace(
        spath,
        "mooncake",
        arrival,
        values["input_length"],
        values["output_length"],
        duration,
        rows_read,
        bucket_s=float(bucket_s),
        seed=seed,
        num_buckets=int(starts.size),
    )


def load_burstgpt(path: StrPath, *, max_tokens: int | None = None) -> Trace:
    """Load a BurstGPT CSV trace, leaving out failed requests.

    Required columns are ``Timestamp`` (seconds, sorted), ``Request tokens`` and
    ``Response tokens``; the others (``Session ID``, ``Elapsed time``, ``Model``,
    ``Total tokens``, ``Log Type``) are not used. Every row is validated first. A
    request is *failed* iff ``Response tokens == 0``: failed rows are removed, counted
    in ``meta["filtered_failed"]`` and reported with a :class:`TraceFilterWarning`.
    Arrivals are seconds since the first kept request; the window ends at the last
    arrival (plus 1e-6 s) rounded up to a whole second.

    Args:
        path: the CSV file.
        max_tokens: plausibility bound on token counts (see :func:`max_tokens_bound`).

    Returns:
        The trace of successful requests.

    Raises:
        TraceFormatError: the file is missing, unreadable or malformed, or holds no
            successful request.
    """
    spath = str(path)
    table = _read_csv(spath, _read_text(spath), _BURSTGPT_COLUMNS)
    limit = max_tokens_bound(max_tokens)
    stamps = _check_floats(
        spath, "Timestamp", table.numbers("Timestamp"), raw=table.raw["Timestamp"]
    )
    _check_sorted(spath, "Timestamp", stamps, raw=table.raw["Timestamp"])
    prompt = table.token_counts("Request tokens", limit)
    output = table.token_counts("Response tokens", limit)
    kept = output != 0
    failed = int(table.rows - np.count_nonzero(kept))
    if failed == table.rows:
        raise TraceFormatError(
            spath,
            f"no successful request: all {failed} rows have 'Response tokens' == 0",
            field="Response tokens",
        )
    if failed:
        warnings.warn(
            f"{spath}: filtered {failed} failed request(s) ('Response tokens' == 0) "
            f"out of {table.rows} rows",
            TraceFilterWarning,
            stacklevel=2,
        )
    stamps, prompt, output = stamps[kept], prompt[kept], output[kept]
    arrival = stamps - stamps[0]
    return _make_trace(
        spath,
        "burstgpt",
        arrival,
        prompt,
        output,
        _default_duration(spath, float(arrival[-1])),
        table.rows,
        filtered_failed=failed,
        first_timestamp_s=float(stamps[0]),
    )


# --------------------------------------------------------------------------- CSV reading


@dataclass
class _CsvTable:
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
        found = len(_csv_fields(line))
        if found < self.ncols:
            return f"line has {found} of {self.ncols} fields (truncated line?)"
        return "empty value"

    def token_counts(self, column: str, limit: int) -> np.ndarray:
        """``column`` as validated token counts (:func:`_check_ints`), int64."""
        return _check_ints(self.path, column, self.numbers(column), limit, raw=self.raw[column])

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
                reason = f"cannot parse '{_short(value.strip())}' as a number"
            raise TraceFormatError(self.path, reason, row=row, field=column)
        return parsed

    def timestamps_us(self, column: str) -> np.ndarray:
        """Parse ``YYYY-MM-DD HH:MM:SS[.f...]`` timestamps to int64 microseconds.

        Raises:
            TraceFormatError: at the first empty or unparseable timestamp.
        """
        raw = self.raw[column]
        text = pd.Series(raw, dtype=object).astype(str).str.strip()
        # A leap second (second 60, e.g. 23:59:60.2) is kept in order: it becomes the last
        # microsecond of its minute (parsed as is, it would roll over into the next minute
        # and look unsorted against the requests just after it).
        text = text.str.replace(_LEAP_SECOND, r"\g<1>59.999999", regex=True)
        parts = text.str.partition(".")
        normal = parts[0] + "." + parts[2].str[:6].str.ljust(6, "0")
        stamps = pd.to_datetime(normal, format="%Y-%m-%d %H:%M:%S.%f", errors="coerce")
        bad = ~text.str.fullmatch(_TIMESTAMP_RE).to_numpy(dtype=bool) | stamps.isna().to_numpy()
        if bad.any():
            row = int(np.argmax(bad)) + 1
            value = str(raw[row - 1])
            reason = (
                self.empty_reason(row)
                if not value.strip()
                else f"cannot parse timestamp '{_short(value)}' (expected "
                "'YYYY-MM-DD HH:MM:SS.fffffff')"
            )
            raise TraceFormatError(self.path, reason, row=row, field=column)
        return stamps.to_numpy().astype("datetime64[us]").astype(np.int64)


def _csv_fields(line: str) -> list[str]:
    """The fields of one CSV line (a plain comma split where the csv module gives up, e.g.
    on a bare carriage return); used only to recognise a header or explain an error."""
    try:
        return next(csv.reader([line]), [])
    except csv.Error:
        return line.split(",")


def _read_csv(path: str, text: str, columns: tuple[str, ...], *, header_line: int = 0) -> _CsvTable:
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
    header = [name.strip() for name in _csv_fields(body.split("\n", 1)[0].rstrip("\r"))]
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
                path, f"missing column {column!r} (header: {_short(str(names), 200)})", field=column
            )
    if len(frame) == 0:
        raise TraceFormatError(path, "no data rows")
    raw = {column: frame[column].to_numpy(dtype=object) for column in columns}
    return _CsvTable(path, text, header_line, len(names), raw, len(frame))


def _check_file(path: str) -> int:
    """The size of ``path``, a regular file of at most ``DILOCO_GYM_MAX_TRACE_BYTES`` bytes
    (:mod:`diloco_gym.sim.limits`); a FIFO, a device or a directory is refused before it is
    opened (reading one could hang or never end).

    Raises:
        TraceFormatError: missing, not a regular file, or too large.
    """
    try:
        info = os.stat(path)
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = (
            "a directory"
            if stat.S_ISDIR(info.st_mode)
            else "a FIFO (named pipe)"
            if stat.S_ISFIFO(info.st_mode)
            else "a device"
            if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode)
            else "a socket or other special file"
        )
        raise TraceFormatError(path, f"cannot read: not a regular file ({kind}); give a trace file")
    try:
        _limits.check_limit("TRACE_BYTES", info.st_size, "file size in bytes")
    except _limits.LimitError as exc:
        raise TraceFormatError(path, str(exc)) from None
    return info.st_size


def _read_text(path: str) -> str:
    """The whole file as text (UTF-8, optional BOM), or a :class:`TraceFormatError`."""
    _check_file(path)
    bound = _limits.limit("TRACE_BYTES")
    try:
        with open(path, "rb") as handle:
            data = handle.read(bound + 1)  # bounded even if the file grows meanwhile
        if len(data) > bound:
            raise TraceFormatError(
                path,
                f"file size in bytes is above the limit of {bound:,} "
                f"(set {_limits.limit_env_var('TRACE_BYTES')} to raise it)",
            )
        return data.decode("utf-8-sig")
    except OSError as exc:
        raise TraceFormatError(path, f"cannot read: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise TraceFormatError(path, f"cannot read: not UTF-8 text ({_undecodable(exc)})") from None


def _parse_duration(path: str, line: str) -> float:
    """Parse the native metadata line ``# duration_s=<seconds>``."""
    match = _DURATION_LINE.fullmatch(line)
    if not match:
        raise TraceFormatError(
            path,
            f"unrecognised metadata line '{_short(line, 100)}'; expected '# duration_s=<seconds>'",
            field="duration_s",
        )
    try:
        duration = float(match.group(1))
    except ValueError:
        duration = math.nan
    if not (math.isfinite(duration) and duration > 0):
        raise TraceFormatError(
            path,
            f"duration_s must be a positive number, got '{_short(match.group(1))}'",
            field="duration_s",
        )
    return duration


def _pyarrow(path: StrPath, action: str) -> tuple[Any, Any]:
    """``(pyarrow, pyarrow.parquet)``, imported on first use.

    pyarrow (about 170 MB installed) is needed only for Parquet traces, so it is an
    optional extra rather than a dependency, and importing this module does not load it.

    Raises:
        ModuleNotFoundError: pyarrow is not installed; the message names ``path`` and the
            extra to install.
    """
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ModuleNotFoundError(
            f"{os.fspath(path)}: {action} Parquet traces needs pyarrow, which is not "
            f'installed: pip install "diloco-gym[parquet]" ({exc})',
            name="pyarrow",
        ) from None
    return pa, pq


def _read_native_parquet(path: str) -> tuple[dict[str, np.ndarray], int, float | None]:
    """Columns, row count and stored ``duration_s`` (or ``None``) of a native Parquet."""
    pa, pq = _pyarrow(path, "reading")
    _check_file(path)
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise TraceFormatError(path, f"cannot read: {exc}") from exc
    for column in _NATIVE_COLUMNS:
        if column not in table.column_names:
            raise TraceFormatError(
                path, f"missing column {column!r} (columns: {table.column_names})", field=column
            )
    columns = {}
    for column in _NATIVE_COLUMNS:
        kind = table.schema.field(column).type
        if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
            raise TraceFormatError(path, f"column has type {kind}, expected a number", field=column)
        data = table.column(column)
        if data.null_count:
            row = int(np.argmax(data.is_null().to_numpy(zero_copy_only=False))) + 1
            raise TraceFormatError(path, "value is missing (null)", row=row, field=column)
        columns[column] = data.to_numpy(zero_copy_only=False)
    if table.num_rows == 0:
        raise TraceFormatError(path, "no data rows")
    stored = (table.schema.metadata or {}).get(b"duration_s")
    duration = None
    if stored is not None:
        try:
            text = stored.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceFormatError(
                path,
                f"duration_s metadata is not UTF-8 text ({_undecodable(exc)})",
                field="duration_s",
            ) from None
        duration = _parse_duration(path, "# duration_s=" + text)
    return columns, table.num_rows, duration


# --------------------------------------------------------------------------- validation


class _JsonFloat(float):
    """A JSON number that keeps its text, so that messages show it as written."""

    text: str

    def __new__(cls, text: str) -> _JsonFloat:
        value = super().__new__(cls, text)
        value.text = text
        return value


def _as_written(values: np.ndarray | list, raw: np.ndarray | None, index: int) -> str:
    """Element ``index`` as the file writes it (raw text when known, else plain Python)."""
    if raw is not None:
        return _short(str(raw[index]).strip())
    value = values[index]
    value = value.item() if isinstance(value, np.generic) else value
    if isinstance(value, _JsonFloat):
        return _short(value.text)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str | bool) or value is None:
        return _short(json.dumps(value))
    if isinstance(value, int) and abs(value) > 10**60:
        return f"an integer of {len(str(abs(value))):,} digits"
    return _short(repr(value))


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook``: a key given twice in one JSON object is an error (``json``
    would keep the last value silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key '{_short(key)}'")
        out[key] = value
    return out


def _short(text: str, width: int = 60) -> str:
    """``text`` for a message: control characters (a NUL byte, say) escaped, and cut to
    ``width`` characters with the full length said, so a huge field is never echoed."""
    text = str(text)
    cut = text[:width]
    shown = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in cut)
    return shown if len(text) <= width else f"{shown}... ({len(text):,} characters)"


def _undecodable(exc: UnicodeDecodeError) -> str:
    """Where a file stops being UTF-8, with the byte in hex (never the raw byte)."""
    return f"byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"


def _check_ints(
    path: str, column: str, values: np.ndarray, limit: int, *, raw: np.ndarray | None = None
) -> np.ndarray:
    """Validate token counts: integers (or integral floats) in ``[0, limit]``; return int64.

    ``raw`` holds the column's text as written, for messages.
    """
    if values.dtype.kind in "iu":
        bad = (values < 0) | (values > limit)
        if bad.any():
            row = int(np.argmax(bad))
            shown = _as_written(values, raw, row)
            reason = (
                f"negative token count {shown}" if values[row] < 0 else _too_large(shown, limit)
            )
            raise TraceFormatError(path, reason, row=row + 1, field=column)
        return values.astype(np.int64, copy=False)
    values = values.astype(np.float64)
    finite = np.isfinite(values)
    whole = finite & (values == np.floor(np.where(finite, values, 0.0)))
    bad = ~whole | (values < 0) | (values > limit)
    if bad.any():
        row = int(np.argmax(bad))
        value = values[row]
        shown = _as_written(values, raw, row)
        if not finite[row]:
            reason = f"token count {shown} is not a finite number"
        elif not whole[row]:
            reason = f"token count {shown} is not an integer"
        elif value < 0:
            reason = f"negative token count {shown}"
        else:
            reason = _too_large(shown, limit)
        raise TraceFormatError(path, reason, row=row + 1, field=column)
    return values.astype(np.int64)


def _too_large(shown: str, limit: int) -> str:
    return (
        f"token count {shown} is too large: above the plausible maximum of {limit} "
        f"tokens per request (pass max_tokens= or set {MAX_TOKENS_ENV} to change it)"
    )


def _check_floats(
    path: str,
    column: str,
    values: np.ndarray,
    *,
    nonnegative: bool = False,
    raw: np.ndarray | None = None,
) -> np.ndarray:
    """Validate finite (and optionally non-negative) floats; return float64."""
    values = values.astype(np.float64)
    bad = ~np.isfinite(values)
    if nonnegative:
        bad |= values < 0
    if bad.any():
        row = int(np.argmax(bad))
        shown = _as_written(values, raw, row)
        reason = (
            f"value {shown} is not a finite number"
            if not np.isfinite(values[row])
            else f"negative value {shown}"
        )
        raise TraceFormatError(path, reason, row=row + 1, field=column)
    return values


def _check_sorted(
    path: str, column: str, values: np.ndarray, raw: np.ndarray | None = None
) -> None:
    """Raise at the first row whose value is smaller than the previous row's."""
    down = np.diff(values) < 0
    if down.any():
        row = int(np.argmax(down)) + 2  # 1-based index of the later element
        raise TraceFormatError(
            path,
            f"not sorted: {_as_written(values, raw, row - 1)} comes after "
            f"{_as_written(values, raw, row - 2)}",
            row=row,
            field=column,
        )


def _json_count(path: str, obj: dict, key: str, row: int, limit: int) -> int:
    """A non-negative integer field (at most ``limit``) of one JSONL object."""
    if key not in obj:
        raise TraceFormatError(path, f"missing key {key!r}", row=row, field=key)
    value = obj[key]
    shown = _as_written([value], None, 0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TraceFormatError(path, f"expected an integer, got {shown}", row=row, field=key)
    if isinstance(value, float) and not math.isfinite(value):
        raise TraceFormatError(path, f"{shown} is not a finite number", row=row, field=key)
    if isinstance(value, float) and not value.is_integer():
        raise TraceFormatError(path, f"{shown} is not an integer", row=row, field=key)
    if value < 0:
        raise TraceFormatError(path, f"negative value {shown}", row=row, field=key)
    if value > limit:
        reason = (
            _too_large(shown, limit)
            if key != "timestamp"
            else f"timestamp {shown} is too large (at most 2**62 ms)"
        )
        raise TraceFormatError(path, reason, row=row, field=key)
    return int(value)


def _default_duration(path: str, last_arrival_s: float) -> float:
    """The last arrival plus 1e-6 s, rounded up to the next whole second."""
    end = last_arrival_s + 1e-6
    if not math.isfinite(end):
        raise TraceFormatError(
            path, f"the trace spans {last_arrival_s!r} s, which is not a finite number of seconds"
        )
    duration = float(math.ceil(end))
    if duration <= last_arrival_s:  # beyond 2**33 s the 1e-6 s is lost to rounding
        duration = float(math.floor(last_arrival_s) + 1)
    return duration


def _make_trace(
    path: str,
    fmt: str,
    arrival: np.ndarray,
    prompt: np.ndarray | list[int],
    output: np.ndarray | list[int],
    duration: float,
    rows_read: int,
    **extra: object,
) -> Trace:
    """Build the :class:`Trace`, re-raising any invariant failure against ``path``."""
    meta: dict[str, object] = {"path": path, "format": fmt, "rows_read": int(rows_read)}
    meta.update(extra)
    try:
        # Trace.__post_init__ converts token lists to arrays; the dataclass field types
        # describe the attributes after that, which mypy also applies to the arguments.
        return Trace(arrival, prompt, output, float(duration), name=Path(path).stem, meta=meta)  # type: ignore[arg-type]
    except TraceFormatError as exc:  # defensive: loaders validate before building
        raise TraceFormatError(path, exc.reason, row=exc.row, field=exc.field) from exc
