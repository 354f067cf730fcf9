"""The Mooncake (Kimi, FAST'25) JSON Lines trace: 3 s timestamp buckets spread with a seeded
generator."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from diloco_gym.sim.loaders.checks import (
    INT_LIMIT,
    JsonFloat,
    StrPath,
    as_written,
    check_sorted,
    make_trace,
    max_tokens_bound,
    read_text,
    short,
    too_large,
)
from diloco_gym.sim.traces import Trace, TraceFormatError

_MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")


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
    values, rows_read = _read_rows(spath, max_tokens_bound(max_tokens))
    stamps = np.asarray(values["timestamp"], dtype=np.int64)
    check_sorted(spath, "timestamp", stamps)
    arrival, starts = _spread_buckets(stamps, seed, bucket_s)
    duration = float(math.ceil(starts[-1] + bucket_s))
    return make_trace(
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


def _read_rows(path: str, limit: int) -> tuple[dict[str, list[int]], int]:
    """The three integer fields of every non-blank line, in file order, and the number of
    such lines. Blank lines are skipped (as JSON Lines readers do); row numbers still
    count them."""
    lines = read_text(path).rstrip().split("\n")
    if lines == [""]:
        raise TraceFormatError(path, "empty file")
    values: dict[str, list[int]] = {key: [] for key in _MOONCAKE_KEYS}
    rows_read = 0
    for row, line in enumerate(lines, start=1):
        if not line.strip():
            continue  # JSON Lines readers skip blank lines; row numbers still count them
        rows_read += 1
        obj = _parse_object(path, line, row, last=row == len(lines))
        for key, sink in values.items():
            bound = INT_LIMIT if key == "timestamp" else limit
            sink.append(_json_count(path, obj, key, row, bound))
    return values, rows_read


def _parse_object(path: str, line: str, row: int, *, last: bool) -> dict[str, Any]:
    """One line as a JSON object (numbers keep their text, a repeated key is an error)."""
    try:
        obj = json.loads(
            line,
            parse_float=JsonFloat,
            parse_constant=JsonFloat,
            object_pairs_hook=_unique_keys,
        )
    except json.JSONDecodeError as exc:
        hint = " (truncated last line?)" if last else ""
        raise TraceFormatError(
            path, f"invalid JSON ({exc.msg}, column {exc.colno}){hint}", row=row
        ) from exc
    except (RecursionError, ValueError) as exc:  # deep nesting, huge integer literals
        raise TraceFormatError(
            path, f"invalid JSON ({type(exc).__name__}: {str(exc)[:100]})", row=row
        ) from None
    if not isinstance(obj, dict):
        raise TraceFormatError(path, f"expected a JSON object, got {type(obj).__name__}", row=row)
    return obj


def _spread_buckets(
    stamps: np.ndarray, seed: int, bucket_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Arrivals spread inside their buckets (see :func:`load_mooncake`) and the buckets'
    start times in seconds."""
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
    return arrival, starts


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook``: a key given twice in one JSON object is an error (``json``
    would keep the last value silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key '{short(key)}'")
        out[key] = value
    return out


def _json_count(path: str, obj: dict, key: str, row: int, limit: int) -> int:
    """A non-negative integer field (at most ``limit``) of one JSONL object."""
    if key not in obj:
        raise TraceFormatError(path, f"missing key {key!r}", row=row, field=key)
    value = obj[key]
    shown = as_written([value], None, 0)
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
            too_large(shown, limit)
            if key != "timestamp"
            else f"timestamp {shown} is too large (at most 2**62 ms)"
        )
        raise TraceFormatError(path, reason, row=row, field=key)
    return int(value)
