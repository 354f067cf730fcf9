"""The settings files' tables are declarative models (pydantic): unknown keys refused, types
strict, the first problem turned into one line naming the key."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from diloco_gym.tables import Table, TableError, validate_table


class _Example(Table):
    count: int | None = None
    rate: float | None = None
    names: list[str] | None = None


@pytest.mark.parametrize(
    ("data", "key", "kind", "message"),
    [
        ({"cuont": 1}, "cuont", "unknown", "unknown key"),
        ({"count": True}, "count", "type", "must be an integer, got True"),
        ({"count": "3"}, "count", "type", "must be an integer, got '3'"),
        ({"count": 1.5}, "count", "type", "must be an integer, got 1.5"),
        ({"rate": "fast"}, "rate", "type", "must be a number, got 'fast'"),
        ({"names": "a"}, "names", "type", "must be a list, got 'a'"),
        ({"names": ["a", 2]}, "names.1", "type", "must be a string, got 2"),
    ],
)
def test_first_error_names_the_key(data, key, kind, message) -> None:
    with pytest.raises(TableError) as info:
        validate_table(_Example, data)
    err = info.value
    assert (err.key, err.kind, err.message) == (key, kind, message)


def test_valid_table_keeps_the_values() -> None:
    t = validate_table(_Example, {"count": 3, "rate": 2, "names": ["a"]})
    assert (t.count, t.rate, t.names) == (3, 2.0, ["a"])
    assert t.model_fields_set == {"count", "rate", "names"}


def test_the_three_parsers_use_models_that_refuse_unknown_keys() -> None:
    from diloco_gym.rl import config
    from diloco_gym.scale import sweep, tune

    for model in (
        config._TrainTable,
        config._EnvTable,
        config._PolicyKwargs,
        config._ConfigFile,
        sweep._Settings,
        tune._TuneSettings,
        tune._Distribution,
    ):
        assert issubclass(model, BaseModel)
        assert model.model_config.get("extra") == "forbid", model
        with pytest.raises(TableError) as info:
            validate_table(model, {"no_such_key": 1})
        assert info.value.kind == "unknown" and info.value.key == "no_such_key"
