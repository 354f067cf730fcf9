"""Run an agent through episodes of the environment."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["run_episode"]


def run_episode(env: Any, agent: Any, seed: int) -> dict[str, Any]:
    """One episode of ``agent`` on ``env`` with episode seed ``seed``.

    Calls ``agent.attach(env.unwrapped, seed)`` after the reset when the agent has it (the
    documented channel for agents that need more than observations), then
    ``agent.predict`` until the episode ends.

    Returns:
        The final ``info["episode_summary"]`` replay summary, plus ``"return"`` (sum of rewards)
        and ``"steps"`` (agent decisions).
    """
    obs, info = env.reset(seed=seed)
    base = env.unwrapped
    if hasattr(agent, "attach"):
        agent.attach(base, seed)
    total = 0.0
    steps = 0
    state = None
    start = True
    while True:
        action, state = agent.predict(obs, state=state, episode_start=np.array([start]),
                                      deterministic=True)
        start = False
        obs, reward, terminated, truncated, info = env.step(int(np.asarray(action).reshape(-1)[0]))
        total += reward
        steps += 1
        if terminated or truncated:
            break
    out = dict(info["episode_summary"])
    out["return"] = total
    out["steps"] = steps
    return out
