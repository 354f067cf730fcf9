"""The native format: this project's own CSV or Parquet (``arrival_s``, ``prompt_tokens``,
``output_tokens``), read and written; Parquet needs the optional pyarrow extra."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from diloco_gym.sim.loaders.checks import (
    StrPath,
    as_written,
    check_file,
    check_floats,
    check_ints,
    check_sorted,
    default_duration,
    make_trace,
    max_tokens_bound,
    short,
    undecodable,
)
from diloco_gym.sim.loaders.csv_table import read_csv_chunks, scan_csv
from diloco_gym.sim.traces import Trace, TraceFormatError

PARQUET_SUFFIXES = (".parquet", ".pq")
_NATIVE_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
_DURATION_LINE = re.compile(r"#\s*duration_s\s*=\s*(\S+)\s*")


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
    if Path(path).suffix.lower() not in PARQUET_SUFFIXES:
        return _load_native_csv(spath, limit)
    columns, rows, duration = _read_native_parquet(spath)
    arrival = check_floats(spath, "arrival_s", columns["arrival_s"], nonnegative=True)
    prompt = check_ints(spath, "prompt_tokens", columns["prompt_tokens"], limit)
    output = check_ints(spath, "output_tokens", columns["output_tokens"], limit)
    check_sorted(spath, "arrival_s", arrival)
    if duration is not None:
        _check_before(spath, arrival, duration, None, 0)
    return _native_trace(spath, arrival, prompt, output, duration, rows)


def _load_native_csv(path: str, limit: int) -> Trace:
    """A native CSV, read and checked :data:`~diloco_gym.sim.loaders.csv_table.CHUNK_ROWS`
    rows at a time.

    Only one chunk's raw strings are alive at a time, so the load needs the three typed
    columns (24 bytes a request, about 1.2 times a typical file) plus a fixed amount; the
    columns are joined one at a time at the end. Every value is checked as it is read, so
    the first bad row of the file is the one reported.
    """
    source = scan_csv(path)
    first, after = source.line_at(source.start)
    duration = None
    header_line, body = 0, source.start
    if first.startswith("#"):
        duration = _parse_duration(path, first.rstrip("\r"))
        header_line, body = 1, after
    parts: dict[str, list[np.ndarray]] = {column: [] for column in _NATIVE_COLUMNS}
    rows = 0
    last: tuple[np.ndarray, np.ndarray] | None = None  # the previous chunk's last arrival
    for table in read_csv_chunks(source, _NATIVE_COLUMNS, body=body, header_line=header_line):
        raw = table.raw["arrival_s"]
        arrival = check_floats(
            path,
            "arrival_s",
            table.numbers("arrival_s"),
            nonnegative=True,
            raw=raw,
            first_row=table.first_row,
        )
        if last is not None:  # the order across the chunks' boundary
            check_sorted(
                path,
                "arrival_s",
                np.concatenate([last[0], arrival[:1]]),
                raw=np.concatenate([last[1], raw[:1]]),
                first_row=table.first_row - 1,
            )
        check_sorted(path, "arrival_s", arrival, raw=raw, first_row=table.first_row)
        if duration is not None:
            _check_before(path, arrival, duration, raw, table.first_row)
        parts["arrival_s"].append(arrival)
        parts["prompt_tokens"].append(table.token_counts("prompt_tokens", limit))
        parts["output_tokens"].append(table.token_counts("output_tokens", limit))
        last = (arrival[-1:], raw[-1:])
        rows += table.rows
        del table, raw
    columns = {}
    for column in _NATIVE_COLUMNS:  # one at a time: the peak is one column over the total
        columns[column] = np.concatenate(parts.pop(column))
    return _native_trace(
        path,
        columns["arrival_s"],
        columns["prompt_tokens"],
        columns["output_tokens"],
        duration,
        rows,
    )


def _check_before(
    path: str, arrival: np.ndarray, duration: float, raw: np.ndarray | None, first_row: int
) -> None:
    """Every (sorted) arrival must be before the stored ``duration_s``."""
    late = int(np.searchsorted(arrival, duration, side="left"))
    if late < arrival.size:
        raise TraceFormatError(
            path,
            f"arrival {as_written(arrival, raw, late)} s is not before duration_s={duration!r}",
            row=first_row + late + 1,
            field="arrival_s",
        )


def _native_trace(
    path: str,
    arrival: np.ndarray,
    prompt: np.ndarray,
    output: np.ndarray,
    duration: float | None,
    rows: int,
) -> Trace:
    """The trace, its window length inferred when the file stores none."""
    source = "file"
    if duration is None:
        duration = default_duration(path, float(arrival[-1]))
        source = "inferred"
    return make_trace(
        path, "native", arrival, prompt, output, duration, rows, duration_source=source
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
    if Path(path).suffix.lower() in PARQUET_SUFFIXES:
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


def _parse_duration(path: str, line: str) -> float:
    """Parse the native metadata line ``# duration_s=<seconds>``."""
    match = _DURATION_LINE.fullmatch(line)
    if not match:
        raise TraceFormatError(
            path,
            f"unrecognised metadata line '{short(line, 100)}'; expected '# duration_s=<seconds>'",
            field="duration_s",
        )
    try:
        duration = float(match.group(1))
    except ValueError:
        duration = math.nan
    if not (math.isfinite(duration) and duration > 0):
        raise TraceFormatError(
            path,
            f"duration_s must be a positive number, got '{short(match.group(1))}'",
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
    check_file(path)
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
                f"duration_s metadata is not UTF-8 text ({undecodable(exc)})",
                field="duration_s",
            ) from None
        duration = _parse_duration(path, "# duration_s=" + text)
    return columns, table.num_rows, duration


# --------------------------------------------------------------------------- validation
