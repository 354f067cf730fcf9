"""Tests of :mod:`diloco_gym.rl.train_envs`: training episodes use training seeds only,
reproducibly, whatever builds the envs."""

from __future__ import annotations

import pytest

pytest.importorskip("stable_baselines3")

from diloco_gym.envs.env import DiLoCoSyncEnv  # noqa: E402
from diloco_gym.eval.seed_ranges import TRAIN_SEED_HIGH, TRAIN_SEED_LOW, VALIDATION_SEED0  # noqa: E402
from diloco_gym.rl.train_envs import TrainSeedWrapper  # noqa: E402
from diloco_gym.rl.validation import HeldOutEvalCallback  # noqa: E402


def test_train_and_eval_seeds_are_disjoint() -> None:
    env = TrainSeedWrapper(DiLoCoSyncEnv("bursty"), seed=0)
    for s in [0, 1, 19, 5, None, None, None]:
        _, info = env.reset(seed=s)
        assert TRAIN_SEED_LOW <= info["episode_seed"] < TRAIN_SEED_HIGH
    assert env.episode_seeds and min(env.episode_seeds) >= TRAIN_SEED_LOW
    # the report's default seeds and the validation seeds are held out
    assert 0 + 20 <= VALIDATION_SEED0 < TRAIN_SEED_LOW
    with pytest.raises(ValueError, match="held out"):
        HeldOutEvalCallback(DiLoCoSyncEnv("bursty"), [TRAIN_SEED_LOW], 1, None)


def test_train_seed_wrapper_is_reproducible() -> None:
    a = TrainSeedWrapper(DiLoCoSyncEnv("bursty"), seed=7)
    b = TrainSeedWrapper(DiLoCoSyncEnv("bursty"), seed=None)
    for env in (a, b):
        env.reset(seed=7)
        env.reset()
    assert a.episode_seeds == b.episode_seeds


def test_one_builder_wraps_every_kind_the_same_way() -> None:
    """Env i of the vector env is Monitor(TrainSeedWrapper([BudgetFeatures](kind i))), and
    its episode seeds are those of a TrainSeedWrapper seeded with seed + i."""
    from stable_baselines3.common.monitor import Monitor

    from diloco_gym.rl.env_specs import EnvSpec
    from diloco_gym.rl.train_envs import make_vec_env
    from diloco_gym.rl.wrappers import BudgetFeatures

    specs = [EnvSpec("bursty", "bursty", None, m, None) for m in (10, 16)]
    vec = make_vec_env("dummy", specs, 40, 3, {"excess_weight": 0.5}, "budget")
    vec.reset()
    for i, env in enumerate(vec.envs):
        assert isinstance(env, Monitor)
        seeder = env.env
        assert isinstance(seeder, TrainSeedWrapper) and isinstance(seeder.env, BudgetFeatures)
        base = env.unwrapped
        assert base.params.merge_budget == (10, 16)[i % 2] and base.params.excess_weight == 0.5
        ref = TrainSeedWrapper(DiLoCoSyncEnv("bursty"), seed=40 + i)
        ref.reset()
        assert seeder.episode_seeds == ref.episode_seeds
    assert vec.observation_space.shape == (20,)
    vec.close()


def test_the_builder_refuses_what_it_cannot_build() -> None:
    from diloco_gym.rl.env_specs import EnvSpec
    from diloco_gym.rl.train_envs import make_vec_env, regime_spec

    budget = EnvSpec("bursty", "bursty", None, 10, None)
    with pytest.raises(ValueError, match="vec env 'native' cannot run several env kinds"):
        make_vec_env("native", [budget], 0, 2)
    with pytest.raises(ValueError, match="vec env 'native' cannot run several env kinds"):
        make_vec_env("native", [regime_spec("bursty"), regime_spec("sync-heavy")], 0, 2)
    with pytest.raises(ValueError, match="unknown vec env 'threads'; valid: native, subproc"):
        make_vec_env("threads", [budget], 0, 2)
    with pytest.raises(ValueError, match="at least one env kind"):
        make_vec_env("dummy", [], 0, 2)


def test_the_fleet_kind_goes_through_the_same_builder() -> None:
    """A fleet run's envs are the fleet env with its budget, wrapped as every other kind,
    env i's episode seeds starting from seed * 1000 + i (the shipped fleet model's rule)."""
    from pathlib import Path

    from diloco_gym.rl.env_specs import FleetEnvSpec
    from diloco_gym.rl.train_envs import make_vec_env

    fleet = str(Path(__file__).resolve().parents[2] / "docs" / "examples" / "fleet.toml")
    specs = [FleetEnvSpec(fleet, b) for b in (48, 96)]
    vec = make_vec_env("dummy", specs, 2 * 1000, 2, {"excess_weight": 0.05}, "budget")
    vec.reset()
    for i, env in enumerate(vec.envs):
        assert type(env.unwrapped).__name__ == "DiLoCoFleetEnv"
        assert env.unwrapped.params.merge_budget == (48, 96)[i]
        ref = TrainSeedWrapper(DiLoCoSyncEnv("bursty"), seed=2000 + i)
        ref.reset()
        assert env.env.episode_seeds == ref.episode_seeds
    vec.close()
