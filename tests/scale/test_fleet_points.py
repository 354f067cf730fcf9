"""diloco_gym/scale/fleet_points.py: which ``env.NAME`` a fleet sweep takes, a point's fleet
report configuration (paths relative to the sweep file, the single-host keys left out), its
cells (an episode each and the calibration) and their fingerprints (what each reads and the
fleet file's bytes), and a stored point's tables and summary."""

from __future__ import annotations

import json
import re
from dataclasses import replace
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


# --------------------------------------------------------------------------- cells
def _point(fleet_file, **settings):
    return fp.fleet_point_config(
        {"fleet": "fleet.toml", "agents": ["fixed-512"], **settings}, fleet_file.parent, {}
    )


def test_a_point_is_a_cell_per_episode_and_a_calibration_cell(fleet_file):
    """The fleet report's own cells (a report cell of the fleet setting: unit None the
    calibration, unit k the episode of seed seed0 + k)."""
    from diloco_gym.eval.cells import ReportCell
    from diloco_gym.eval.fleet import FLEET_SETTING

    cal, keys, cells = fp.fleet_point_cells(_point(fleet_file, seeds=3, seed0=5))
    assert re.fullmatch(r"fleet-cal/[0-9a-f]{20}", cal)
    assert all(re.fullmatch(r"unit/fleet-[0-9a-f]{20}", k) for k in keys) and len(set(keys)) == 3
    assert all(isinstance(c, ReportCell) and c.regime == FLEET_SETTING for c in cells.values())
    assert cells[cal].unit is None
    assert [cells[k].config.seed0 + cells[k].unit for k in keys] == [5, 6, 7]


def test_cell_keys_follow_what_the_cells_read_and_the_fleet_files_bytes(fleet_file):
    cal, keys, _ = fp.fleet_point_cells(_point(fleet_file, seeds=2))
    assert fp.fleet_point_cells(_point(fleet_file, seeds=2))[:2] == (cal, keys)  # determined
    # more seeds: the same first episodes, and the calibration (shared with the first run)
    more = fp.fleet_point_cells(_point(fleet_file, seeds=3))
    assert more[0] == cal and more[1][:2] == keys
    # the draws change the episodes' rows, not the calibration; alpha changes neither
    draws = fp.fleet_point_cells(_point(fleet_file, seeds=2, draws=50))
    assert draws[0] == cal and not set(draws[1]) & set(keys)
    assert fp.fleet_point_cells(_point(fleet_file, seeds=2, alpha=0.01))[:2] == (cal, keys)
    fleet_file.write_text(FLEET + "\n# an edit\n")
    edited = fp.fleet_point_cells(_point(fleet_file, seeds=2))
    assert edited[0] != cal and not set(edited[1]) & set(keys)  # the same path, other bytes


# --------------------------------------------------------------------------- stored points
def test_a_stored_points_summary_is_the_reports_over_its_stored_episodes(fleet_file):
    """A fleet point's summary from its stored cells: the fleet report's over the episodes
    stored (here 2 of 3), with the calibration verdict and the agents' sealing."""
    import pandas as pd

    from diloco_gym.eval.report import run_protocol

    config = _point(fleet_file, seeds=3, draws=10, in_process_agents=True)
    cal, keys, cells = fp.fleet_point_cells(config)
    stored = [fp.run_fleet_cell(cells[k]) for k in (cal, *keys[:2])]
    df = pd.DataFrame([row for rec in stored[1:] for row in rec["rows"]])
    summary = fp.fleet_point_summary(config, df, stored[0])
    assert summary["agent"].tolist() == ["fixed-512"] and int(summary["units"].iloc[0]) == 2
    assert summary["calibration_verdict"].iloc[0] == stored[0]["verdict"]
    assert summary["agent_sealing"].iloc[0].startswith("in-process")
    direct = run_protocol(replace(config, seeds=2))["summary"]  # the report of those 2
    pd.testing.assert_frame_equal(summary[direct.columns], direct)


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
