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
    read_text,
)
from diloco_gym.sim.loaders.csv_table import read_csv
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
    table = read_csv(spath, read_text(spath), _BURSTGPT_COLUMNS)
    limit = max_tokens_bound(max_tokens)
    stamps = check_floats(
        spath, "Timestamp", table.numbers("Timestamp"), raw=table.raw["Timestamp"]
    )
    check_sorted(spath, "Timestamp", stamps, raw=table.raw["Timestamp"])
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
    return make_trace(
        spath,
        "burstgpt",
        arrival,
        prompt,
        output,
        default_duration(spath, float(arrival[-1])),
        table.rows,
        filtered_failed=failed,
        first_timestamp_s=float(stamps[0]),
    )
