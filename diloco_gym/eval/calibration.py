"""Effect-size transfer (docs/calibration.md): simulated vs real-sidecar effect sizes.

The simulator supports an SLO claim in a regime only when its effect sizes match what a
real sidecar showed. The real measurements ship as ``data/calibration_reference.json``
(the reference implementation's result files, GitHub maincodeMax/workload-aware-diloco);
a user can pass their own file with the same layout (``diloco-gym report --calibration
FILE``). Every file is validated against ``data/calibration.schema.json``.

Simulated effect sizes are measured on a fixed-256 schedule (merges every 256 steps),
pooling the requests of several seeds so that the p95s are stable.

Verdicts per regime:

* ``no measurable SLO effect``: the real sync ratio is within ``tolerance`` of 1, so merges
  did not measurably slow the real sidecar and no SLO claim about merges is possible;
* ``calibrated``: the simulated sync ratio and high/low ratio are both within
  ``tolerance`` of the real ones;
* ``uncalibrated``: otherwise.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from diloco_gym.envs import core
from diloco_gym.sim.learners import LearnerParams
from diloco_gym.sim.regimes import REGIMES, get_regime
from diloco_gym.sim.sidecar import SidecarParams, effect_sizes, percentile

__all__ = [
    "load_calibration",
    "simulated_effect_sizes",
    "transfer_verdict",
    "fit_sidecar",
    "measured_intervals",
    "Calibration",
    "CalibrationFileError",
    "calibration_schema",
    "validate_calibration",
    "measured_utilization",
    "measured_merge_plan",
    "simulate_as_measured",
    "read_json_file",
    "check_consistency",
]

TOLERANCE = 0.05
METRICS = ("p95_high_low", "p95_sync_ratio")


@dataclass(frozen=True)
class Calibration:
    """Real-sidecar measurements per regime.

    Attributes:
        source: where the numbers come from.
        regimes: regime -> {"p95_high_low", "p95_sync_ratio", optional
            "pressure_latency_corr", optional "calibrated_on"}.
        path: the file it was read from.
    """

    source: str
    regimes: dict
    path: str
    fitted_sidecar: SidecarParams | None = None
    user_regimes: tuple[str, ...] = ()
    complete: bool = True
    #: why the fitted sidecar lies outside the model's range (its nominal service time
    #: alone reaches the SLO, so every request violates it), or ``None``.
    out_of_range: str | None = None

    def measured_on(self, regime: str) -> str:
        """The regime whose measurements apply to ``regime`` (following ``calibrated_on``)."""
        entry = self.regimes.get(regime, {})
        on = entry.get("calibrated_on", regime)
        return on if on == regime else self.measured_on(on)

    def sidecar_for(self, regime: str) -> SidecarParams | None:
        """Fitted sidecar parameters that apply to ``regime``, if the file has them.

        A live calibration file (``diloco-gym calibrate``) fits the sidecar model to its
        measurements; those parameters drive the simulation of the measured regime and of
        the regimes calibrated on it. ``None`` means: keep the regime's defaults.
        """
        if self.fitted_sidecar is None:
            return None
        return self.fitted_sidecar if self.measured_on(regime) in self.user_regimes else None

    def measured(self, regime: str) -> dict:
        """Measurements that apply to ``regime`` (following ``calibrated_on``)."""
        entry = self.regimes.get(regime)
        if entry is None:
            raise KeyError(
                f"calibration file {self.path} has no entry for regime {regime!r}; "
                f"it has {sorted(self.regimes)}"
            )
        on = entry.get("calibrated_on", regime)
        if on != regime:
            base = dict(self.measured(on))
            base["calibrated_on"] = on
            return base
        return entry


class CalibrationFileError(ValueError):
    """A calibration file is missing, unreadable or breaks the schema.

    The schema is ``diloco_gym/data/calibration.schema.json`` (JSON Schema, shipped with
    the package) plus two rules checked in code: an entry without ``calibrated_on`` needs
    both p95 ratios, and ``calibrated_on`` chains must end at a measured regime.

    Attributes:
        path: the file.
        field: dotted path of the field at fault (``regimes.bursty.calibrated_on``), or
            ``None`` when the problem is file-wide.
        reason: what is wrong, in words.
    """

    def __init__(
        self, path: str, reason: str, field: str | None = None, *, field_in_reason: bool = False
    ) -> None:
        self.path = str(path)
        self.field = field
        self.reason = reason
        # field_in_reason: the reason already names the field (``x has unknown field 'y'``).
        where = self.path if field is None or field_in_reason else f"{self.path}: field {field!r}"
        super().__init__(f"{where}: {reason}")


SCHEMA_RESOURCE = "data/calibration.schema.json"


def calibration_schema() -> dict:
    """The JSON Schema of calibration files (shipped as package data)."""
    return json.loads(
        resources.files("diloco_gym").joinpath(SCHEMA_RESOURCE).read_text(encoding="utf-8-sig")
    )


_JSON_TYPES = {
    "object": "an object",
    "array": "a list",
    "string": "a string",
    "number": "a number",
    "integer": "an integer",
    "boolean": "a JSON boolean (true or false)",
    "null": "null",
}


def _shown(value: Any) -> str:
    """A value as JSON writes it (``"false"`` stays quoted), shortened."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _field(prefix: str, path: Iterable[Any]) -> str:
    out = prefix
    for part in path:
        out = f"{out}[{part}]" if isinstance(part, int) else _join(out, str(part))
    return out


