"""Declarative models of the settings files' tables (training config, sweep and tune files).

Each table is a pydantic v2 model that refuses unknown keys (``extra="forbid"``) and checks
types strictly (no ``"3"`` for 3, no ``true`` for 1). A file's parser validates the table
with its model and turns pydantic's first error into the one line the command prints
(:func:`first_error`): the file, the table and the key, then what is wrong.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = ["Table", "TableError", "first_error", "validate_table"]


class Table(BaseModel):
    """A settings table: unknown keys refused, types strict, values not coerced."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


#: What a value must be, by pydantic's error type.
_WANTED = {
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "string_type": "a string",
    "list_type": "a list",
    "bool_type": "a boolean",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
}


class TableError(ValueError):
    """The first problem of a table: ``key`` (``None`` for the table as a whole), ``kind``
    (``"unknown"``, ``"type"`` or ``"value"``), ``message`` (what is wrong, without the
    key) and the offending ``value``."""

    def __init__(self, key: str | None, kind: str, message: str, value: Any) -> None:
        super().__init__(message)
        self.key = key
        self.kind = kind
        self.message = message
        self.value = value


def first_error(exc: ValidationError) -> TableError:
    """Pydantic's first error as a :class:`TableError`.

    A validator's own ``ValueError`` keeps its message; a type error says what the value
    must be (``"an integer"``, ``"a number"``, ...); an unknown key is ``kind="unknown"``.
    """
    err = exc.errors(include_url=False)[0]
    loc = [str(p) for p in err["loc"]]
    key = ".".join(loc) if loc else None
    value = err.get("input")
    kind = err["type"]
    if kind == "extra_forbidden":
        return TableError(key, "unknown", "unknown key", value)
    if kind == "value_error":
        return TableError(key, "value", str(err["ctx"]["error"]), value)
    shown = repr(value)
    if len(shown) > 60:  # a 400-digit number or a long string: quoted short
        shown = f"{shown[:40]}... ({len(shown)} characters)"
    if kind in _WANTED:
        return TableError(key, "type", f"must be {_WANTED[kind]}, got {shown}", value)
    return TableError(key, "value", f"{err['msg']}, got {shown}", value)


def validate_table(model: type[BaseModel], data: Any) -> Any:
    """``model`` validated from ``data``; raises the first error as a :class:`TableError`."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise first_error(exc) from None
