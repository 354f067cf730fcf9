"""The fleet configuration file's reader (diloco_gym/sim/fleet_toml.py): a round trip, the
one-line errors naming the file, the table and the key, and the shipped example files."""

from __future__ import annotations

import math

import pytest

from diloco_gym.sim import fleet as fl
from diloco_gym.sim import fleet_toml


def test_toml_round_trip(tmp_path):
    p = tmp_path / "f.toml"
    p.write_text(
        "[fleet]\nbits = 8\nfragments = 2\n[env]\nmerge_budget = 9\n"
        '[[site]]\nname = "a"\nlink_gbps = 5\n[[site]]\nname = "b"\n'
        "sidecar = { slots = 8 }\n"
    )
    fleet, env = fleet_toml.load_fleet_toml(p)
    assert fleet.bits == 8 and fleet.fragments == 2 and env == {"merge_budget": 9}
    assert [s.name for s in fleet.sites] == ["a", "b"]
    assert fleet.sites[0].link_gbps == 5.0 and fleet.sites[1].sidecar == (("slots", 8.0),)


@pytest.mark.parametrize(
    "text, msg",
    [
        ("[fleet]\nbitz = 8\n", r"\[fleet\] has unknown key\(s\) \['bitz'\]"),
        ("[fleet]\nbits = 'eight'\n", r"\[fleet\]: key 'bits' must be an integer"),
        ("[fleet]\nbits = 12\n", "bits must be one of"),
        ("[flet]\n", r"unknown table\(s\) \['flet'\]"),
        ("[[site]]\nname = 'a'\nspeed = 3\n", r"\[\[site\]\] #1 has unknown key\(s\) \['speed'\]"),
        ("[[site]]\nlink_gbps = 'fast'\n", r"#1: key 'link_gbps' must be a number"),
        ("[[site]]\nname='a'\n[[site]]\nname='a'\n", "site names must be unique"),
        ("[fleet\n", "not valid TOML"),
    ],
)
def test_toml_errors_name_file_table_key(tmp_path, text, msg):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(fl.FleetConfigError, match=msg) as exc:
        fleet_toml.load_fleet_toml(p)
    assert str(p) in str(exc.value) and "\n" not in str(exc.value)


def test_missing_file(tmp_path):
    with pytest.raises(fl.FleetConfigError, match="not found"):
        fleet_toml.load_fleet_toml(tmp_path / "nope.toml")


def test_shipped_examples_parse():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "docs" / "examples"
    fleet, env = fleet_toml.load_fleet_toml(root / "fleet.toml")
    assert fleet.n_sites == 4 and fleet.bits == 8 and fleet.fragments == 4
    real, _ = fleet_toml.load_fleet_toml(root / "fleet-real.toml")
    assert [s.name for s in real.sites] == ["azure-code", "azure-conv", "mooncake"]
    assert math.isfinite(real.model_params)


def test_the_correlated_traces_example_loads_and_mixes():
    from pathlib import Path

    import gymnasium as gym
    import numpy as np

    path = Path(__file__).resolve().parents[2] / "docs" / "examples" / "fleet-traces-corr.toml"
    fleet, env = fleet_toml.load_fleet_toml(path)
    assert all(s.trace is not None for s in fleet.sites) and fleet.traffic_correlation == 0.0
    corr = gym.make("DiLoCoFleet-v1", fleet=path, traffic_correlation=1.0).unwrapped
    assert corr.setup.independent_episodes == 10  # as the file's comment says
    sites = corr.build_episode(0).sites
    assert all(np.array_equal(s.trace.arrival_s, sites[0].trace.arrival_s) for s in sites)
