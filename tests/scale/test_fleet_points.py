"""diloco_gym/scale/fleet_points.py: which ``env.NAME`` a fleet sweep takes, a point's fleet
report configuration (paths relative to the sweep file, the single-host keys left out), the
cell's fingerprint (its configuration and the fleet file's bytes), a stored point's tables
and outputs, and Holm over the deployable agents of every point."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from diloco_gym.scale import fleet_points as fp

FLEET = '[[site]]\nname = "eu"\nregime = "bursty"\n[[site]]\nname = "us"\nregime = "ordinary"\n'


@pytest.fixture
def fleet_file(tmp_path) -> Path:
    (tmp_path / "sweeps").mkdir()
    path = tmp_path / "sweeps" / "fleet.toml"
    path.write_text(FLEET)
    return path


@pytest.mark.parametrize(
    ("name", "valid"),
    [
        ("h_min_steps", True),  # EnvParams
        ("merge_budget", True),
        ("bits", True),  # FleetParams
        ("fragments", True),
        ("sites", False),  # the fleet file's own
        ("bogus", False),
        ("", False),
    ],
)
def test_fleet_env_field(name, valid):
    assert fp.fleet_env_field(name) is valid


def test_the_fleet_and_single_host_keys_do_not_overlap():
    assert not set(fp.FLEET_KEYS) & set(fp.NOT_WITH_FLEET)
    assert "fleet" in fp.FLEET_KEYS and "regime" in fp.NOT_WITH_FLEET


# --------------------------------------------------------------------------- configuration
def test_point_config_resolves_paths_against_the_sweep_file(fleet_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (fleet_file.parent / "cal.json").write_text("{}")
    settings = {
        "fleet": "fleet.toml",
        "calibration": "cal.json",
        "agents": ["fixed-512", "runs/model"],
        "seeds": 3,
        "seed0": 7,
        "merge_budget": 4,  # an env value, not a report setting
        "regime": "bursty",  # not a fleet key: left out
    }
    config = fp.fleet_point_config(settings, fleet_file.parent, {"merge_budget": 4})
    assert config.fleet == str(fleet_file.resolve())
    assert config.calibration == str((fleet_file.parent / "cal.json").resolve())
    # A model's run directory too is relative to the sweep file, not to the working
    # directory (tmp_path here).
    assert config.agents == ["fixed-512", str((fleet_file.parent / "runs" / "model").resolve())]
    assert fleet_file.parent.resolve() != tmp_path.resolve()
    assert (config.seeds, config.seed0, config.env) == (3, 7, {"merge_budget": 4})


@pytest.mark.parametrize("cal", [None, "reference", "none"])
def test_point_config_reference_calibration_is_none(fleet_file, cal):
    settings = {"fleet": str(fleet_file), "agents": "fixed-512"}
    if cal is not None:
        settings["calibration"] = cal
    config = fp.fleet_point_config(settings, fleet_file.parent, {})
    assert config.calibration is None and config.agents == ["fixed-512"]


def test_point_config_default_agents_are_the_heuristics(fleet_file):
    from diloco_gym.agents.registry import HEURISTICS

    config = fp.fleet_point_config({"fleet": "fleet.toml"}, fleet_file.parent, {})
    assert config.agents == list(HEURISTICS)


def test_point_config_refuses_a_missing_fleet_file(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        fp.fleet_point_config({"fleet": "absent.toml"}, tmp_path, {})
    assert str(info.value) == f"fleet file {(tmp_path / 'absent.toml').resolve()} does not exist"


def test_point_config_refuses_a_bad_env_value(fleet_file):
    with pytest.raises((TypeError, ValueError)):
        fp.fleet_point_config({"fleet": "fleet.toml"}, fleet_file.parent, {"h_min_steps": -5})


# --------------------------------------------------------------------------- fingerprint
def test_cell_key_follows_the_configuration_and_the_fleet_files_bytes(fleet_file):
    def key(**settings):
        config = fp.fleet_point_config(
            {"fleet": "fleet.toml", "agents": ["fixed-512"], **settings}, fleet_file.parent, {}
        )
        return fp.fleet_cell_key(config)

    first = key()
    assert re.fullmatch(r"fleet/[0-9a-f]{20}", first)
    assert key() == first  # deterministic
    assert key(seeds=3) != first
    fleet_file.write_text(FLEET + "\n# an edit\n")
    assert key() != first  # the same path, other bytes


# --------------------------------------------------------------------------- stored points
LEAD = {"sweep": "s", "point": 2, "grid.bits": 8}
RECORD = {
    "rows": [{"agent": "a", "seed": 0, "x": 1.0}, {"agent": "a", "seed": 1, "x": 2.0}],
    "summary": [{"agent": "a", "p_value": 0.01, "deployable": True}],
    "calibration_verdict": "calibrated",
    "independent_units": 2,
    "agent_sealing": "sealed",
}


def test_point_tables_lead_with_the_points_columns():
    rows, summary = fp.fleet_point_tables(LEAD, RECORD)
    assert list(rows.columns) == ["sweep", "point", "grid.bits", "agent", "seed", "x"]
    assert rows["point"].tolist() == [2, 2] and rows["x"].tolist() == [1.0, 2.0]
    assert summary.to_dict(orient="records") == [
        {
            **LEAD,
            "agent": "a",
            "p_value": 0.01,
            "deployable": True,
            "calibration_verdict": "calibrated",
            "agent_sealing": "sealed",
        }
    ]


def test_point_outputs_of_a_missing_a_failed_and_a_stored_cell():
    errors, notes = [], []
    assert fp.fleet_point_outputs(None, LEAD, "point 2", errors, notes) == (None, None)
    assert notes == ["point 2: its fleet report not run yet"] and errors == []
    failed = {"ok": False, "error": "ValueError: boom"}
    assert fp.fleet_point_outputs(failed, LEAD, "point 2", errors, notes) == (None, None)
    assert errors == [{**LEAD, "cell": "fleet report", "error": "ValueError: boom"}]
    rows, summary = fp.fleet_point_outputs(
        {"ok": True, "result": RECORD}, LEAD, "point 2", errors, notes
    )
    assert len(rows) == 2 and len(summary) == 1 and len(errors) == 1 and len(notes) == 1


def test_plain_stores_numpy_scalars_and_refuses_anything_else():
    assert json.loads(json.dumps({"a": np.float64(1.5), "b": np.int64(3)}, default=fp._plain)) == {
        "a": 1.5,
        "b": 3,
    }
    with pytest.raises(TypeError, match="cannot store set in a sweep record"):
        fp._plain({1})


ROUNDS = Path(__file__).resolve().parents[2] / "docs" / "examples" / "fleet-rounds.toml"


def test_point_config_keeps_the_own_site_rule_of_a_rounds_fleet(fleet_file, tmp_path):
    """``X+own`` on a rounds fleet stays ``X+own`` (a model run made absolute, its suffix
    kept); on a one-instant fleet, or made one by ``env.timing``, it is refused when the
    sweep loads."""
    rounds = tmp_path / "sweeps" / "rounds.toml"
    rounds.write_text(ROUNDS.read_text())
    settings = {"fleet": "rounds.toml", "agents": ["fixed-budget+own", "runs/m+own", "x"]}
    config = fp.fleet_point_config(settings, rounds.parent, {"merge_budget": 10})
    assert config.agents == [
        "fixed-budget+own",
        str((rounds.parent / "runs" / "m").resolve()) + "+own",
        str((rounds.parent / "x").resolve()),
    ]
    with pytest.raises(ValueError, match=r"'\+own' site rule needs a fleet with timing"):
        fp.fleet_point_config({"fleet": "fleet.toml", "agents": ["fixed-512+own"]},
                              fleet_file.parent, {})  # fmt: skip
    own = {"fleet": "rounds.toml", "agents": ["pressure-gate+own"]}
    assert fp.fleet_point_config(own, rounds.parent, {"quorum": 2}).env == {"quorum": 2}
