"""The env ids' versions: the deprecated ``-v0`` ids warn and keep the v0 task, and
``-v1`` differs from it only by its reward (``V1_KWARGS``)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import diloco_gym
from diloco_gym import DiLoCoSyncEnv, EnvParams
from diloco_gym.envs.versions import V1_KWARGS


@pytest.mark.parametrize("env_id", ["DiLoCoSync-v0", *diloco_gym.ENV_IDS_V0.values()])
def test_v0_ids_warn_and_keep_the_v0_task_bit_for_bit(env_id, rollout):
    """The deprecated ids warn once made and are DiLoCoSyncEnv with EnvParams' defaults:
    the same rewards and observations as before; v1 differs only by its reward."""
    with pytest.warns(FutureWarning, match="DiLoCoSync-v0 ids are deprecated"):
        old = gym.make(env_id)
    regime = old.unwrapped.regime_name
    assert old.unwrapped.params == EnvParams()
    v1 = gym.make(env_id[:-1] + "1")
    assert v1.unwrapped.params == EnvParams(**V1_KWARGS)
    if regime != "bursty":
        return
    a = rollout(old.unwrapped, "random", seed=3, policy_seed=1)
    b = rollout(DiLoCoSyncEnv(regime), "random", seed=3, policy_seed=1)
    c = rollout(v1.unwrapped, "random", seed=3, policy_seed=1)
    assert a.rewards == b.rewards and a.actions == b.actions == c.actions
    for x, y, z in zip(a.observations, b.observations, c.observations, strict=True):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, z)
    assert a.rewards != c.rewards


def test_v1_kwargs_are_the_packages_and_train_keeps_envparams_defaults():
    """``train`` does not change a config's reward behind its back: its env defaults are
    ``EnvParams``' (v0's reward); v1's reward is set in a config's ``[env]``."""
    from diloco_gym.rl.config import TrainConfig, parse_config

    assert diloco_gym.V1_KWARGS is V1_KWARGS
    assert TrainConfig().env_params == {}
    cfg = parse_config({"env": dict(V1_KWARGS)}, "v1.toml")
    assert EnvParams(**cfg.env_params) == gym.make("DiLoCoSync-v1").unwrapped.params


def test_v0_ids_keep_gymnasiums_render_wrappers():
    with pytest.warns(FutureWarning):
        env = gym.make("DiLoCoSync-v0", render_mode="rgb_array_list")
    assert env.unwrapped.render_mode == "rgb_array"