def _non_finite(value: Any, field: str) -> str | None:
    """The dotted field of the first non-finite number (JSON has none; Python's reader
    accepts NaN and Infinity, and JSON Schema's range keywords let NaN through)."""
    if isinstance(value, float) and not math.isfinite(value):
        return field
    if isinstance(value, dict):
        for key, item in value.items():
            bad = _non_finite(item, _join(field, str(key)))
            if bad is not None:
                return bad
    if isinstance(value, list):
        for i, item in enumerate(value):
            bad = _non_finite(item, f"{field}[{i}]")
            if bad is not None:
                return bad
    return None


@lru_cache(maxsize=8)
def _validator(schema_text: str):
    from jsonschema import Draft202012Validator

    schema = json.loads(schema_text)
    Draft202012Validator.check_schema(schema)  # the shipped schema is itself valid
    return Draft202012Validator(schema)


def validate_schema(value: Any, schema: dict, where: str, field: str = "") -> None:
    """Validate ``value`` against a JSON Schema (draft 2020-12, every keyword, with the
    ``jsonschema`` library), and require finite numbers.

    Raises:
        CalibrationFileError: one line naming the dotted field of the first violation
            (in document order) and what is wrong.
    """
    bad = _non_finite(value, field)
    if bad is not None:
        shown = _shown(_lookup(value, bad, field))
        raise CalibrationFileError(where, f"{shown} is not a finite number", bad or None)
    validator = _validator(json.dumps(schema))  # key order kept: messages list fields in it
    errors = list(validator.iter_errors(value))
    if not errors:
        return
    # The shallowest field first; at one field, a wrong type before what the value breaks.
    error = min(
        errors,
        key=lambda e: (
            len(e.absolute_path),
            [str(p) for p in e.absolute_path],
            e.validator != "type",
        ),
    )
    raise _schema_error(error, where, _field(field, error.absolute_path))


def _lookup(value: Any, dotted: str, prefix: str) -> Any:
    """The value at a dotted field from :func:`_non_finite` (for the message)."""
    import re

    rest = dotted[len(prefix) :].lstrip(".")
    for name, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", rest):
        value = value[int(index)] if index else value[name]
    return value


