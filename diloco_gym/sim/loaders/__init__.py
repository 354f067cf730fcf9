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

One module per format (:mod:`~diloco_gym.sim.loaders.native`,
:mod:`~diloco_gym.sim.loaders.azure`, :mod:`~diloco_gym.sim.loaders.mooncake`,
:mod:`~diloco_gym.sim.loaders.burstgpt`); the checks they share are in
:mod:`~diloco_gym.sim.loaders.checks` and the CSV reading in
:mod:`~diloco_gym.sim.loaders.csv_table`. This module picks the format
(:func:`detect_format`, :func:`load_trace`); every public name is importable from it.
"""

from __future__ import annotations

import codecs
from pathlib import Path

from diloco_gym.sim.loaders.azure import load_azure
from diloco_gym.sim.loaders.burstgpt import load_burstgpt
from diloco_gym.sim.loaders.checks import (
    DEFAULT_MAX_TOKENS,
    MAX_TOKENS_ENV,
    StrPath,
    TraceFilterWarning,
    check_file,
    max_tokens_bound,
    undecodable,
)
from diloco_gym.sim.loaders.csv_table import csv_fields
from diloco_gym.sim.loaders.mooncake import load_mooncake
from diloco_gym.sim.loaders.native import PARQUET_SUFFIXES, load_native, save_native
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


#: Names accepted by :func:`load_trace` (besides ``"auto"``).
FORMATS: tuple[str, ...] = ("native", "azure", "mooncake", "burstgpt")

_JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")


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
    check_file(str(path))
    if suffix in PARQUET_SUFFIXES:
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
            str(path), f"cannot detect the trace format: not UTF-8 text ({undecodable(exc)})"
        ) from None
    if not text:
        raise TraceFormatError(str(path), "empty file")
    if text.startswith("{") or suffix in _JSONL_SUFFIXES:
        return "mooncake"
    if text.startswith("#"):
        return "native"
    first = text.split("\n", 1)[0].rstrip("\r")
    header = {name.strip() for name in csv_fields(first)}
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
