"""The merge-debt reward shaping (``reward_shaping="merge-debt"``, DiLoCoSync-v2): its
potential, the relation of the shaped reward to the scored sync-excess, the vector env's
equality with the single env, and the envs that refuse it."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import diloco_gym
from diloco_gym import DiLoCoSyncEnv, EnvParams
from diloco_gym.envs.episode import episode_from_seed
from diloco_gym.envs.shaping import (
    HISTORY_SEEDS,
    merge_debt,
    merge_debt_one,
    reference_merge_cost,
)
from diloco_gym.envs.vector import DiLoCoSyncVectorEnv
from diloco_gym.sim.learners import LearnerParams
from diloco_gym.sim.regimes import get_regime


def _play(env, seed, p_merge=0.06, policy_seed=0):
    rng = np.random.default_rng(policy_seed)
    obs, info = env.reset(seed=seed)
    terms, rewards, infos = [info["reward_terms"]], [], [info]
    while True:
        obs, r, term, trunc, info = env.step(int(rng.random() < p_merge))
        terms.append(info["reward_terms"])
        rewards.append(r)
        infos.append(info)
        if term or trunc:
            return terms, np.array(rewards), infos


def test_reference_cost_is_the_history_episodes_mean_merge_cost():
    g = get_regime("bursty")
    p = EnvParams()
    eps = [episode_from_seed(g, s, p, g.sidecar, LearnerParams(), 8.0) for s in HISTORY_SEEDS]
    mean = sum(e.merge_cost.sum() * e.reward_per_request for e in eps) / sum(
        e.merge_cost.size for e in eps
    )
    assert reference_merge_cost(g, p, g.sidecar, LearnerParams(), 8.0) == pytest.approx(mean)
    assert min(HISTORY_SEEDS) >= 10**6  # training-range seeds: history, not test episodes
    assert reference_merge_cost(g, EnvParams(shaping_cost=2.5), g.sidecar, None, 8.0) == 2.5
    env = DiLoCoSyncEnv("bursty", reward_shaping="merge-debt")
    assert env.shaping_cost == pytest.approx(mean)
    assert 5.0 < env.shaping_cost < 20.0  # a merge costs a few units at bursty load


def test_merge_debt_values():
    free = EnvParams()
    assert merge_debt(8.0, 40, 8, 1, 517, free) == pytest.approx(-8.0 * 32 / free.h_max)
    assert merge_debt(8.0, 600, 500, 1, 517, free) == pytest.approx(-8.0 * 17 / free.h_max)
    budget = EnvParams(merge_budget=10)
    # 3 merges done, the last at 100: 7 left, even-pace interval (517 - 100) / 8
    phi = merge_debt(8.0, 130, 100, 3, 517, budget)
    assert phi == pytest.approx(-8.0 * 30 / ((517 - 100) / 8))
    assert merge_debt(8.0, 500, 450, 10, 517, budget) == 0.0  # nothing left to pay for


@pytest.mark.parametrize("kwargs", [{}, {"merge_budget": 12}, {"reward_mode": "exact"}])
def test_shaping_only_adds_its_own_term(kwargs):
    """Same actions: the sync_excess and progress terms are the unshaped env's bit for bit,
    and the reward is excess_weight * (sync_excess + shaping) + progress_weight * progress."""
    shaped = DiLoCoSyncEnv(
        "bursty", reward_shaping="merge-debt", excess_weight=0.1, progress_weight=0.5, **kwargs
    )
    plain = DiLoCoSyncEnv("bursty", excess_weight=0.1, progress_weight=0.5, **kwargs)
    ts, rs, _ = _play(shaped, 5)
    tp, rp, _ = _play(plain, 5)
    assert [t["sync_excess"] for t in ts] == [t["sync_excess"] for t in tp]
    assert [t["progress"] for t in ts] == [t["progress"] for t in tp]
    f = np.array([t["shaping"] for t in ts[1:]])
    assert np.abs(f).max() > 0
    np.testing.assert_allclose(rs, rp + 0.1 * f, rtol=1e-12, atol=1e-12)
    assert shaped.episode_summary()["sync_excess_pct"] == plain.episode_summary()["sync_excess_pct"]


@pytest.mark.parametrize("gamma", [1.0, 0.99])
@pytest.mark.parametrize("budget", [None, 10])
def test_shaping_terms_telescope(gamma, budget):
    """sum_t gamma^t F_t = gamma^T phi(s_T) - phi(s_0): with gamma = 1 an episode's shaping
    sums to phi(s_T) - phi(s_0), and the discounted return differs from the unshaped one by
    that boundary term only (Ng, Harada and Russell's argument), whatever the policy."""
    env = DiLoCoSyncEnv(
        "bursty", reward_shaping="merge-debt", shaping_gamma=gamma, merge_budget=budget
    )
    for seed in range(3):
        rng = np.random.default_rng(seed)
        obs, info = env.reset(seed=seed)
        phi0 = env._potential()
        total, t = 0.0, 0
        while True:
            obs, r, term, trunc, info = env.step(int(rng.random() < 0.08))
            total += gamma**t * info["reward_terms"]["shaping"]
            t += 1
            if trunc:
                break
        assert total == pytest.approx(gamma**t * env._potential() - phi0, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("budget", [None, 16])
def test_vector_env_shapes_as_the_single_env(budget):
    kw = {"reward_shaping": "merge-debt", "excess_weight": 0.1, "merge_budget": budget}
    vec = DiLoCoSyncVectorEnv(3, "bursty", **kw)
    single = DiLoCoSyncEnv("bursty", **kw)
    assert vec.shaping_cost == single.shaping_cost
    rng = np.random.default_rng(2)
    acts = (rng.random((1500, 3)) < 0.07).astype(np.int64)
    vec.reset(seed=11)
    rewards, dones = [], []
    for a in acts:
        _, r, _, trunc, _ = vec.step(a)
        rewards.append(r)
        dones.append(trunc)
    rewards, dones = np.array(rewards), np.array(dones)
    seeds = [11, 12, 13]
    for i in range(3):
        end = int(np.flatnonzero(dones[:, i])[0])
        single.reset(seed=seeds[i])
        got = []
        for a in acts[: end + 1, i]:
            got.append(single.step(int(a))[1])
        np.testing.assert_allclose(rewards[: end + 1, i], got, rtol=1e-9, atol=1e-12)


def test_v1_id_is_shaped_and_learns_the_same_task():
    env = gym.make("DiLoCoSync-v2")
    assert env.unwrapped.params.reward_shaping == "merge-debt"
    assert env.unwrapped.params.excess_weight == diloco_gym.V1_KWARGS["excess_weight"]
    assert env.observation_space == DiLoCoSyncEnv().observation_space
    _, info = env.reset(seed=0)
    assert set(info["reward_terms"]) == {"sync_excess", "progress", "shaping"}


def test_the_fleet_refuses_shaping():
    from diloco_gym.envs.fleet import DiLoCoFleetEnv

    with pytest.raises(ValueError, match="does not shape its reward"):
        DiLoCoFleetEnv(reward_shaping="merge-debt")


def test_the_single_envs_scalar_debt_is_the_array_one():
    rng = np.random.default_rng(0)
    for budget in (None, 6, 12):
        params = EnvParams(merge_budget=budget)
        for _ in range(200):
            n = int(rng.integers(100, 600))
            last = int(rng.integers(0, n))
            d = int(rng.integers(last, n + 20))
            merges = int(rng.integers(0, 14))
            want = float(merge_debt(9.5, d, last, merges, n, params))
            assert merge_debt_one(9.5, d, last, merges, n, params) == pytest.approx(want, abs=1e-12)
