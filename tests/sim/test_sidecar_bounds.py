"""diloco_gym/sim/sidecar_bounds.py: every ``SidecarParams`` field has the range of a live
calibration's ``fitted_sidecar`` (the schema's), so a fleet site's ``sidecar`` override, a
calibration file and code get the same bounds; a value out of range is a ``ValueError``
naming the field."""

from __future__ import annotations

import json
import math
from dataclasses import fields, replace
from importlib import resources

import pytest

from diloco_gym.sim.sidecar import SidecarParams
from diloco_gym.sim.sidecar_bounds import SIDECAR_MAX


def test_the_bounds_are_the_calibration_schemas():
    schema = json.loads(
        resources.files("diloco_gym").joinpath("data/calibration.schema.json").read_text()
    )
    fitted = schema["properties"]["fitted_sidecar"]["properties"]
    assert {k: v["maximum"] for k, v in fitted.items()} == SIDECAR_MAX
    assert set(SIDECAR_MAX) == {f.name for f in fields(SidecarParams)}


@pytest.mark.parametrize("name", sorted(SIDECAR_MAX))
def test_a_value_above_the_bound_is_refused(name):
    with pytest.raises(ValueError, match=rf"SidecarParams\.{name} must be "):
        replace(SidecarParams(), **{name: SIDECAR_MAX[name] * 2})
    replace(SidecarParams(), **{name: SIDECAR_MAX[name]})  # the bound itself is allowed


@pytest.mark.parametrize("value", [math.inf, math.nan, 10**400, "1", True])
def test_a_value_that_is_not_a_finite_number_is_refused(value):
    with pytest.raises(ValueError, match=r"SidecarParams\.tail_s must be a finite number"):
        SidecarParams(tail_s=value)  # type: ignore[arg-type]
