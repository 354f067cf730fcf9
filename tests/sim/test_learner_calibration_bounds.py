"""Every number of a learner calibration file has an upper bound and must be finite: a
``loss_scale`` of 1e308 used to predict a loss of about 1e305, and a 400-digit integer
ended in an uncaught ``OverflowError``. Each refusal is one line naming the file and the
field. The schema and the code state the same bounds. The live (sidecar) calibration
schema bounds its last two open-ended numbers, and a fleet site's calibration file is read
as strictly as the report's (no NaN)."""

from __future__ import annotations

import copy
import json
import re
from importlib import resources
from pathlib import Path

import pytest

from diloco_gym.sim import learner_calibration as lc
from diloco_gym.sim.fleet import FleetConfigError, site_calibration

DEFAULT = json.loads(
    resources.files("diloco_gym").joinpath("data/learner_calibration_default.json").read_text()
)
FIELDS = [
    *(("params", k) for k in lc.PARAMS),
    ("params", "quant_efficiency", "8"),
    ("env_mapping", "env_steps_per_inner_step"),
    ("env_mapping", "step_seconds"),
]
ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, path: tuple[str, ...], value: object) -> Path:
    doc = copy.deepcopy(DEFAULT)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    f = tmp_path / "lc.json"
    f.write_text(json.dumps(doc))
    return f


@pytest.mark.parametrize("path", FIELDS, ids=".".join)
@pytest.mark.parametrize("value", [1e308, 10**400, 1e12], ids=["1e308", "400 digits", "1e12"])
def test_a_huge_value_is_refused_naming_the_file_and_the_field(tmp_path, path, value):
    f = _write(tmp_path, path, value)
    with pytest.raises(lc.LearnerCalibrationError) as exc:
        lc.load_learner_calibration(f)
    msg = str(exc.value)
    assert msg.startswith(f"{f}: field {'.'.join(path)}: ") and "\n" not in msg


def test_loss_scale_1e308_no_longer_predicts_an_absurd_loss(tmp_path):
    with pytest.raises(lc.LearnerCalibrationError, match=r"field params\.loss_scale: .*100"):
        lc.load_learner_calibration(_write(tmp_path, ("params", "loss_scale"), 1e308))


def test_an_interval_bound_must_be_of_a_plausible_size(tmp_path):
    f = _write(tmp_path, ("intervals", "loss_floor"), [0.0, 1e300])
    with pytest.raises(lc.LearnerCalibrationError, match=r"field intervals\.loss_floor\.1: "):
        lc.load_learner_calibration(f)


def test_the_shipped_files_are_inside_the_bounds():
    for name in ("default",):
        doc = json.loads(
            resources.files("diloco_gym")
            .joinpath(f"data/learner_calibration_{name}.json")
            .read_text()
        )
        lc.load_learner_calibration(doc)


def test_the_schema_states_the_codes_bounds():
    schema = lc.learner_calibration_schema()["properties"]
    params = schema["params"]["properties"]
    found = {k: params[k] for k in lc.PARAMS}
    found["quant_efficiency"] = params["quant_efficiency"]["additionalProperties"]
    found.update(schema["env_mapping"]["properties"])
    assert set(found) == set(lc.BOUNDS)
    for name, (lo, hi, inclusive) in lc.BOUNDS.items():
        rule = found[name]
        assert rule["maximum"] == hi, name
        assert rule["minimum" if inclusive else "exclusiveMinimum"] == lo, name


@pytest.mark.parametrize("name", [*lc.PARAMS, "env_steps_per_inner_step", "step_seconds"])
@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1e308, 10**400])
def test_the_dataclass_refuses_what_the_schema_refuses(name, value):
    """A calibration built in code (or from a dict) gets the same bounds."""
    fields = {k: DEFAULT["params"][k] for k in lc.PARAMS} | DEFAULT["env_mapping"]
    fields[name] = value
    with pytest.raises(ValueError, match=rf"LearnerCalibration\.{name} must be a finite number"):
        lc.LearnerCalibration(**fields)


def test_quant_efficiency_in_code_is_bounded_too():
    fields = {k: DEFAULT["params"][k] for k in lc.PARAMS} | DEFAULT["env_mapping"]
    with pytest.raises(ValueError, match=r"quant_efficiency\[8\] must be a finite number"):
        lc.LearnerCalibration(**fields, quant_efficiency={8: 1e308})


# ------------------------------------------------------------ the live calibration schema
LIVE = json.loads((ROOT / "tests" / "fixtures" / "live_cpu_calibration.json").read_text())
INTERFERENCE = {
    "model": "share",
    "host_share": 0.2,
    "share_exponent": 1.0,
    "residual": 0.1,
    "levels": [{"link_share": 0.5, "sync_slowdown": 2.0, "p95_sync_ratio": 1.5}],
}


def _live(tmp_path: Path, **interference: object) -> Path:
    doc = copy.deepcopy(LIVE)
    doc["interference"] = copy.deepcopy(INTERFERENCE)
    for key, value in interference.items():
        if key == "p95_sync_ratio":
            doc["interference"]["levels"][0][key] = value
        else:
            doc["interference"][key] = value
    f = tmp_path / "cal.json"
    f.write_text(json.dumps(doc, allow_nan=True))
    site_calibration.cache_clear()
    return f


def test_a_live_calibration_with_bounded_interference_is_read(tmp_path):
    assert site_calibration(str(_live(tmp_path)))[1:] == (0.2, 1.0)


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("residual", 1e308, "interference.residual"),
        ("p95_sync_ratio", 1e308, "interference.levels[0].p95_sync_ratio"),
        ("p95_sync_ratio", -1.0, "interference.levels[0].p95_sync_ratio"),
    ],
)
def test_the_live_schema_bounds_every_number(tmp_path, key, value, field):
    f = _live(tmp_path, **{key: value})
    with pytest.raises(FleetConfigError) as exc:
        site_calibration(str(f))
    msg = str(exc.value)
    dotted = field.replace("[0]", ".0")  # the fleet's reader names list items by index
    assert msg.startswith(str(f)) and dotted in msg and "\n" not in msg
    from diloco_gym.eval.calibration import load_calibration

    with pytest.raises(ValueError, match=re.escape(field)):
        load_calibration(f)


@pytest.mark.parametrize("key", ["host_share", "share_exponent", "residual", "p95_sync_ratio"])
def test_a_fleet_site_calibration_refuses_nan(tmp_path, key):
    """JSON has no NaN; Python's reader accepts it and JSON Schema's ranges let it through:
    a site's file used to be read with a NaN host share."""
    f = _live(tmp_path, **{key: float("nan")})
    with pytest.raises(FleetConfigError, match=rf"^{f}: .*not a finite number"):
        site_calibration(str(f))