def _schema_error(error: Any, where: str, field: str) -> CalibrationFileError:
    """One jsonschema error in this module's wording."""
    kind, sch, value = error.validator, error.schema, error.instance
    if "propertyNames" in error.schema_path:
        names = sch.get("enum", [])
        return CalibrationFileError(
            where, f"unknown key {value!r}; valid keys: {', '.join(names)}", field or None
        )
    if kind == "type":
        kinds = [sch["type"]] if isinstance(sch["type"], str) else list(sch["type"])
        wanted = " or ".join(_JSON_TYPES.get(k, k) for k in kinds)
        return CalibrationFileError(where, f"must be {wanted}, got {_shown(value)}", field or None)
    if kind == "enum":
        return CalibrationFileError(
            where,
            f"{_shown(value)} is not one of {', '.join(map(str, sch['enum']))}",
            field or None,
        )
    if kind in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        low, high, open_low = sch.get("minimum"), sch.get("maximum"), sch.get("exclusiveMinimum")
        lo_text = f"({open_low}" if open_low is not None else f"[{low}"
        hi_text = f"{high}]" if high is not None else "inf)"
        return CalibrationFileError(
            where, f"{_shown(value)} is outside the documented range {lo_text}, {hi_text}",
            field or None,
        )  # fmt: skip
    if kind == "minLength" and isinstance(value, str) and not value:
        return CalibrationFileError(where, "must not be empty", field or None)
    if kind in ("minItems", "maxItems"):
        return CalibrationFileError(
            where,
            f"must have {sch.get('minItems', 0)} to {sch.get('maxItems', 'any number of')} "
            f"items, got {len(value)}",
            field or None,
        )
    if kind == "required":
        missing = next(k for k in error.validator_value if k not in value)
        return CalibrationFileError(where, "required field is missing", _join(field, missing))
    if kind == "additionalProperties" and error.validator_value is False:
        props = sch.get("properties", {})
        key = next(k for k in value if k not in props)
        return CalibrationFileError(
            where,
            f"{field or 'the file'} has unknown field {key!r}; valid fields: {', '.join(props)}",
            _join(field, key),
            field_in_reason=True,
        )
    # Any other keyword of the schema: jsonschema's own message, on one line.
    return CalibrationFileError(where, " ".join(error.message.split()), field or None)


def _check_chains(regimes: dict, where: str, owned: Iterable[str]) -> None:
    """Every ``calibrated_on`` chain of the ``owned`` entries ends at a measured regime."""
    for name in owned:
        seen = [name]
        entry = regimes[name]
        while "calibrated_on" in entry:
            target = entry["calibrated_on"]
            field = f"regimes.{seen[-1]}.calibrated_on"
            if target in seen:
                cycle = " -> ".join([*seen[seen.index(target) :], target])
                raise CalibrationFileError(
                    where, f"calibrated_on forms a cycle ({cycle})", f"regimes.{name}.calibrated_on"
                )
            if target not in regimes:
                raise CalibrationFileError(
                    where,
                    f"names regime {target!r}, which has no "
                    f"entry; entries: {', '.join(sorted(regimes))}",
                    field,
                )
            seen.append(target)
            entry = regimes[target]


def validate_calibration(data: Any, where: str) -> None:
    """Validate a parsed calibration file against the schema and the chain rules.

    Raises:
        CalibrationFileError: naming the file and the field at fault.
    """
    validate_schema(data, calibration_schema(), where)
    regimes = data["regimes"]
    for name, entry in regimes.items():
        if "calibrated_on" in entry:
            continue
        for metric in METRICS:
            if metric not in entry:
                raise CalibrationFileError(
                    where,
                    "required field is missing (an entry "
                    "without calibrated_on needs both p95 ratios)",
                    f"regimes.{name}.{metric}",
                )
    _check_chains(regimes, where, regimes)


