"""Tests of :mod:`diloco_gym.rl.sb3`: the native vector env as SB3 sees it."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

from diloco_gym.envs.env import DiLoCoSyncEnv  # noqa: E402
from diloco_gym.rl.sb3 import SB3VecEnv  # noqa: E402


def test_sb3_view_steps_like_the_single_envs() -> None:
    """Reset and step through SB3's interface give the single envs' observations and
    rewards, env by env (the seed of env i is seed + i)."""
    vec = SB3VecEnv(num_envs=3, regime="bursty")
    vec.seed(5)
    obs = vec.reset()
    singles = [DiLoCoSyncEnv("bursty") for _ in range(3)]
    want = np.stack([e.reset(seed=5 + i)[0] for i, e in enumerate(singles)])
    np.testing.assert_array_equal(obs, want)
    assert vec.num_envs == 3 and obs.shape == (3, vec.observation_space.shape[0])
    actions = np.array([0, 1, 0])
    vec.step_async(actions)
    obs2, rewards, dones, infos = vec.step_wait()
    for i, e in enumerate(singles):
        o, r, _, _, _ = e.step(int(actions[i]))
        np.testing.assert_array_equal(obs2[i], o)
        assert rewards[i] == pytest.approx(r)
    assert dones.shape == (3,) and len(infos) == 3
    vec.close()
