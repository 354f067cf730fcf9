"""What the calibration schema cannot express: contradictions and impossible values, one
check per documented family (:func:`check_consistency`)."""

from __future__ import annotations

import json
import math

from diloco_gym.eval.calibration.schema import METRICS, CalibrationFileError

#: The smallest plausible p95 ratio: a merge (or high pressure) never makes the sidecar's p95
#: latency more than twice as fast; a smaller measured ratio is a measurement or editing fault.
MIN_PLAUSIBLE_RATIO = 0.5

#: The recorded trace load fields (``metadata.trace``) that must be finite and non-negative.
_TRACE_FIELDS = (
    "rate_rps",
    "duration_s",
    "requests",
    "sent_prompt_tokens_mean",
    "sent_output_tokens_mean",
)


def check_consistency(data: dict, where: str) -> None:
    """Refuse what the schema cannot express: contradictions and impossible values.

    ``complete: true`` beside an ``error``; a confidence interval that is reversed or does
    not contain its point estimate; a p95 ratio below :data:`MIN_PLAUSIBLE_RATIO`; a merge
    ``schedule`` that is not a list of merges with finite, sorted ``start_s >= 0`` and
    ``length_s > 0``; a recorded trace load (``metadata.trace``) that is not finite.

    Raises:
        CalibrationFileError: naming the file and the field at fault.
    """
    check_completeness(data, where)
    for name, entry in data["regimes"].items():
        check_ratios(entry, where, f"regimes.{name}")
    check_schedule(data.get("schedule"), where)
    check_trace_load(data, where)


def check_completeness(data: dict, where: str) -> None:
    """A file that records an ``error`` does not say ``complete: true``."""
    if data.get("complete", True) and data.get("error"):
        raise CalibrationFileError(
            where,
            f"the file says complete: true but records an error "
            f"({str(data['error'])[:120]!r}); a run that failed is not complete",
            "error",
        )


def check_ratios(entry: dict, where: str, prefix: str) -> None:
    """One regime entry's p95 ratios are plausible and inside their confidence intervals,
    which are not reversed."""
    for metric in METRICS:
        field = f"{prefix}.{metric}"
        point = entry.get(metric)
        if point is not None and point < MIN_PLAUSIBLE_RATIO:
            raise CalibrationFileError(
                where,
                f"{point} is physically implausible: a p95 ratio below "
                f"{MIN_PLAUSIBLE_RATIO} would mean merges (or pressure) make the sidecar "
                f"more than twice as fast",
                field,
            )
        ci = entry.get(f"{metric}_ci")
        if ci is None:
            continue
        lo, hi = ci
        if lo > hi:
            raise CalibrationFileError(
                where,
                f"interval [{lo}, {hi}] is reversed (lower end above upper end)",
                field + "_ci",
            )
        if point is not None and not lo <= point <= hi:
            raise CalibrationFileError(
                where,
                f"interval [{lo}, {hi}] does not contain its point estimate {point}",
                field + "_ci",
            )


def check_schedule(schedule: list | None, where: str) -> None:
    """A merge ``schedule`` (when given) is a list of ``{start_s, length_s}`` objects with
    finite ``start_s >= 0``, sorted, and finite ``length_s > 0``."""
    if schedule is None:
        return
    last = -math.inf
    for i, merge in enumerate(schedule):
        if not isinstance(merge, dict) or set(merge) != {"start_s", "length_s"}:
            raise CalibrationFileError(
                where,
                "a merge must be an object with exactly start_s and length_s, got "
                f"{json.dumps(merge)[:80]}",
                f"schedule[{i}]",
            )
        for key in ("start_s", "length_s"):
            v = merge[key]
            ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or (v < 0 if key == "start_s" else v <= 0):
                need = "a finite number >= 0" if key == "start_s" else "a finite number > 0"
                raise CalibrationFileError(
                    where, f"must be {need}, got {json.dumps(v)[:40]}", f"schedule[{i}].{key}"
                )
        if merge["start_s"] < last:
            raise CalibrationFileError(
                where, "merges are not sorted by start_s", f"schedule[{i}].start_s"
            )
        last = merge["start_s"]


def check_trace_load(data: dict, where: str) -> None:
    """The recorded trace load (``metadata.trace``) is finite and non-negative, with a rate
    of at most 1e6 requests per second."""
    trace = (
        data.get("metadata", {}).get("trace", {}) if isinstance(data.get("metadata"), dict) else {}
    )
    if not isinstance(trace, dict):
        return
    for key in _TRACE_FIELDS:
        v = trace.get(key)
        if v is None:
            continue
        bad = isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
        if bad or v < 0 or (key == "rate_rps" and v > 1e6):
            raise CalibrationFileError(
                where,
                "must be a finite number in [0, 1e6] (requests per second)"
                if key == "rate_rps"
                else f"must be a finite number >= 0, got {json.dumps(v)[:40]}",
                f"metadata.trace.{key}",
            )
