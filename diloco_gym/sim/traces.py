"""Request traces: the data a sidecar replays.

A :class:`Trace` is the requests of one serving sidecar over an episode window
(arrival seconds relative to the window start, prompt and output tokens) plus the
exogenous pressure series (network, checkpoint) sampled on a regular grid.
Serving pressure is *not* stored: it is derived from the past load by the sidecar
model, so that it can never leak the future.

Everything here is pure: windowing and rate scaling return new traces, and the
only randomness enters through an explicit ``np.random.Generator``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from diloco_gym.sim import compiled_checks
from diloco_gym.sim.limits import check_limit

__all__ = ["Trace", "TraceFormatError", "window", "scale_rate", "validate_trace", "tile_starts"]

#: Sampling interval of the pressure series, in seconds.
PRESSURE_DT_S = 1.0


class TraceFormatError(ValueError):
    """A trace file or trace array is malformed.

    Attributes:
        path: the file (or ``"<array>"`` for in-memory data).
        row: 1-based data row (header excluded) or ``None`` when the problem is file-wide.
        field: the column or field at fault, or ``None``.
        reason: what is wrong, in words.
    """

    def __init__(
        self, path: str, reason: str, *, row: int | None = None, field: str | None = None
    ) -> None:
        self.path = str(path)
        self.row = row
        self.field = field
        self.reason = reason
        where = self.path
        if row is not None:
            where += f", row {row}"
        if field is not None:
            where += f", field {field!r}"
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True)
class Trace:
    """The requests and pressures of one sidecar over a window.

    Attributes:
        arrival_s: request arrival times in seconds from the window start, sorted, in
            ``[0, duration_s)``.
        prompt_tokens: prompt (context) tokens per request, non-negative integers.
        output_tokens: generated tokens per request, non-negative integers.
        duration_s: length of the window in seconds.
        network: network pressure in [0, 1], one sample per ``PRESSURE_DT_S`` seconds
            (``ceil(duration_s / PRESSURE_DT_S)`` samples), or ``None`` when unknown.
        checkpoint: checkpoint-I/O pressure, same layout as ``network``.
        name: a short label (regime or file name).
        meta: free-form provenance (source file, seed, filtered row counts, ...).
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    duration_s: float
    network: np.ndarray | None = None
    checkpoint: np.ndarray | None = None
    name: str = "trace"
    meta: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "arrival_s", np.asarray(self.arrival_s, dtype=np.float64))
        for name in ("prompt_tokens", "output_tokens"):
            object.__setattr__(self, name, _token_counts(name, getattr(self, name)))
        for name in ("network", "checkpoint"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, np.asarray(value, dtype=np.float64))
        validate_trace(self)

    @property
    def num_requests(self) -> int:
        return int(self.arrival_s.size)

    @property
    def mean_rate_rps(self) -> float:
        return self.num_requests / self.duration_s

    @property
    def num_pressure_samples(self) -> int:
        return int(np.ceil(self.duration_s / PRESSURE_DT_S - 1e-9))

    def __eq__(self, other: object) -> bool:  # arrays need an explicit comparison
        if not isinstance(other, Trace):
            return NotImplemented
        same = (
            self.duration_s == other.duration_s
            and np.array_equal(self.arrival_s, other.arrival_s)
            and np.array_equal(self.prompt_tokens, other.prompt_tokens)
            and np.array_equal(self.output_tokens, other.output_tokens)
        )
        for name in ("network", "checkpoint"):
            a, b = getattr(self, name), getattr(other, name)
            same = same and (
                (a is None and b is None)
                or (a is not None and b is not None and np.array_equal(a, b))
            )
        return bool(same)

    __hash__ = None  # type: ignore[assignment]


def _token_counts(name: str, values: object) -> np.ndarray:
    """``values`` as int64 token counts; NaN, infinities and fractions are refused here,
    before the cast (which would turn NaN into a huge negative number)."""
    try:
        array = np.asarray(values)
        if array.dtype.kind in "fc" or array.dtype == object:
            floats = array.astype(np.float64)
            bad = ~np.isfinite(floats)
            if bad.any():
                row = int(np.argmax(bad.ravel()))
                raise TraceFormatError(
                    "<array>",
                    f"token count {floats.ravel()[row]!s} is not a finite number",
                    row=row + 1,
                    field=name,
                )
            frac = floats != np.floor(floats)
            if frac.any():
                row = int(np.argmax(frac.ravel()))
                raise TraceFormatError(
                    "<array>",
                    f"token count {floats.ravel()[row]!s} is not an integer",
                    row=row + 1,
                    field=name,
                )
        return array.astype(np.int64, copy=False)
    except (OverflowError, TypeError, ValueError) as exc:
        if isinstance(exc, TraceFormatError):
            raise
        raise TraceFormatError(
            "<array>", f"token counts are not integers that fit int64 ({exc})", field=name
        ) from None


