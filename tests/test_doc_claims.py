"""Statements of the documentation that the code decides: each is read from the page and
checked against what the code does."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _reward_formulas() -> dict[str, str]:
    """The reward formula as README.md, docs/model.md and the env's docstring write it."""
    from diloco_gym.envs.env import DiLoCoSyncEnv

    readme = (ROOT / "README.md").read_text()
    model = (ROOT / "docs" / "model.md").read_text()
    found = {
        "README.md": re.search(r"\*\*Reward\*\*: `([^`]+)`", readme),
        "docs/model.md": re.search(r"^ {4}reward = (.+)$", model, flags=re.M),
        "DiLoCoSyncEnv": re.search(r"``reward = ([^`]+)``", DiLoCoSyncEnv.__doc__ or ""),
    }
    assert all(found.values()), found
    return {k: " ".join(m.group(1).split()) for k, m in found.items() if m}


def test_the_reward_formula_is_the_same_everywhere_and_is_the_codes():
    """One formula in the README, docs/model.md and the env's docstring, and the env's
    rewards are that formula of its ``info["reward_terms"]``, with ``sync_excess <= 0``."""
    import gymnasium as gym

    import diloco_gym  # noqa: F401

    formulas = _reward_formulas()
    assert len(set(formulas.values())) == 1, formulas
    assert formulas["docs/model.md"] == "excess_weight * sync_excess + progress_weight * progress"
    env = gym.make("DiLoCoSync-v0", excess_weight=2.0, progress_weight=3.0)
    env.reset(seed=0)
    seen_cost = False
    for _ in range(200):
        mask = env.unwrapped.action_masks()
        _, reward, terminated, truncated, info = env.step(1 if mask[1] else 0)
        terms = info["reward_terms"]
        assert terms["sync_excess"] <= 0.0
        seen_cost |= terms["sync_excess"] < 0.0
        want = 2.0 * terms["sync_excess"] + 3.0 * terms["progress"]
        assert np.isclose(reward, want, rtol=1e-12, atol=1e-12), (reward, terms)
        if terminated or truncated:
            break
    assert seen_cost  # a merge cost something, so the sign was checked