#: The smallest plausible p95 ratio: a merge (or high pressure) never makes the sidecar's p95
#: latency more than twice as fast; a smaller measured ratio is a measurement or editing fault.
MIN_PLAUSIBLE_RATIO = 0.5


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    """``object_pairs_hook`` of every JSON file read here: a key given twice is an error
    (``json`` would silently keep the last value)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            shown = key if len(key) <= 60 else key[:60] + "..."
            raise ValueError(
                f"duplicate key {shown!r} (given twice in one object: which value is meant "
                f"is ambiguous)"
            )
        out[key] = value
    return out


def read_json_file(path: str | Path, what: str = "calibration file") -> Any:
    """Parse a JSON file strictly: a regular file of at most ``DILOCO_GYM_MAX_CALIBRATION_BYTES``
    bytes, UTF-8 with or without a byte-order mark, no key given twice in one object.

    Raises:
        CalibrationFileError: naming the file and what is wrong (never swallowed).
    """
    import os
    import stat

    from diloco_gym.sim import limits

    where = str(path)
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise CalibrationFileError(where, f"cannot read {what}: not a regular file")
        limits.check_limit("CALIBRATION_BYTES", info.st_size, f"{what} size in bytes")
        with open(path, "rb") as handle:
            raw = handle.read(limits.limit("CALIBRATION_BYTES") + 1)
        text = raw.decode("utf-8-sig")
    except limits.LimitError as exc:
        raise CalibrationFileError(where, str(exc)) from None
    except OSError as exc:
        raise CalibrationFileError(where, f"cannot read {what}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise CalibrationFileError(
            where,
            f"cannot read {what}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset "
            f"{exc.start})",
        ) from None
    return _parse_json(text, where)


def _parse_json(text: str, where: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except (ValueError, RecursionError) as exc:  # also deep nesting, 5000-digit integers
        raise CalibrationFileError(where, f"not valid JSON: {str(exc)[:200]}") from None


def check_consistency(data: dict, where: str) -> None:
    """Refuse what the schema cannot express: contradictions and impossible values.

    ``complete: true`` beside an ``error``; a confidence interval that is reversed or does
    not contain its point estimate; a p95 ratio below :data:`MIN_PLAUSIBLE_RATIO`; a merge
    ``schedule`` that is not a list of merges with finite, sorted ``start_s >= 0`` and
    ``length_s > 0``; a recorded trace load (``metadata.trace``) that is not finite.

    Raises:
        CalibrationFileError: naming the file and the field at fault.
    """
    if data.get("complete", True) and data.get("error"):
        raise CalibrationFileError(
            where,
            f"the file says complete: true but records an error "
            f"({str(data['error'])[:120]!r}); a run that failed is not complete",
            "error",
        )
    for name, entry in data["regimes"].items():
        for metric in METRICS:
            field = f"regimes.{name}.{metric}"
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
    schedule = data.get("schedule")
    if schedule is not None:
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
    trace = (
        data.get("metadata", {}).get("trace", {}) if isinstance(data.get("metadata"), dict) else {}
    )
    if isinstance(trace, dict):
        for key in (
            "rate_rps",
            "duration_s",
            "requests",
            "sent_prompt_tokens_mean",
            "sent_output_tokens_mean",
        ):
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


def load_calibration(path: str | Path | None = None, *, allow_empty: bool = False) -> Calibration:
    """Read a calibration file (default: the shipped reference measurements).

    A user file is read strictly (:func:`read_json_file`: UTF-8 with or without a
    byte-order mark, no duplicate keys) and checked for contradictions
    (:func:`check_consistency`). A file that measured nothing (``regimes`` empty: a live run
    interrupted before any request succeeded) is refused unless ``allow_empty`` (it would
    silently stand for the reference's numbers).

    A user file (for example from ``diloco-gym calibrate``) overrides the reference entry by
    entry: regimes it does not measure keep the reference's numbers, and regimes
    calibrated on a regime it does measure (bursty on sync-heavy) follow the new numbers.
    A ``fitted_sidecar`` object in the file is validated and exposed as
    :attr:`Calibration.fitted_sidecar`. Every file is validated against
    ``diloco_gym/data/calibration.schema.json`` (see :class:`CalibrationFileError`).

    Raises:
        CalibrationFileError: (a ``ValueError``) naming the file and field when the file is
            missing, unreadable or malformed.
    """
    if path is None:
        return _read_calibration(None)
    base = _read_calibration(None)
    user = _read_calibration(path)
    if not user.regimes and not allow_empty:
        raise CalibrationFileError(
            user.path,
            "the file measured nothing (no regime has measurements: a live run stopped "
            "before any request succeeded?); leave out the calibration file to use the "
            "shipped reference measurements",
            "regimes",
        )
    regimes = dict(base.regimes)
    regimes.update(user.regimes)
    # The user's entries may point at the reference's (and vice versa): check the merge.
    _check_chains(regimes, user.path, user.user_regimes)
    return Calibration(
        user.source,
        regimes,
        user.path,
        user.fitted_sidecar,
        tuple(user.regimes),
        user.complete,
        user.out_of_range,
    )


def _read_calibration(path: str | Path | None) -> Calibration:
    if path is None:
        text = (
            resources.files("diloco_gym")
            .joinpath("data/calibration_reference.json")
            .read_text(encoding="utf-8-sig")
        )
        where = "diloco_gym/data/calibration_reference.json"
        data = _parse_json(text, where)
    else:
        where = str(path)
        data = read_json_file(path)
    validate_calibration(data, where)
    check_consistency(data, where)
    fitted = None
    if data.get("fitted_sidecar"):
        try:
            fitted = SidecarParams(**data["fitted_sidecar"])
        except ValueError as exc:  # defensive: the schema's ranges are stricter
            raise CalibrationFileError(where, str(exc), "fitted_sidecar") from exc
        shortest = min(float(getattr(r, "duration_s", 600.0)) for r in REGIMES.values())
        min_s = core.min_episode_seconds(core.EnvParams(), fitted)
        if min_s > shortest:
            raise CalibrationFileError(
                where,
                f"{fitted.tail_s:g} s leaves no room for an episode: with it an episode needs "
                f"at least {min_s:.1f} s, the regimes' episodes last {shortest:g} s",
                "fitted_sidecar.tail_s",
            )
    return Calibration(
        str(data["source"]),
        dict(data["regimes"]),
        where,
        fitted,
        tuple(data["regimes"]),
        data.get("complete", True),
        slower_than_slo(fitted, data) if fitted is not None else None,
    )


def slower_than_slo(fitted: SidecarParams, doc: dict) -> str | None:
    """Why a fitted sidecar is outside the model's range, or ``None``: its nominal service
    time for the measured mean request (``metadata.trace``; the TTFT alone when not
    recorded) reaches the SLO, so every request violates it and merges cannot change that
    (for example a server far slower than the SLO)."""
    meta = doc.get("metadata")
    trace = meta.get("trace", {}) if isinstance(meta, dict) else {}
    trace = trace if isinstance(trace, dict) else {}
    prompt = float(trace.get("sent_prompt_tokens_mean") or 0.0)
    output = float(trace.get("sent_output_tokens_mean") or 0.0)
    service_ms = (
        fitted.ttft_ms + fitted.prefill_ms_per_token * prompt + fitted.decode_ms_per_token * output
    )
    if service_ms < fitted.slo_ms:
        return None
    return (
        f"the fitted sidecar serves the measured mean request in {service_ms:,.0f} ms (TTFT "
        f"{fitted.ttft_ms:,.0f} ms), at or above the {fitted.slo_ms:,.0f} ms SLO: every "
        f"request violates it, outside the model's range (a server slower than the SLO)"
    )


def measured_utilization(path: str | Path | None, sidecar: SidecarParams) -> float | None:
    """The utilization a live calibration file was measured at, under ``sidecar``.

    ``diloco-gym calibrate`` records the replayed rate and the mean prompt and output
    tokens it sent (``metadata.trace``); the nominal service time is linear in the tokens,
    so the mean offered work over capacity is
    ``rate * base_latency(mean prompt, mean output) / slots`` exactly. ``None`` for the
    shipped reference (measured on the regimes' own loads) or a file without those fields.
    """
    return _utilization_of(_live_document(path), sidecar)


def _live_document(path: str | Path | None) -> dict:
    """A calibration file's JSON, read once for the fields of a live run (``{}`` for the
    shipped reference). Read as strictly as :func:`load_calibration` reads it (a byte-order
    mark is fine); an unreadable file is an error, never an empty document.

    Raises:
        CalibrationFileError: the file cannot be read or parsed.
    """
    if path is None:
        return {}
    doc = read_json_file(path)
    return doc if isinstance(doc, dict) else {}


def _utilization_of(doc: dict, sidecar: SidecarParams) -> float | None:
    """:func:`measured_utilization` of a parsed file."""
    try:
        trace = doc.get("metadata", {}).get("trace", {})
        rate = trace.get("rate_rps")
        if rate is None and trace.get("duration_s"):
            rate = trace["requests"] / trace["duration_s"]
        prompt, output = trace["sent_prompt_tokens_mean"], trace["sent_output_tokens_mean"]
        rate, prompt, output = float(rate), float(prompt), float(output)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not all(np.isfinite(v) and v >= 0 for v in (rate, prompt, output)) or rate == 0:
        return None
    service = (
        sidecar.ttft_ms
        + sidecar.prefill_ms_per_token * prompt
        + sidecar.decode_ms_per_token * output
    ) / 1000.0
    return rate * service / sidecar.slots


def measured_merge_plan(path: str | Path | None) -> tuple[float, float] | None:
    """``(merge_seconds, start_to_start_seconds)`` of a live calibration's merge plan.

    ``diloco-gym calibrate`` records its per-phase plan as ``schedule`` (start and length of
    each merge within a sync phase). A sync ratio depends on how long the merges are and
    how close together (a merge's backlog spills into the requests before the next one), so the
    simulated side of the transfer check replays merges of the measured length at the
    measured mean spacing. ``None`` for the shipped reference, a file without a plan, or a
    plan of fewer than two merges.
    """
    return _plan_of(_live_document(path))


def _plan_of(doc: dict) -> tuple[float, float] | None:
    """:func:`measured_merge_plan` of a parsed file."""
    try:
        plan = doc.get("schedule", [])
        starts = [float(m["start_s"]) for m in plan]
        lengths = [float(m["length_s"]) for m in plan]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if len(starts) < 2 or not all(np.isfinite(starts + lengths)) or min(lengths) <= 0:
        return None
    spacing = float(np.mean(np.diff(starts)))
    return (float(np.mean(lengths)), spacing) if spacing > 0 else None


def simulate_as_measured(
    regime: str,
    path: str | Path | None,
    sidecar: SidecarParams | None,
    seeds=range(8),
) -> tuple[dict, float | None]:
    """The simulated effect sizes a calibration's transfer check compares with, and the
    utilization they were simulated at.

    For a live file (``path`` with a recorded load and merge plan) the fitted ``sidecar``
    is replayed under the conditions of the measurement: the measured utilization
    (:func:`measured_utilization`) and merges of the measured length and spacing
    (:func:`measured_merge_plan`). Otherwise the regime's own load and the default
    schedule (8 s merges every 256 steps).
    """
    doc = _live_document(path) if sidecar is not None else {}
    u_cal = _utilization_of(doc, sidecar) if sidecar is not None else None
    plan = _plan_of(doc)
    sim = simulated_effect_sizes(
        regime,
        seeds=seeds,
        sidecar=sidecar,
        utilization=u_cal,
        merge_seconds=plan[0] if plan else None,
        merge_every_s=plan[1] if plan else None,
    )
    return sim, u_cal


def fixed_schedule(n: int, every: int, h_min: int, h_max: int) -> list[int]:
    """Merges every ``every`` decisions (clamped to the corridor)."""
    every = min(max(every, h_min), h_max)
    return list(range(every, n, every))


def simulated_effect_sizes(
    regime: str,
    seeds=range(8),
    sidecar: SidecarParams | None = None,
    params: core.EnvParams | None = None,
    calibrated_on: bool = True,
    utilization: float | None = None,
    merge_seconds: float | None = None,
    merge_every_s: float | None = None,
) -> dict:
    """Effect sizes of the simulator for ``regime``, pooled over ``seeds``.

    With ``calibrated_on`` the trace comes from the regime the parameters were fitted on
    (for bursty: sync-heavy traces with the bursty sidecar parameters). The trace regime
    runs at its own utilization on ``sidecar`` (:meth:`SyntheticRegime.with_load`): a
    fitted sidecar of lower capacity sees proportionally lower rates, the load its effect
    sizes were measured at relative to its capacity, instead of an overload; with the
    regimes' default sidecars the traces are unchanged. ``utilization`` replays it at that
    utilization instead (the load a live calibration was measured at,
    :func:`measured_utilization`).

    Merges last ``params.merge_seconds`` and start every 256 steps; ``merge_seconds`` and
    ``merge_every_s`` (a live calibration's plan, :func:`measured_merge_plan`) replace
    both, with merges every ``merge_every_s`` rounded to whole decisions (the schedule of
    the measurement, not an agent's, so the training corridor does not apply).
    """
    params = params or core.EnvParams()
    if merge_seconds is not None:
        params = replace(params, merge_seconds=merge_seconds)
    reg = get_regime(regime)
    trace_regime = get_regime(reg.calibrated_on) if calibrated_on and reg.calibrated_on else reg
    sidecar = sidecar or reg.sidecar
    trace_regime = trace_regime.with_load(sidecar, target_utilization=utilization)
    lat, act, prs = [], [], []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        ep = core.build_episode(trace_regime(rng), params, sidecar, LearnerParams(), rng, seed)
        if merge_every_s is not None:
            every = max(1, round(merge_every_s / params.decision_seconds))
            merges = list(range(every, ep.n_decisions, every))
        else:
            merges = fixed_schedule(
                ep.n_decisions, 256 // params.decision_interval, params.h_min, params.h_max
            )
        res = core.replay_schedule(ep, merges, params, sidecar)
        lat.append(res.latency_s)
        act.append(res.sync_active)
        prs.append(res.pressure)
    from diloco_gym.sim.sidecar import ReplayResult

    pooled = ReplayResult(
        np.concatenate(lat), np.zeros(0, bool), np.concatenate(act), np.concatenate(prs)
    )
    out = effect_sizes(pooled, sidecar.high_pressure)
    out["p95_ms"] = percentile(pooled.latency_s * 1000, 95)
    return out


def transfer_verdict(
    simulated: dict, measured: dict, tolerance: float = TOLERANCE, interval: dict | None = None
) -> str:
    """``calibrated``, ``uncalibrated`` or ``no measurable SLO effect`` (see module doc).

    Args:
        simulated / measured: effect sizes (``p95_high_low``, ``p95_sync_ratio``).
        tolerance: largest accepted difference.
        interval: optional confidence intervals of the measured effect sizes,
            ``{metric: (lo, hi)}`` (a live run's ``p95_sync_ratio_ci`` ... fields, see
            :func:`measured_intervals`). When the verdict at either end of an interval
            differs from the verdict at the measured value, the interval is too wide to
            decide and the verdict is ``"uncertain"``. Without it (or with no finite
            interval) the verdict is exactly the point verdict.
    """
    verdict = _point_verdict(simulated, measured, tolerance)
    for metric, bounds in (interval or {}).items():
        if bounds is None or metric not in measured:
            continue
        for end in bounds:
            if end is None or not np.isfinite(end):
                continue
            if _point_verdict(simulated, {**measured, metric: float(end)}, tolerance) != verdict:
                return "uncertain"
    return verdict


def measured_intervals(entry: dict) -> dict[str, tuple[float, float]]:
    """The confidence intervals a calibration entry carries (``{metric: (lo, hi)}``; empty
    for entries without them, such as the shipped reference)."""
    out = {}
    for metric in METRICS:
        ci = entry.get(f"{metric}_ci")
        if isinstance(ci, (list, tuple)) and len(ci) == 2:
            out[metric] = (float(ci[0]), float(ci[1]))
    return out


def _point_verdict(simulated: dict, measured: dict, tolerance: float) -> str:
    if abs(measured["p95_sync_ratio"] - 1.0) <= tolerance:
        return "no measurable SLO effect"
    ok = all(
        abs(simulated[m] - measured[m]) <= tolerance
        for m in METRICS
        if np.isfinite(simulated.get(m, np.nan))
    )
    return "calibrated" if ok else "uncalibrated"


def fit_sidecar(regime: str, measured: dict, seeds=range(8), iters: int = 18) -> SidecarParams:
    """Fit ``sync_slowdown`` and ``pressure_gain`` of a regime to measured ratios (bisection).

    Each ratio grows monotonically with its own parameter, so the two are fitted one after
    the other (sync first, then pressure, then sync again).
    """
    sidecar = get_regime(regime).sidecar

    def solve(field: str, metric: str, target: float, current: SidecarParams) -> SidecarParams:
        if target <= 1.0 + 1e-3:
            return replace(current, **{field: 0.0})
        lo, hi = 0.0, 3.0
        for _ in range(iters):
            mid = (lo + hi) / 2
            got = simulated_effect_sizes(regime, seeds, replace(current, **{field: mid}))[metric]
            lo, hi = (mid, hi) if got < target else (lo, mid)
        return replace(current, **{field: round((lo + hi) / 2, 3)})

    for field, metric in (
        ("sync_slowdown", "p95_sync_ratio"),
        ("pressure_gain", "p95_high_low"),
        ("sync_slowdown", "p95_sync_ratio"),
    ):
        sidecar = solve(field, metric, measured[metric], sidecar)
    return sidecar


def main() -> None:  # pragma: no cover - a maintenance command
    """Print the fitted sidecar parameters per regime: ``python -m diloco_gym.eval.calibration``."""
    cal = load_calibration()
    for name in REGIMES:
        if REGIMES[name].calibrated_on not in ("", name):
            continue
        fitted = fit_sidecar(name, cal.measured(name))
        sim = simulated_effect_sizes(name, sidecar=fitted)
        print(
            f"{name:15s} sync_slowdown={fitted.sync_slowdown:.3f} "
            f"pressure_gain={fitted.pressure_gain:.3f} -> "
            + " ".join(f"{k}={v:.3f}" for k, v in sim.items())
        )


if __name__ == "__main__":  # pragma: no cover
    main()