def validate_trace(trace: Trace, path: str = "<array>") -> None:
    """Raise :class:`TraceFormatError` if ``trace`` breaks an invariant."""
    if not (np.isfinite(trace.duration_s) and trace.duration_s > 0):
        raise TraceFormatError(path, f"duration_s must be positive, got {trace.duration_s}")
    if trace.arrival_s.ndim != 1:  # first: the other columns' shapes are checked against it
        raise TraceFormatError(
            path,
            f"arrival_s must be one-dimensional, got shape {trace.arrival_s.shape}",
            field="arrival_s",
        )
    n = trace.arrival_s.size
    for name in ("prompt_tokens", "output_tokens"):
        if getattr(trace, name).shape != (n,):
            raise TraceFormatError(
                path, f"{name} has shape {getattr(trace, name).shape}, expected ({n},)", field=name
            )
    checks = compiled_checks()
    if not checks.arrivals_ok(trace.arrival_s, float(trace.duration_s)):
        _arrival_error(trace, path)
    for name in ("prompt_tokens", "output_tokens"):
        if not checks.nonnegative(getattr(trace, name)):
            neg = getattr(trace, name) < 0
            raise TraceFormatError(
                path, "negative token count", row=int(np.argmax(neg)) + 1, field=name
            )
    for name in ("network", "checkpoint"):
        series = getattr(trace, name)
        if series is None:
            continue
        if series.shape != (trace.num_pressure_samples,):
            raise TraceFormatError(
                path,
                f"{name} has {series.shape} samples, expected ({trace.num_pressure_samples},)",
                field=name,
            )
        if not checks.in_unit_interval(series):
            raise TraceFormatError(path, "pressure outside [0, 1] or NaN", field=name)


def _arrival_error(trace: Trace, path: str) -> None:
    """Raise the :class:`TraceFormatError` naming the first broken invariant of
    ``trace.arrival_s`` (one of them is broken: :func:`~diloco_gym.sim.jit_checks.arrivals_ok`
    said so)."""
    n = trace.arrival_s.size
    if not np.isfinite(trace.arrival_s).all():
        bad = ~np.isfinite(trace.arrival_s)
        raise TraceFormatError(
            path, "arrival time is not finite", row=int(np.argmax(bad)) + 1, field="arrival_s"
        )
    # finite values: a difference is negative exactly when the later value is smaller
    if (trace.arrival_s[1:] < trace.arrival_s[:-1]).any():
        row = int(np.argmax(np.diff(trace.arrival_s) < 0)) + 2
        raise TraceFormatError(path, "arrivals are not sorted", row=row, field="arrival_s")
    row = 1 if trace.arrival_s[0] < 0 else n
    raise TraceFormatError(
        path, f"arrival outside the window [0, {trace.duration_s})", row=row, field="arrival_s"
    )


def window(trace: Trace, start_s: float, duration_s: float) -> Trace:
    """Cut ``[start_s, start_s + duration_s)`` out of ``trace``, re-based to start at 0.

    Raises:
        TraceFormatError: when the window is not inside the trace or holds no request.
    """
    path = trace.meta.get("path", trace.name)
    if duration_s <= 0 or start_s < 0 or start_s + duration_s > trace.duration_s + 1e-9:
        raise TraceFormatError(
            path,
            f"window [{start_s}, {start_s + duration_s}) s is not inside the trace "
            f"[0, {trace.duration_s}) s",
        )
    lo, hi = np.searchsorted(trace.arrival_s, [start_s, start_s + duration_s], side="left")
    if hi <= lo:
        raise TraceFormatError(path, f"window [{start_s}, {start_s + duration_s}) s is empty")
    out = {}
    for name in ("network", "checkpoint"):
        series = getattr(trace, name)
        if series is not None:
            first = int(np.floor(start_s / PRESSURE_DT_S))
            count = int(np.ceil(duration_s / PRESSURE_DT_S - 1e-9))
            idx = np.minimum(np.arange(first, first + count), series.size - 1)
            series = series[idx]
        out[name] = series
    meta = dict(trace.meta, window_start_s=float(start_s))
    return Trace(
        trace.arrival_s[lo:hi] - start_s,
        trace.prompt_tokens[lo:hi],
        trace.output_tokens[lo:hi],
        float(duration_s),
        name=trace.name,
        meta=meta,
        **out,
    )


