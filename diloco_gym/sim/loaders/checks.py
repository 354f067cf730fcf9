"""What every trace reader shares: the token bound, file access within the size limit, and
the value checks whose errors name the file, the 1-based row and the field, showing the
offending value as it is written in the file."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import TypeAlias

import numpy as np

from diloco_gym.sim import limits as _limits
from diloco_gym.sim.traces import Trace, TraceFormatError

StrPath: TypeAlias = str | os.PathLike[str]

INT_LIMIT = 2**62  # int64 head-room for sums; timestamps beyond it cannot be stored

#: Default plausibility bound on a request's prompt or output tokens (see
#: :mod:`diloco_gym.sim.loaders`).
DEFAULT_MAX_TOKENS = 2**24
#: Environment variable that overrides :data:`DEFAULT_MAX_TOKENS`.
MAX_TOKENS_ENV = "DILOCO_GYM_MAX_TOKENS"


class TraceFilterWarning(UserWarning):
    """Rows of a trace file were deliberately left out (e.g. failed requests)."""


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
        or not 1 <= value <= INT_LIMIT
    ):
        raise ValueError(f"{where} must be an integer in [1, 2**62], got {value!r}")
    return int(value)


def check_file(path: str) -> int:
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


def read_text(path: str) -> str:
    """The whole file as text (UTF-8, optional BOM), or a :class:`TraceFormatError`."""
    size = check_file(path)
    bound = _limits.limit("TRACE_BYTES")
    try:
        with open(path, "rb") as handle:
            # read(n) reserves n bytes up front: ask for the size found (and one byte more,
            # to see growth), then at most up to the limit if the file grew meanwhile
            data = handle.read(size + 1)
            if len(data) > size:
                data += handle.read(bound + 1 - len(data))
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
        raise TraceFormatError(path, f"cannot read: not UTF-8 text ({undecodable(exc)})") from None


class JsonFloat(float):
    """A JSON number that keeps its text, so that messages show it as written."""

    text: str

    def __new__(cls, text: str) -> JsonFloat:
        value = super().__new__(cls, text)
        value.text = text
        return value


def as_written(values: np.ndarray | list, raw: np.ndarray | None, index: int) -> str:
    """Element ``index`` as the file writes it (raw text when known, else plain Python)."""
    if raw is not None:
        return short(str(raw[index]).strip())
    value = values[index]
    value = value.item() if isinstance(value, np.generic) else value
    if isinstance(value, JsonFloat):
        return short(value.text)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str | bool) or value is None:
        return short(json.dumps(value))
    if isinstance(value, int) and abs(value) > 10**60:
        return f"an integer of {len(str(abs(value))):,} digits"
    return short(repr(value))


def short(text: str, width: int = 60) -> str:
    """``text`` for a message: control characters (a NUL byte, say) escaped, and cut to
    ``width`` characters with the full length said, so a huge field is never echoed."""
    text = str(text)
    cut = text[:width]
    shown = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in cut)
    return shown if len(text) <= width else f"{shown}... ({len(text):,} characters)"


def undecodable(exc: UnicodeDecodeError) -> str:
    """Where a file stops being UTF-8, with the byte in hex (never the raw byte)."""
    return f"byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"


def check_ints(
    path: str,
    column: str,
    values: np.ndarray,
    limit: int,
    *,
    raw: np.ndarray | None = None,
    first_row: int = 0,
) -> np.ndarray:
    """Validate token counts: integers (or integral floats) in ``[0, limit]``; return int64.

    ``raw`` holds the column's text as written, for messages; ``first_row`` is the number of
    data rows before ``values[0]`` (a chunk of a longer file), added to the row named.
    """
    if values.dtype.kind in "iu":
        bad = (values < 0) | (values > limit)
        if bad.any():
            row = int(np.argmax(bad))
            shown = as_written(values, raw, row)
            reason = f"negative token count {shown}" if values[row] < 0 else too_large(shown, limit)
            raise TraceFormatError(path, reason, row=first_row + row + 1, field=column)
        return values.astype(np.int64, copy=False)
    values = values.astype(np.float64)
    finite = np.isfinite(values)
    whole = finite & (values == np.floor(np.where(finite, values, 0.0)))
    bad = ~whole | (values < 0) | (values > limit)
    if bad.any():
        row = int(np.argmax(bad))
        value = values[row]
        shown = as_written(values, raw, row)
        if not finite[row]:
            reason = f"token count {shown} is not a finite number"
        elif not whole[row]:
            reason = f"token count {shown} is not an integer"
        elif value < 0:
            reason = f"negative token count {shown}"
        else:
            reason = too_large(shown, limit)
        raise TraceFormatError(path, reason, row=first_row + row + 1, field=column)
    return values.astype(np.int64)


def too_large(shown: str, limit: int) -> str:
    return (
        f"token count {shown} is too large: above the plausible maximum of {limit} "
        f"tokens per request (pass max_tokens= or set {MAX_TOKENS_ENV} to change it)"
    )


def check_floats(
    path: str,
    column: str,
    values: np.ndarray,
    *,
    nonnegative: bool = False,
    raw: np.ndarray | None = None,
    first_row: int = 0,
) -> np.ndarray:
    """Validate finite (and optionally non-negative) floats; return float64 (``first_row``:
    as for :func:`check_ints`)."""
    values = values.astype(np.float64)
    bad = ~np.isfinite(values)
    if nonnegative:
        bad |= values < 0
    if bad.any():
        row = int(np.argmax(bad))
        shown = as_written(values, raw, row)
        reason = (
            f"value {shown} is not a finite number"
            if not np.isfinite(values[row])
            else f"negative value {shown}"
        )
        raise TraceFormatError(path, reason, row=first_row + row + 1, field=column)
    return values


def check_sorted(
    path: str,
    column: str,
    values: np.ndarray,
    raw: np.ndarray | None = None,
    *,
    first_row: int = 0,
) -> None:
    """Raise at the first row whose value is smaller than the previous row's (``first_row``:
    as for :func:`check_ints`)."""
    down = np.diff(values) < 0
    if down.any():
        row = int(np.argmax(down)) + 2  # 1-based index of the later element
        raise TraceFormatError(
            path,
            f"not sorted: {as_written(values, raw, row - 1)} comes after "
            f"{as_written(values, raw, row - 2)}",
            row=first_row + row,
            field=column,
        )


def default_duration(path: str, last_arrival_s: float) -> float:
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


def make_trace(
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
