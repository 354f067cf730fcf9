"""The single env's compiled step (envs/fused.py) against its step through the kernel's
functions, for every observation, reward, info and summary."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from diloco_gym.envs.env import DiLoCoSyncEnv


def _rollout(env: DiLoCoSyncEnv, seed: int, steps: int) -> list:
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    out = [obs.tobytes(), repr(sorted(info.items()))]
    for _ in range(steps):
        obs, r, term, trunc, info = env.step(int(rng.random() < 0.3))
        out += [obs.tobytes(), r, term, trunc, repr(sorted(info.items()))]
        if trunc:
            obs, info = env.reset(seed=int(rng.integers(0, 10**6)))
            out += [obs.tobytes(), repr(sorted(info.items()))]
    return out


def _kernel_path(env: DiLoCoSyncEnv) -> DiLoCoSyncEnv:
    env._fused = None  # the step through the kernel's functions (as a subclass gets)
    return env


@pytest.mark.parametrize(
    "cfg",
    [
        {},
        {"merge_budget": 8},
        {"skip_forced": False},
        {"reward_mode": "exact"},
        {"regime": "sync-heavy", "merge_budget": 12},
        {"regime": "pressure-heavy", "progress_weight": 2.0},
    ],
)
def test_compiled_step_equals_the_kernel_path(cfg):
    fused = DiLoCoSyncEnv(**cfg)
    assert fused._fused is not None
    ref = _kernel_path(DiLoCoSyncEnv(**cfg))
    a, b = _rollout(fused, 4, 700), _rollout(ref, 4, 700)
    assert len(a) == len(b)
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x == y, k


def test_a_subclass_with_its_own_merge_cost_takes_the_kernel_path():
    class OwnCost(DiLoCoSyncEnv):
        def _merge_cost_at(self, d: int) -> float:
            return 2.0 * super()._merge_cost_at(d)

    env = OwnCost()
    assert env._fused is None
    env.reset(seed=0)
    for _ in range(20):
        env.step(1)
    assert env.episode_summary()["merge_costs_requests"][0] >= 0.0


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_mid_episode_steps_as_the_original(how):
    env = DiLoCoSyncEnv(merge_budget=10)
    env.reset(seed=3)
    for t in range(15):
        env.step(t % 4 == 0)
    twin = copy.deepcopy(env) if how == "deepcopy" else pickle.loads(pickle.dumps(env))
    for t in range(400):
        a = env.step(t % 3 == 0)
        b = twin.step(t % 3 == 0)
        np.testing.assert_array_equal(a[0], b[0])
        assert a[1:4] == b[1:4] and repr(a[4]) == repr(b[4]), t
        if a[3]:
            break
    assert env.merges == twin.merges and len(env.merges) == 10  # the budget, all placed
