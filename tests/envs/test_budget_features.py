"""Tests of :mod:`diloco_gym.envs.budget_features`: the budget state an observation carries
and the budget features, against the episode's own state (no RL library needed)."""

from __future__ import annotations

import numpy as np
import pytest

from diloco_gym.envs.budget_features import (
    BUDGET_FEATURES,
    BudgetPace,
    augment_observation,
    augmented_size,
    budget_features,
)
from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.envs.observation import OBS_INDEX


def test_budget_features_match_the_episode_state_at_every_decision() -> None:
    m = 12
    env = DiLoCoSyncEnv("bursty", merge_budget=m)
    p = env.params
    obs, _ = env.reset(seed=2)
    ep = env.episode
    assert ep is not None
    n = ep.n_decisions
    rng = np.random.default_rng(0)
    done = False
    while not done:
        f = budget_features(obs, p)
        s = BudgetPace(p).read(obs)
        d, gap, m_left = env.decision, s["gap"], s["m_left"]
        assert s["n"] == n and s["d"] == d
        assert f[0] == pytest.approx(m * p.h_min / n, abs=1e-6)
        assert f[1] == pytest.approx(min(1.0, m_left * p.h_min / max(n - d, 1)), abs=1e-6)
        due = max((n - (d - gap)) / (m_left + 1), 1.0)
        want = min(1.0, gap / due / 2) if m_left > 0 else 0.0
        assert f[2] == pytest.approx(want, abs=1e-6)
        obs, _, _, done, _ = env.step(int(rng.random() < 0.1))


def test_a_batch_gives_the_rows_features() -> None:
    """Features of a batch equal the features of each row (stateless, so deployable on a
    batch of observations from different episodes)."""
    env = DiLoCoSyncEnv("non-periodic", merge_budget=16)
    obs, _ = env.reset(seed=4)
    rows = [obs]
    for a in (0, 0, 1, 0, 0, 0, 1, 0):
        obs, *_ = env.step(a)
        rows.append(obs)
    batch = np.stack(rows)
    got = budget_features(batch, env.params)
    assert got.shape == (len(rows), len(BUDGET_FEATURES)) and got.dtype == np.float32
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(got[i], budget_features(row, env.params))


def test_transforms_and_sizes() -> None:
    env = DiLoCoSyncEnv("bursty", merge_budget=10)
    obs, _ = env.reset(seed=0)
    assert augmented_size(None) == len(OBS_INDEX)
    assert augmented_size("budget") == len(OBS_INDEX) + 3
    assert augmented_size("budget", base=42) == 45
    np.testing.assert_array_equal(augment_observation(obs, env.params, None), obs)
    out = augment_observation(obs, env.params, "budget")
    np.testing.assert_array_equal(out[: len(OBS_INDEX)], obs)
    np.testing.assert_array_equal(out[len(OBS_INDEX) :], budget_features(obs, env.params))
    with pytest.raises(ValueError, match="unknown observation transform 'memory'"):
        augmented_size("memory")


def test_the_budget_state_needs_a_budget() -> None:
    with pytest.raises(ValueError, match="merge_budget=M >= 1"):
        BudgetPace(DiLoCoSyncEnv("bursty").params)
    with pytest.raises(ValueError, match="merge_budget=M >= 1"):
        budget_features(np.zeros(len(OBS_INDEX), np.float32), DiLoCoSyncEnv("bursty").params)


def test_the_old_homes_name_the_same_objects() -> None:
    """The heuristics and the RL wrappers read the features from here (one home)."""
    from diloco_gym.agents import heuristics
    from diloco_gym.envs import budget_features as home

    assert heuristics.BudgetPace is home.BudgetPace
    try:
        from diloco_gym.rl import wrappers
    except ImportError:  # pragma: no cover - the rl extra is missing
        return
    assert wrappers.budget_features is home.budget_features
    assert wrappers.BUDGET_FEATURES is home.BUDGET_FEATURES
