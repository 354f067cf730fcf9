"""Run an agent through episodes of the environment, handing it only what it may know.

:func:`attach_agent` is the one place that decides what an agent receives after a reset
(see :mod:`diloco_gym.agents.base`): every agent an
:class:`~diloco_gym.agents.base.AgentContext` (public
parameters and the action mask, no env, trace, costs or seed); only an agent with
``deployable = False`` also the unwrapped env and the episode seed.
:func:`run_episode`, :func:`run_episodes` (several episodes stepped in lockstep, the
report's and frontier's agents of a unit) and :class:`AttachAgentWrapper` go through it.
"""

from __future__ import annotations

import copy
import weakref
from typing import Any, cast

import gymnasium as gym
import numpy as np

from diloco_gym.envs.env import Action, DiLoCoSyncEnv, Observation

__all__ = [
    "run_episode",
    "run_episodes",
    "env_copies",
    "attach_agent",
    "is_deployable",
    "AttachAgentWrapper",
]


def is_deployable(agent: Any) -> bool:
    """Whether ``agent`` is run as deployable (an object without the flag, such as a bare
    SB3 model, is: it only ever sees observations)."""
    return bool(getattr(agent, "deployable", True))


def _regime_label(base: Any) -> str:
    """The regime's name as an agent sees it: ``replay:<name>`` for a replayed trace, so
    that a trace named like a synthetic regime (``traces/bursty.csv`` is ``bursty``) is
    never taken for that regime by an agent that draws the named regime's history."""
    from diloco_gym.sim.regimes import ReplayRegime

    name = str(base.regime_name)
    return f"replay:{name}" if isinstance(getattr(base, "generator", None), ReplayRegime) else name


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
    ctx = AgentContext(params=base.params, regime=_regime_label(base), features=features)
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
    (:func:`diloco_gym.envs.episode.episode_from_seed`), to run several agents on one build
    (the env's ``reset(options={"episode": ...})``); ``None`` builds it.

    After the reset the agent is attached (:func:`attach_agent`); then ``agent.predict``
    gets a copy of each observation, and nothing else, until the episode ends. The step
    infos (which hold the episode seed and, at the end, the exact replay) stay with the
    runner.

    Returns:
        The final ``info["episode_summary"]`` replay summary, plus ``"return"`` (sum of
        rewards), ``"steps"`` (agent decisions) and ``"deployable"``.
    """
    return run_episodes([(env, agent, seed, episode)])[0]


def run_episodes(
    runs: list[tuple[Any, Any, int, Any]], copies: bool = False
) -> list[dict[str, Any]]:
    """Several episodes, ``(env, agent, seed, episode)`` each as :func:`run_episode`'s
    arguments, with the results :func:`run_episode` gives each, in ``runs`` order.

    Runs that share no env and no agent step in lockstep, in decision order: each round
    asks every run whose next decision is the earliest one pending (by its time in the
    episode), so sealed agents (:mod:`diloco_gym.eval.sealed`) sharing a worker are asked
    in one message per round and never hold an observation later than the decision they
    are asked about. A run whose env or agent is already in use waits for a later wave, and
    an env without a ``decision`` clock (the fleet env) runs alone.
    Every agent sees exactly what :func:`run_episode` shows it, so results are the same.

    ``copies=True``: runs that share an env run on copies of it (:func:`env_copies`; the
    first on the env itself), so that only runs sharing an agent wait for another wave;
    the copies hold no episode afterwards.
    """
    given = runs
    if copies:
        runs = _on_copies(runs)
    results: list[Any] = [None] * len(runs)
    pending = list(range(len(runs)))
    while pending:
        wave: list[int] = []
        rest: list[int] = []
        busy: set[int] = set()
        solo = False  # an env without a decision clock (the fleet env) runs alone
        for i in pending:
            env, agent = runs[i][0], runs[i][1]
            keys = {id(agent), id(env), id(env.unwrapped)}
            alone = not hasattr(env.unwrapped, "decision")
            if solo or keys & busy or (alone and wave):
                rest.append(i)
            else:
                busy |= keys
                solo = alone
                wave.append(i)
        for i, res in zip(wave, _lockstep([runs[i] for i in wave]), strict=True):
            results[i] = res
        pending = rest
    for run, was in zip(runs, given, strict=True):
        if run[0] is not was[0]:  # a copy: streamed, it keeps no episode
            run[0].episode = None
    return results


_COPIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def env_copies(env: Any, n: int) -> list[Any]:
    """``env`` and ``n - 1`` copies of it (same parameters, generator and sidecar), for
    :func:`run_episodes` to run ``n`` agents on one episode at once. The copies are made
    once per env (while it holds no episode) and reused; each reset starts afresh. They
    share the env's immutable parts (:func:`_shared`) instead of copying them."""
    have = _COPIES.get(env)
    if have is None:
        _COPIES[env] = have = []
    while len(have) < n - 1:
        held, env.episode = env.episode, None  # a copy never carries an episode
        try:
            have.append(copy.deepcopy(env, _shared(env)))
        finally:
            env.episode = held
    return [env, *have[: n - 1]]


def _shared(env: Any) -> dict[int, Any]:
    """A deep copy's memo that keeps the env's frozen dataclasses (its traffic generators,
    parameters and sidecar, also in a list or tuple such as a fleet's sites) as they are:
    they never change, and a trace window's generator holds the whole trace (every window
    of a day-long trace would otherwise carry copies of all of it)."""
    memo: dict[int, Any] = {}
    for value in vars(env.unwrapped).values():
        for v in value if isinstance(value, list | tuple) else (value,):
            params = getattr(type(v), "__dataclass_params__", None)
            if params is not None and params.frozen:
                memo[id(v)] = v
    return memo


def _on_copies(runs: list[tuple[Any, Any, int, Any]]) -> list[tuple[Any, Any, int, Any]]:
    uses: dict[int, list[int]] = {}
    for i, run in enumerate(runs):
        uses.setdefault(id(run[0]), []).append(i)
    out = list(runs)
    for where in uses.values():
        envs = env_copies(runs[where[0]][0], len(where))
        for i, e in zip(where, envs, strict=True):
            out[i] = (e, *runs[i][1:])
    return out


class _Run:
    """One episode in progress: its env, agent, last observation and running totals."""

    def __init__(self, env: Any, agent: Any, seed: int, episode: Any) -> None:
        self.env, self.agent, self.base = env, agent, env.unwrapped
        opts = None if episode is None else {"episode": episode}
        self.obs, self.info = env.reset(seed=seed, options=opts)
        # The single env itself (no wrapper, no subclass): its step info's action_mask is
        # its action_masks() after the step.
        self.info_mask = env is self.base and type(self.base) is DiLoCoSyncEnv
        self.ctx: Any = None
        self.state: Any = None
        self.start = True
        self.total = 0.0
        self.steps = 0
        self.done = False

    def attach(self) -> None:
        """Attach the agent at its first decision (nothing has happened since the reset)."""
        if self.ctx is None:
            self.ctx = attach_agent(self.env, self.agent, self.info["episode_seed"])

    def time(self) -> float:
        """When in the episode the run's next decision is (seconds)."""
        return float(self.base.decision) * float(self.base.params.decision_seconds)

    def step(self, action: Any) -> None:
        self.start = False
        space = self.base.action_space
        if isinstance(space, gym.spaces.Discrete):
            action = int(np.asarray(action).reshape(-1)[0])
        else:  # a wider action (a rounds fleet's per-site MultiBinary): as the agent gave it
            action = np.asarray(action).reshape(space.shape)
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.obs, self.info = obs, info
        self.total += reward
        self.steps += 1
        if terminated or truncated:
            self.done = True
        elif self.info_mask:
            # The step's info holds the mask of the next decision (action_masks() of the
            # state the step left), as int8: the same mask, not computed twice.
            self.ctx._set_mask(info["action_mask"])
        else:
            self.ctx._set_mask(self.base.action_masks())

    def result(self) -> dict[str, Any]:
        out = dict(self.info["episode_summary"])
        out["return"] = self.total
        out["steps"] = self.steps
        out["deployable"] = is_deployable(self.agent)
        return out


def _lockstep(runs: list[tuple[Any, Any, int, Any]]) -> list[dict[str, Any]]:
    """Runs with distinct envs and agents, stepped together: the sealed agents of each
    worker in decision order, one message per round, every worker's message in flight at
    once; the agents run here are stepped while the workers think."""
    from diloco_gym.eval.sealed import Exchange, worker_key

    live = [_Run(*r) for r in runs]
    groups: dict[int | None, list[_Run]] = {}
    for r in live:
        groups.setdefault(worker_key(r.agent), []).append(r)
    local = groups.pop(None, [])
    ex = Exchange()

    def post(group: list[_Run]) -> None:
        active = [r for r in group if not r.done]
        if not active:
            return
        if len(active) == 1:
            now = active
        else:
            times = [r.time() for r in active]
            first = min(times)
            now = [r for r, t in zip(active, times, strict=True) if t == first]
        for r in now:
            r.attach()
        # the observations go out as bytes at once (Exchange.post): no copy made here
        ex.post([(r.agent, r.obs, r.start) for r in now], now)

    for group in groups.values():
        post(group)
    while ex.pending() or local:
        answered = ex.collect(timeout=0 if local else None)
        for r, action in answered:  # a worker answers its whole round in one frame
            r.step(action)
        for key in dict.fromkeys(worker_key(r.agent) for r, _ in answered):
            post(groups[key])
        if local:  # one decision of an agent run here
            r = local[0]
            r.attach()
            action, r.state = r.agent.predict(
                np.array(r.obs, dtype=np.float32),
                state=r.state,
                episode_start=np.array([r.start]),
                deterministic=True,
            )
            r.step(action)
            local = [r for r in local if not r.done]
    return [r.result() for r in live]


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