def random_window(trace: Trace, duration_s: float, rng: np.random.Generator) -> Trace:
    """A window of ``duration_s`` at a start drawn uniformly from ``rng``.

    Draws are retried (at most 100 times) when a window happens to be empty; a trace
    with no non-empty window raises :class:`TraceFormatError`.
    """
    span = trace.duration_s - duration_s
    if span < 0:
        raise TraceFormatError(
            trace.meta.get("path", trace.name),
            f"trace of {trace.duration_s:.1f} s is shorter than the {duration_s:.1f} s window",
        )
    for _ in range(100):
        start = float(rng.uniform(0.0, span)) if span > 0 else 0.0
        lo, hi = np.searchsorted(trace.arrival_s, [start, start + duration_s])
        if hi > lo:
            return window(trace, start, duration_s)
    raise TraceFormatError(trace.meta.get("path", trace.name), "no non-empty window found")


def scale_rate(trace: Trace, target_rate_rps: float) -> Trace:
    """Compress or stretch time so that the mean rate becomes ``target_rate_rps``.

    Time is scaled about the window start; the window length scales with it, so every
    request is kept (none is dropped or duplicated). Pressure series are resampled.
    """
    if not (np.isfinite(target_rate_rps) and target_rate_rps > 0):
        raise ValueError(f"target_rate_rps must be positive, got {target_rate_rps}")
    factor = trace.mean_rate_rps / target_rate_rps  # new time = old time * factor
    duration = trace.duration_s * factor
    arrivals = np.minimum(trace.arrival_s * factor, np.nextafter(duration, 0))
    out = {}
    if not np.isfinite(duration):
        raise ValueError(
            f"rate scale {target_rate_rps / trace.mean_rate_rps:.3g} makes the trace "
            f"{trace.duration_s:g} s last {duration} s, not a finite number of seconds"
        )
    count = int(np.ceil(duration / PRESSURE_DT_S - 1e-9))
    if trace.network is not None or trace.checkpoint is not None:
        check_limit(
            "DECISIONS",
            count,
            f"the pressure samples of a trace stretched to {duration:.6g} s",
        )
    for name in ("network", "checkpoint"):
        series = getattr(trace, name)
        if series is not None:
            src = np.minimum(
                (np.arange(count) * PRESSURE_DT_S / factor / PRESSURE_DT_S).astype(np.int64),
                series.size - 1,
            )
            series = series[src]
        out[name] = series
    return replace(
        trace,
        arrival_s=arrivals,
        duration_s=duration,
        meta=dict(trace.meta, rate_scale=float(1 / factor)),
        **out,
    )


def tile_starts(duration_s: float, window_s: float, stride_s: float | None = None) -> list[float]:
    """Start times of the windows that tile ``[0, duration_s)``.

    Windows ``[k * stride_s, k * stride_s + window_s)`` for ``k = 0, 1, ...`` while they fit
    inside the trace; the tail shorter than a window is left out. With the default stride
    (the window length) the windows are disjoint, so episodes cut from them are independent
    units; a shorter stride makes them overlap (not independent), a longer one leaves gaps.

    Raises:
        ValueError: a non-positive or non-finite length, or no window fits.
    """
    stride_s = window_s if stride_s is None else stride_s
    for name, v in (("window_s", window_s), ("stride_s", stride_s)):
        if not (np.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a positive number of seconds, got {v}")
    if not np.isfinite(duration_s):
        raise ValueError(f"the trace lasts {duration_s} s, not a finite number of seconds")
    count_f = np.floor((duration_s - window_s) / stride_s + 1e-9) + 1
    # Checked before the list is built: a long trace or a tiny stride would not fit in memory.
    check_limit(
        "WINDOWS",
        count_f,
        f"a trace of {duration_s:.6g} s cut into {window_s:g} s windows every {stride_s:g} s",
    )
    count = int(count_f)
    if duration_s + 1e-9 < window_s or count < 1:
        raise ValueError(
            f"a trace of {duration_s:.1f} s holds no window of {window_s:.1f} s; "
            f"a window needs at least {window_s:.1f} s of trace (shorten "
            f"--window-s or lower the rate scale)"
        )
    return [k * float(stride_s) for k in range(count)]
