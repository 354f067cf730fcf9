"""Tests of :mod:`diloco_gym.rl.algos`: the algorithm table."""

from __future__ import annotations

import pytest

pytest.importorskip("sb3_contrib")

from diloco_gym.rl.algos import (  # noqa: E402
    ALGOS,
    RESERVED_ALGO_KEYS,
    algo_class,
    algo_kwargs,
    default_hyperparameters,
    library_versions,
)


def test_every_algorithm_has_a_class_and_defaults_it_accepts() -> None:
    from sb3_contrib import MaskablePPO
    from stable_baselines3 import DQN, PPO

    assert [algo_class(a) for a in ALGOS] == [PPO, MaskablePPO, DQN]
    for algo in ALGOS:
        hp = default_hyperparameters(algo, n_envs=4, timesteps=10_000)
        assert set(hp) <= algo_kwargs(algo), algo
        assert hp["policy_kwargs"] == {"net_arch": [64, 64]}
        assert not (algo_kwargs(algo) & RESERVED_ALGO_KEYS)
    # DQN starts learning after a tenth of a short run, at most 5000 steps
    assert default_hyperparameters("dqn", 1, 1_000)["learning_starts"] == 100
    assert default_hyperparameters("dqn", 1, 10**7)["learning_starts"] == 5_000


def test_an_unknown_algorithm_lists_the_valid_ones() -> None:
    for call in (algo_class, lambda a: default_hyperparameters(a, 1, 1)):
        with pytest.raises(ValueError, match="unknown algo 'a2c'; valid: ppo, maskable-ppo, dqn"):
            call("a2c")


def test_versions_name_what_a_model_depends_on() -> None:
    v = library_versions()
    keys = ("diloco_gym", "python", "stable_baselines3", "torch", "gymnasium", "numpy")
    for key in (*keys, "torch_cpu"):
        assert isinstance(v[key], str) and v[key]
