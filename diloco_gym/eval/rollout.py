"""Run an agent through episodes of the environment, handing it only what it may know.

:func:`attach_agent` is the one place that decides what an agent receives after a reset
(see :mod:`diloco_gym.agents.base`): every agent an
:class:`~diloco_gym.agents.base.AgentContext` (public
parameters and the action mask, no env, trace, costs or seed); only an agent with
``deployable = False`` also the unwrapped env and the episode seed.
:func:`run_episode` and :class:`AttachAgentWrapper` both go through it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import gymnasium as gym
import numpy as np

from diloco_gym.envs.env import Action, Observation

if TYPE_CHECKING:
    from diloco_gym.envs.env import DiLoCoSyncEnv

__all__ = ["run_episode", "attach_agent", "is_deployable", "AttachAgentWrapper"]


def is_deployable(agent: Any) -> bool:
    """Whether ``agent`` is run as deployable (an object without the flag, such as a bare
    SB3 model, is: it only ever sees observations)."""
    return bool(getattr(agent, "deployable", True))


def attach_agent(env: Any, agent: Any, episode_seed: int) -> Any:
    """Hand ``agent`` what it may know about the episode ``env`` was just reset to.

    Returns:
        The episode's :class:`~diloco_gym.agents.base.AgentContext`; the caller refreshes its action
        mask (``context._set_mask(env.unwrapped.action_masks())``) before each decision.

    Raises:
        ValueError: a deployable agent that defines ``attach_episode`` (it asks for the
            episode, which only non-deployable agents get).
    """
    from diloco_gym.agents.base import Agent, AgentContext

    base = env.unwrapped
    table = getattr(base, "obs_features", None)  # the fleet env's wider observation
    features = tuple(f[0] for f in table) if table is not None else None
    ctx = AgentContext(params=base.params, regime=str(base.regime_name), features=features)
    ctx._set_mask(base.action_masks())
    deployable = is_deployable(agent)
    wants_episode = callable(getattr(agent, "attach_episode", None)) and (
        not isinstance(agent, Agent) or type(agent).attach_episode is not Agent.attach_episode
    )
    if deployable and wants_episode:
        raise ValueError(
            f"agent {getattr(agent, 'name', agent)!r} declares deployable = True "
            f"but defines attach_episode(): only non-deployable agents receive "
            f"the episode (set deployable = False; reports then mark it so)"
        )
    if callable(getattr(agent, "attach", None)):
        agent.attach(ctx)
    if not deployable and wants_episode:
        agent.attach_episode(base, int(episode_seed))
    return ctx


def run_episode(env: Any, agent: Any, seed: int, episode: Any = None) -> dict[str, Any]:
    """One episode of ``agent`` on ``env`` with episode seed ``seed``.

    ``episode``: the episode of ``seed`` already built with the env's parameters
    (:func:`diloco_gym.envs.core.episode_from_seed`), to run several agents on one build
    (the env's ``reset(options={"episode": ...})``); ``None`` builds it.

    After the reset the agent is attached (:func:`attach_agent`); then ``agent.predict``
    gets a copy of each observation, and nothing else, until the episode ends. The step
    infos (which hold the episode seed and, at the end, the exact replay) stay with the
    runner.

    Returns:
        The final ``info["episode_summary"]`` replay summary, plus ``"return"`` (sum of
        rewards), ``"steps"`` (agent decisions) and ``"deployable"``.
    """
    obs, info = env.reset(seed=seed, options=None if episode is None else {"episode": episode})
    ctx = attach_agent(env, agent, info["episode_seed"])
    base = env.unwrapped
    total = 0.0
    steps = 0
    state = None
    start = True
    while True:
        action, state = agent.predict(
            np.array(obs, dtype=np.float32),
            state=state,
            episode_start=np.array([start]),
            deterministic=True,
        )
        start = False
        obs, reward, terminated, truncated, info = env.step(int(np.asarray(action).reshape(-1)[0]))
        total += reward
        steps += 1
        if terminated or truncated:
            break
        ctx._set_mask(base.action_masks())
    out = dict(info["episode_summary"])
    out["return"] = total
    out["steps"] = steps
    out["deployable"] = is_deployable(agent)
    return out


class AttachAgentWrapper(gym.Wrapper[Observation, Action, Observation, Action]):
    """Attach ``agent`` at every reset of ``env``, as :func:`run_episode` does, so that
    code that only calls ``predict`` (Stable-Baselines3's ``evaluate_policy``) can run any
    agent, including the non-deployable offline oracle::

        env = AttachAgentWrapper(Monitor(DiLoCoSyncEnv("bursty")), agent)
        evaluate_policy(agent, env, n_eval_episodes=10)

    Use one wrapped env per agent (``evaluate_policy`` wraps it in a one-env
    ``DummyVecEnv``): an agent follows one episode at a time. ``episode_seeds`` lists the
    episodes it was attached to.
    """

    def __init__(self, env: gym.Env, agent: Any) -> None:
        super().__init__(env)
        self.agent = agent
        self.episode_seeds: list[int] = []
        self._ctx: Any = None

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self._ctx = attach_agent(self.env, self.agent, info["episode_seed"])
        self.episode_seeds.append(int(info["episode_seed"]))
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if not (terminated or truncated):
            self._ctx._set_mask(cast("DiLoCoSyncEnv", self.env.unwrapped).action_masks())
        return obs, reward, terminated, truncated, info
