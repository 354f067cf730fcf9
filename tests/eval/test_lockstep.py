"""Sealed agents of a unit stepped in lockstep (``run_episodes``): the same results as one
episode at a time in-process, one worker for all of them, and decision order kept, so that
agents sharing the worker never hold an observation later than the one they are asked."""

from __future__ import annotations

import json

import numpy as np
import pytest

from diloco_gym import DiLoCoSyncEnv
from diloco_gym.agents.base import Agent
from diloco_gym.envs.episode import episode_from_seed
from diloco_gym.envs.observation import OBS_INDEX
from diloco_gym.eval.rollout import env_copies, run_episode, run_episodes
from diloco_gym.eval.sealed import SealedAgent, act_together, seal_agents, worker_key

pytestmark = pytest.mark.slow  # starts worker processes

_LEFT = OBS_INDEX["time_left"]
_SEEN: list[float] = []  # in the worker: time_left of every observation any agent got


class Recorder(Agent):
    """Merges every ``every``-th decision (so the agents' decisions drift apart), and notes
    each observation any co-located agent was given before it; an observation later in the
    episode than the one it is asked about (smaller time_left) is reported by raising."""

    def __init__(self, name: str, every: int) -> None:
        self.name, self.every = name, every
        self.calls = 0

    def attach(self, context) -> None:
        self.calls = 0

    def act(self, obs: np.ndarray) -> np.ndarray:
        now = float(obs[0, _LEFT])
        later = [t for t in _SEEN if t < now]
        if later:
            raise LookupError(json.dumps({"agent": self.name, "now": now, "later": min(later)}))
        _SEEN.extend(obs[:, _LEFT].tolist())
        self.calls += 1
        return np.full(len(obs), int(self.calls % self.every == 0), dtype=np.int64)


def _recorders() -> list[Recorder]:
    return [Recorder(f"rec-{k}", k) for k in (1, 2, 3, 5)]


def test_lockstep_keeps_decision_order_in_a_shared_worker():
    sealed = seal_agents(_recorders())
    assert len({id(s._worker) for s in sealed}) == 1  # one worker holds them all
    env = DiLoCoSyncEnv("bursty")
    ep = episode_from_seed(env.generator, 3, env.params, env.sidecar, env.learner_params)
    envs = env_copies(env, len(sealed))
    try:
        res = run_episodes([(e, a, 3, ep) for e, a in zip(envs, sealed, strict=True)])
        assert len({r["steps"] for r in res}) > 1  # the agents' decisions did drift apart
        # The recorder does catch a later observation sent next to an earlier one.
        a, b = sealed[:2]
        early, late = np.zeros(len(OBS_INDEX), np.float32), np.zeros(len(OBS_INDEX), np.float32)
        early[_LEFT], late[_LEFT] = -0.5, -1.0  # below every time_left of the episode
        with pytest.raises(RuntimeError, match="sealed agent rec-2: LookupError"):
            act_together([(a, late, [True]), (b, early, [True])])
    finally:
        sealed[0].close()


@pytest.mark.parametrize("workers", [1, 3])
def test_lockstep_sealed_gives_the_in_process_results(workers):
    from diloco_gym.agents.registry import HEURISTICS, make_agents

    env = DiLoCoSyncEnv("bursty")
    plain = make_agents(HEURISTICS)
    sealed = seal_agents(make_agents(HEURISTICS), workers=workers)
    assert sum(isinstance(s, SealedAgent) for s in sealed) == len(HEURISTICS) - 1  # the oracle
    assert len({worker_key(s) for s in sealed} - {None}) == workers
    envs = env_copies(env, len(plain))
    try:
        for seed in (0, 1):
            ep = episode_from_seed(env.generator, seed, env.params, env.sidecar, env.learner_params)
            one = [run_episode(env, a, seed, episode=ep) for a in plain]
            together = run_episodes([(e, a, seed, ep) for e, a in zip(envs, sealed, strict=True)])
            together_in = run_episodes([(e, a, seed, ep) for e, a in zip(envs, plain, strict=True)])
            for r1, r2, r3 in zip(one, together, together_in, strict=True):
                for key in ("merge_decisions", "return", "steps", "violation_pct"):
                    assert r1[key] == r2[key] == r3[key], key
    finally:
        for s in sealed:
            if isinstance(s, SealedAgent):
                s.close()


def test_runs_sharing_an_agent_or_an_env_run_in_waves_in_order():
    from diloco_gym.agents.registry import make_agents

    env = DiLoCoSyncEnv("bursty")
    a, b = make_agents(["wa-diloco", "fixed-512"])
    runs = [(env, a, 0, None), (env, b, 0, None), (DiLoCoSyncEnv("bursty"), a, 1, None)]
    got = run_episodes(runs)
    want = [run_episode(*r) for r in runs]
    assert [g["merge_decisions"] for g in got] == [w["merge_decisions"] for w in want]
    assert got[0]["merge_decisions"] != got[1]["merge_decisions"]


def test_env_copies_are_distinct_equal_and_reused():
    env = DiLoCoSyncEnv("bursty", merge_budget=9)
    envs = env_copies(env, 3)
    assert envs[0] is env and len({id(e) for e in envs}) == 3
    assert all(e.params == env.params and e.sidecar == env.sidecar for e in envs)
    assert env_copies(env, 2)[1] is envs[1]


class _Broken(Agent):
    name = "broken"

    def act(self, obs):
        raise ZeroDivisionError("no plan")


class _FloatAction(Agent):
    name = "float-action"

    def predict(self, observation, state=None, episode_start=None, deterministic=True):
        return np.array([1.0]), state


def test_a_batch_names_the_failing_agent_and_keeps_each_action_dtype():
    from diloco_gym.agents.registry import make_agents

    env = DiLoCoSyncEnv("bursty")
    agents = [*make_agents(["fixed-512"]), _FloatAction(), _Broken()]
    sealed = seal_agents(agents)
    try:
        obs = np.zeros(len(OBS_INDEX), np.float32)
        acts = act_together([(s, obs, [True]) for s in sealed[:2]])
        assert acts[0].dtype.kind == "i" and acts[1].dtype == np.float64
        with pytest.raises(RuntimeError, match="sealed agent broken: ZeroDivisionError"):
            run_episodes([(e, s, 0, None) for e, s in zip(env_copies(env, 3), sealed, strict=True)])
        with pytest.raises(ValueError, match="asked twice"):
            act_together([(sealed[0], obs, [True]), (sealed[0], obs, [True])])
    finally:
        sealed[0].close()


def test_copies_let_runs_on_one_env_step_together_and_keep_no_episode():
    from diloco_gym.agents.registry import make_agents

    env = DiLoCoSyncEnv("bursty", merge_budget=12)
    agents = make_agents(["fixed-budget", "online-forecast-budget", "wa-diloco"])
    want = [run_episode(env, a, 4) for a in agents]
    got = run_episodes([(env, a, 4, None) for a in agents], copies=True)
    assert [g["merge_decisions"] for g in got] == [w["merge_decisions"] for w in want]
    assert all(g["merges"] == 12 for g in got)
    copies = env_copies(env, 3)
    assert env.episode is not None and all(c.episode is None for c in copies[1:])
