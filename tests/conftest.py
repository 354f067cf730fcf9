"""Shared helpers for the environment tests: episode rollouts under simple policies."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest

#: A policy maps (env, observation, policy rng) to an action.
Policy = Callable[[object, np.ndarray, np.random.Generator], object]


def _random(env, obs, rng):
    return int(rng.integers(2))


def _always(env, obs, rng):
    return 1


def _never(env, obs, rng):
    return 0


def _masked_random(env, obs, rng):
    """Uniform among the actions ``action_masks()`` allows."""
    mask = env.unwrapped.action_masks()
    return int(rng.choice(np.flatnonzero(mask)))


POLICIES: dict[str, Policy] = {
    "random": _random,
    "always-merge": _always,
    "never-merge": _never,
    "masked-random": _masked_random,
}


@dataclass
class Rollout:
    """Everything one episode produced, in step order (reset first)."""

    observations: list[np.ndarray] = field(default_factory=list)
    actions: list = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    infos: list[dict] = field(default_factory=list)  # infos[0] is reset's
    masks: list[np.ndarray] = field(default_factory=list)  # mask before each step

    @property
    def final(self) -> dict:
        return self.infos[-1]

    @property
    def summary(self) -> dict:
        return self.infos[-1]["episode_summary"]

    @property
    def excess_terms(self) -> np.ndarray:
        """The per-step ``sync_excess`` reward terms (reset's included; <= 0)."""
        return np.array(
            [i["reward_terms"]["sync_excess"] for i in self.infos if "reward_terms" in i]
        )


def run_episode(
    env, policy: Policy | str, seed: int, policy_seed: int = 0, max_steps: int = 100_000
) -> Rollout:
    """Reset ``env`` with ``seed`` and step ``policy`` to the end of the episode."""
    if isinstance(policy, str):
        policy = POLICIES[policy]
    rng = np.random.default_rng(policy_seed)
    out = Rollout()
    obs, info = env.reset(seed=seed)
    out.observations.append(obs)
    out.infos.append(info)
    for _ in range(max_steps):
        out.masks.append(env.unwrapped.action_masks())
        action = policy(env, obs, rng)
        obs, reward, terminated, truncated, info = env.step(action)
        out.actions.append(action)
        out.observations.append(obs)
        out.rewards.append(reward)
        out.infos.append(info)
        assert not terminated, "the environment never terminates, it truncates"
        if truncated:
            return out
    raise AssertionError(f"episode did not end within {max_steps} steps")


@pytest.fixture
def rollout():
    """The :func:`run_episode` helper, as a fixture."""
    return run_episode


@pytest.fixture(scope="session")
def policies():
    return POLICIES


@pytest.fixture(scope="session")
def write_learner_calibration(tmp_path_factory):
    """``write(cal) -> path``: ``cal`` written as a learner calibration file (a new
    temporary directory each call)."""
    import json

    def write(cal):
        f = tmp_path_factory.mktemp("lc") / "learners.json"
        doc = {
            "format": "diloco-gym-learner-calibration/1",
            "params": cal.to_dict(),
            "env_mapping": {"env_steps_per_inner_step": 32, "step_seconds": 0.14},
        }
        f.write_text(json.dumps(doc), encoding="utf-8")
        return f

    return write
