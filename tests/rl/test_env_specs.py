"""Tests of :mod:`diloco_gym.rl.env_specs`: a config's training env kinds, on a fleet
(budgets per fleet episode, what a fleet run refuses; regimes and traces are tested through
the config and trainer tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from diloco_gym.envs.fleet import DiLoCoFleetEnv
from diloco_gym.rl.config import ConfigError, check_config, parse_config
from diloco_gym.rl.env_specs import EnvSpec, FleetEnvSpec, build_env_specs

ROOT = Path(__file__).resolve().parents[2]
FLEET = str(ROOT / "docs" / "examples" / "fleet-v1.toml")


def _cfg(env: dict, path: str = "t.toml"):
    cfg = parse_config({"env": env}, path)
    check_config(cfg, path)
    return cfg


def test_a_fleet_config_gives_the_fleet_at_each_budget_per_episode() -> None:
    cfg = _cfg({"fleet": FLEET, "budgets_per_10min": [48, 64, 96], "excess_weight": 0.05})
    specs = build_env_specs(cfg, "t.toml")
    assert [type(s) for s in specs] == [FleetEnvSpec] * 3
    assert [(s.merge_budget, s.budget_per_hour) for s in specs] == [
        (48, 288.0),
        (64, 384.0),
        (96, 576.0),
    ]
    assert cfg.label == specs[0].label == "fleet:fleet-v1"
    env = specs[1].make(cfg.env_params)
    assert isinstance(env, DiLoCoFleetEnv) and env.params.merge_budget == 64
    assert env.params.excess_weight == 0.05 and env.fleet.model_version == 1
    assert specs[0].record() == {
        "label": "fleet:fleet-v1",
        "fleet": FLEET,
        "merge_budget": 48,
        "budget_per_hour": 288.0,
    }


def test_a_fleet_without_budgets_is_one_free_env() -> None:
    (spec,) = build_env_specs(_cfg({"fleet": FLEET}), "t.toml")
    assert spec == FleetEnvSpec(FLEET, None) and spec.make().params.merge_budget is None


def test_a_budget_outside_the_fleet_corridor_names_the_file_and_the_range() -> None:
    cfg = _cfg({"fleet": FLEET, "budgets_per_hour": [1e5]})
    with pytest.raises(ConfigError, match=r"^t.toml: \[env\] budgets: budget 100000 merges/h"):
        build_env_specs(cfg, "t.toml")


@pytest.mark.parametrize(
    ("extra", "what"),
    [
        ({"regime": "bursty"}, "regime"),
        ({"regimes": ["bursty"]}, "regimes"),
        ({"trace": "x.csv"}, "trace"),
        ({"calibration": "c.json"}, "calibration"),
        ({"learner_calibration": "shipped"}, "learner_calibration"),
    ],
)
def test_a_fleet_file_replaces_the_single_host_keys(extra: dict, what: str) -> None:
    with pytest.raises(ConfigError, match=f"t.toml.*fleet replaces {what}"):
        _cfg({"fleet": FLEET, **extra})


def test_a_missing_fleet_file_is_named() -> None:
    with pytest.raises(ConfigError, match=r"t.toml: \[env\] fleet: no such file: nope.toml"):
        _cfg({"fleet": "nope.toml"})


def test_a_bad_fleet_file_is_a_config_error_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[fleet]\nfragments = 0\n[[site]]\nname = 'a'\n")
    cfg = _cfg({"fleet": str(bad), "budgets_per_10min": [8]})
    with pytest.raises(ConfigError, match=f"t.toml: \\[env\\] fleet {bad}: .*fragments"):
        build_env_specs(cfg, "t.toml")


def test_a_rounds_fleet_gives_its_rounds_env_and_refuses_dqn() -> None:
    from diloco_gym.envs.fleet_rounds import DiLoCoFleetRoundsEnv

    rounds = str(ROOT / "docs" / "examples" / "fleet-rounds.toml")
    (spec,) = build_env_specs(_cfg({"fleet": rounds}), "t.toml")
    env = spec.make()
    assert isinstance(env, DiLoCoFleetRoundsEnv) and env.action_space.n == 4
    cfg = parse_config({"train": {"algo": "dqn"}, "env": {"fleet": rounds}}, "t.toml")
    check_config(cfg, "t.toml")
    with pytest.raises(ConfigError, match=r"^t.toml: \[env\] fleet .*MultiBinary.*dqn"):
        build_env_specs(cfg, "t.toml")


def test_a_regime_config_still_gives_regime_specs() -> None:
    specs = build_env_specs(_cfg({"regime": "bursty", "budgets_per_10min": [10, 16]}), "t.toml")
    assert [type(s) for s in specs] == [EnvSpec, EnvSpec]
    assert [s.merge_budget for s in specs] == [10, 16]
