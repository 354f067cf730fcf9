"""Calibration files' schema and strict JSON reading: :class:`CalibrationFileError`, the
shipped JSON Schema (``diloco_gym/data/calibration.schema.json``), its validation with
messages that name the dotted field, and the ``calibrated_on`` chain rule."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

#: The effect sizes a calibration entry measures (p95 ratios).
METRICS = ("p95_high_low", "p95_sync_ratio")


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


def check_chains(regimes: dict, where: str, owned: Iterable[str]) -> None:
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
    check_chains(regimes, where, regimes)


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
        with open(path, "rb") as handle:  # read(n) reserves n bytes: the size found, + 1
            raw = handle.read(info.st_size + 1)
            if len(raw) > info.st_size:  # it grew meanwhile: at most up to the limit
                raw += handle.read(max(0, limits.limit("CALIBRATION_BYTES") + 1 - len(raw)))
        limits.check_limit("CALIBRATION_BYTES", len(raw), f"{what} size in bytes")
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
    return parse_json(text, where)


def parse_json(text: str, where: str) -> Any:
    """A calibration document, no key given twice, at most ``DILOCO_GYM_MAX_NESTING`` levels
    deep (:func:`diloco_gym.sim.parsing.parse_json`).

    Raises:
        CalibrationFileError: not valid JSON, or nested too deeply (naming ``where``).
    """
    from diloco_gym.sim import parsing
    from diloco_gym.sim.limits import LimitError

    try:
        return parsing.parse_json(text, where, object_pairs_hook=_no_duplicates)
    except LimitError as exc:
        raise CalibrationFileError(where, str(exc).removeprefix(f"{where}: ")) from None
    except (ValueError, RecursionError) as exc:  # also 5000-digit integers
        raise CalibrationFileError(where, f"not valid JSON: {str(exc)[:200]}") from None
