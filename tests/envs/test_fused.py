"""The single env's compiled step (envs/fused.py): with the merge costs computed inside it
against a subclass that costs merges itself (the step stops at each merge and asks), for
every observation, reward, info and summary; copies mid-episode. The step against the
kernel's reference rollout: tests/envs/test_kernel.py."""

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


class AskedCost(DiLoCoSyncEnv):
    """The same costs, computed by the env when the compiled step asks for them."""

    asked = 0

    def _merge_cost_at(self, d: int) -> float:
        AskedCost.asked += 1
        return super()._merge_cost_at(d)


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
def test_costs_inside_the_step_equal_costs_asked_by_the_step(cfg):
    AskedCost.asked = 0
    inline, asked = DiLoCoSyncEnv(**cfg), AskedCost(**cfg)
    assert not inline._own_cost and asked._own_cost
    a, b = _rollout(inline, 4, 700), _rollout(asked, 4, 700)
    assert AskedCost.asked >= 20
    assert len(a) == len(b)
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x == y, k


def test_a_subclass_cost_is_the_one_paid():
    class Doubled(DiLoCoSyncEnv):
        def _merge_cost_at(self, d: int) -> float:
            return 2.0 * super()._merge_cost_at(d)

    env, ref = Doubled(), DiLoCoSyncEnv()
    for e in (env, ref):
        e.reset(seed=0)
    for _ in range(20):
        _, r, _, _, info = env.step(1)
        _, r_ref, _, _, info_ref = ref.step(1)
        assert info["reward_terms"]["sync_excess"] == 2.0 * info_ref["reward_terms"]["sync_excess"]
    got, want = env.episode_summary(), ref.episode_summary()
    assert got["merge_costs_requests"] == [2.0 * c for c in want["merge_costs_requests"]]
    assert got["merge_decisions"] == want["merge_decisions"]


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
