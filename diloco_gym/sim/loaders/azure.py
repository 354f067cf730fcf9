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
    read_text,
    short,
)
from diloco_gym.sim.loaders.csv_table import CsvTable, read_csv
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

    Returns:
        The trace, with ``meta["start_time"]`` holding the first raw timestamp.

    Raises:
        TraceFormatError: the file is missing, unreadable or malformed.
    """
    spath = str(path)
    table = read_csv(spath, read_text(spath), _AZURE_COLUMNS)
    micros = _timestamps_us(table, "TIMESTAMP")
    check_sorted(spath, "TIMESTAMP", micros, raw=table.raw["TIMESTAMP"])
    arrival = (micros - micros[0]) / 1e6
    limit = max_tokens_bound(max_tokens)
    prompt = table.token_counts("ContextTokens", limit)
    output = table.token_counts("GeneratedTokens", limit)
    return make_trace(
        spath,
        "azure",
        arrival,
        prompt,
        output,
        default_duration(spath, float(arrival[-1])),
        table.rows,
        start_time=str(table.raw["TIMESTAMP"][0]).strip(),
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
        reason = (
            table.empty_reason(row)
            if not value.strip()
            else f"cannot parse timestamp '{short(value)}' (expected 'YYYY-MM-DD HH:MM:SS.fffffff')"
        )
        raise TraceFormatError(table.path, reason, row=row, field=column)
    return stamps.to_numpy().astype("datetime64[us]").astype(np.int64)
