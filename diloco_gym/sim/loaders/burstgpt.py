"""The BurstGPT CSV trace: failed requests (no response tokens) are left out, with a
warning."""

from __future__ import annotations

import warnings

import numpy as np

from diloco_gym.sim.loaders.checks import (
    StrPath,
    TraceFilterWarning,
    check_floats,
    check_sorted,
    default_duration,
    make_trace,
    max_tokens_bound,
)
from diloco_gym.sim.loaders.csv_table import read_csv_chunks, scan_csv
from diloco_gym.sim.traces import Trace, TraceFormatError

_BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


def load_burstgpt(path: StrPath, *, max_tokens: int | None = None) -> Trace:
    """Load a BurstGPT CSV trace, leaving out failed requests.

    Required columns are ``Timestamp`` (seconds, sorted), ``Request tokens`` and
    ``Response tokens``; the others (``Session ID``, ``Elapsed time``, ``Model``,
    ``Total tokens``, ``Log Type``) are not used. Every row is validated first. A
    request is *failed* iff ``Response tokens == 0``: failed rows are removed, counted
    in ``meta["filtered_failed"]`` and reported with a :class:`TraceFilterWarning`.
    Arrivals are seconds since the first kept request; the window ends at the last
    arrival (plus 1e-6 s) rounded up to a whole second. The file is read in chunks
    (:func:`~diloco_gym.sim.loaders.csv_table.read_csv_chunks`).

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
    limit = max_tokens_bound(max_tokens)
    source = scan_csv(spath)
    parts: dict[str, list[np.ndarray]] = {column: [] for column in _BURSTGPT_COLUMNS}
    rows = 0
    last: tuple[np.ndarray, np.ndarray] | None = None  # the previous chunk's last timestamp
    for table in read_csv_chunks(source, _BURSTGPT_COLUMNS, body=source.start):
        raw = table.raw["Timestamp"]
        stamps = check_floats(
            spath, "Timestamp", table.numbers("Timestamp"), raw=raw, first_row=table.first_row
        )
        if last is not None:  # the order across the chunks' boundary
            check_sorted(
                spath,
                "Timestamp",
                np.concatenate([last[0], stamps[:1]]),
                raw=np.concatenate([last[1], raw[:1]]),
                first_row=table.first_row - 1,
            )
        check_sorted(spath, "Timestamp", stamps, raw=raw, first_row=table.first_row)
        prompt = table.token_counts("Request tokens", limit)
        output = table.token_counts("Response tokens", limit)
        kept = output != 0  # every row is validated first; the failed ones are left out
        parts["Timestamp"].append(stamps[kept])
        parts["Request tokens"].append(prompt[kept])
        parts["Response tokens"].append(output[kept])
        last = (stamps[-1:], raw[-1:])
        rows += table.rows
        del table, raw
    stamps = np.concatenate(parts.pop("Timestamp"))
    failed = rows - int(stamps.size)
    if failed == rows:
        raise TraceFormatError(
            spath,
            f"no successful request: all {failed} rows have 'Response tokens' == 0",
            field="Response tokens",
        )
    if failed:
        warnings.warn(
            f"{spath}: filtered {failed} failed request(s) ('Response tokens' == 0) "
            f"out of {rows} rows",
            TraceFilterWarning,
            stacklevel=2,
        )
    first = float(stamps[0])
    arrival = stamps - first
    del stamps
    prompt = np.concatenate(parts.pop("Request tokens"))
    output = np.concatenate(parts.pop("Response tokens"))
    return make_trace(
        spath,
        "burstgpt",
        arrival,
        prompt,
        output,
        default_duration(spath, float(arrival[-1])),
        rows,
        filtered_failed=failed,
        first_timestamp_s=first,
    )
