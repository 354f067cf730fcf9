"""The Azure LLM inference trace (2023) CSV: wall-clock timestamps to arrival seconds."""

from __future__ import annotations

import numpy as np
import pandas as pd

from diloco_gym.sim.loaders.checks import (
    StrPath,
    check_sorted,
    default_duration,
    make_trace,
    max_tokens_bound,
    short,
)
from diloco_gym.sim.loaders.csv_table import CsvTable, read_csv_chunks, scan_csv
from diloco_gym.sim.traces import Trace, TraceFormatError

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_TIMESTAMP_RE = r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?"
_LEAP_SECOND = r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:)60(?:\.\d*)?$"


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

    The file is read in chunks (:func:`~diloco_gym.sim.loaders.csv_table.read_csv_chunks`),
    so a load needs the typed columns and a fixed amount, not a multiple of the file.

    Returns:
        The trace, with ``meta["start_time"]`` holding the first raw timestamp.

    Raises:
        TraceFormatError: the file is missing, unreadable or malformed.
    """
    spath = str(path)
    limit = max_tokens_bound(max_tokens)
    source = scan_csv(spath)
    parts: dict[str, list[np.ndarray]] = {column: [] for column in _AZURE_COLUMNS}
    rows = 0
    start_time = ""
    last: tuple[np.ndarray, np.ndarray] | None = None  # the previous chunk's last timestamp
    for table in read_csv_chunks(source, _AZURE_COLUMNS, body=source.start):
        raw = table.raw["TIMESTAMP"]
        micros = _timestamps_us(table, "TIMESTAMP")
        if last is None:
            start_time = str(raw[0]).strip()
        else:  # the order across the chunks' boundary
            check_sorted(
                spath,
                "TIMESTAMP",
                np.concatenate([last[0], micros[:1]]),
                raw=np.concatenate([last[1], raw[:1]]),
                first_row=table.first_row - 1,
            )
        check_sorted(spath, "TIMESTAMP", micros, raw=raw, first_row=table.first_row)
        parts["TIMESTAMP"].append(micros)
        parts["ContextTokens"].append(table.token_counts("ContextTokens", limit))
        parts["GeneratedTokens"].append(table.token_counts("GeneratedTokens", limit))
        last = (micros[-1:], raw[-1:])
        rows += table.rows
        del table, raw
    micros = np.concatenate(parts.pop("TIMESTAMP"))
    arrival = (micros - micros[0]) / 1e6
    del micros
    prompt = np.concatenate(parts.pop("ContextTokens"))
    output = np.concatenate(parts.pop("GeneratedTokens"))
    return make_trace(
        spath,
        "azure",
        arrival,
        prompt,
        output,
        default_duration(spath, float(arrival[-1])),
        rows,
        start_time=start_time,
    )


def _timestamps_us(table: CsvTable, column: str) -> np.ndarray:
    """Parse ``YYYY-MM-DD HH:MM:SS[.f...]`` timestamps to int64 microseconds.

    Raises:
        TraceFormatError: at the first empty or unparseable timestamp.
    """
    raw = table.raw[column]
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
        row += table.first_row
        reason = (
            table.empty_reason(row)
            if not value.strip()
            else f"cannot parse timestamp '{short(value)}' (expected 'YYYY-MM-DD HH:MM:SS.fffffff')"
        )
        raise TraceFormatError(table.path, reason, row=row, field=column)
    return stamps.to_numpy().astype("datetime64[us]").astype(np.int64)
