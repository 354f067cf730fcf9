"""The episode runner (eval/rollout.py): what it hands a deployable agent, the wrapper that
attaches agents under other runners (SB3's evaluate_policy)."""

from __future__ import annotations

import gc
import types

import gymnasium as gym
import numpy as np
import pytest

import diloco_gym
from diloco_gym.agents.base import Agent, AgentContext
from diloco_gym.agents.heuristics import OfflineCalibratedOracle, WADiLoCo
from diloco_gym.agents.registry import make_agent
from diloco_gym.envs.episode import Episode
from diloco_gym.eval.rollout import AttachAgentWrapper, attach_agent, run_episode
from diloco_gym.sim.sidecar import ReplayResult
from diloco_gym.sim.traces import Trace


def test_evaluate_policy_runs_the_oracle_through_the_wrapper():
    """The non-deployable oracle under SB3's evaluate_policy, via the documented wrapper:
    the same returns as run_episode on the same episodes."""
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor

    agent = make_agent("offline-oracle")
    env = AttachAgentWrapper(Monitor(diloco_gym.DiLoCoSyncEnv(regime="bursty")), agent)
    env.reset(seed=4)
    rewards, lengths = evaluate_policy(
        agent, env, n_eval_episodes=2, deterministic=True, return_episode_rewards=True
    )
    seeds = env.episode_seeds[1:3]  # evaluate_policy resets once more itself
    assert len(rewards) == 2 and len(set(seeds)) == 2
    for seed, reward, length in zip(seeds, rewards, lengths, strict=True):
        ref = run_episode(
            diloco_gym.DiLoCoSyncEnv(regime="bursty"), OfflineCalibratedOracle(), seed
        )
        assert length == ref["steps"]
        assert reward == pytest.approx(ref["return"], rel=1e-5)  # SB3 sums float32 rewards
        assert ref["return"] < 0


def test_evaluate_policy_accepts_heuristic_agents():
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor

    env = Monitor(diloco_gym.DiLoCoSyncEnv(regime="bursty"))
    env.reset(seed=0)
    mean, std = evaluate_policy(WADiLoCo(), env, n_eval_episodes=2, deterministic=True)
    assert np.isfinite(mean) and mean < 0  # merges cost SLO violations in bursty


# --------------------------------------------------------------------------- deployability
_FORBIDDEN = (gym.Env, gym.Wrapper, Episode, Trace, ReplayResult)


_SKIP = (type, types.ModuleType, types.BuiltinFunctionType, types.CodeType)


def _reachable(roots) -> list:
    """Every object reachable from ``roots`` by references (attributes, containers, array
    bases, bound methods' ``__self__``, closures' cells), not through classes or modules
    (code, not data the runner handed over)."""
    seen, out, stack = set(), [], list(roots)
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, _SKIP):
            continue
        seen.add(id(o))
        out.append(o)
        if isinstance(o, types.FunctionType):
            stack.extend(c.cell_contents for c in (o.__closure__ or ()))
            stack.extend(o.__defaults__ or ())
            continue
        stack.extend(gc.get_referents(o))
    return out


def _leaks(roots, env) -> list[str]:
    """What of the episode's future is reachable from ``roots``."""
    ep = env.unwrapped.episode
    found = []
    for o in _reachable(roots):
        if isinstance(o, _FORBIDDEN):
            found.append(type(o).__name__)
        elif isinstance(o, (int, np.integer)) and not isinstance(o, bool) and o == ep.seed:
            found.append("episode seed")
        elif (
            isinstance(o, np.ndarray)
            and o.shape == ep.merge_cost.shape
            and np.array_equal(o, ep.merge_cost)
        ):
            found.append("merge costs")
    return found


class _Spy(Agent):
    """A deployable agent that keeps everything it is handed and tries each channel to
    reach the episode; it follows the oracle's plan if it ever finds it."""

    name = "spy"

    def __init__(self) -> None:
        self.handed: list = []
        self.plan: set[int] | None = None

    def _look(self, o) -> None:
        data = getattr(o, "__dict__", {})  # the object's own data (ndarray.trace is a method)
        for path in (
            "unwrapped",
            "env",
            "episode",
            "_env",
            "oracle_costs",
            "trace",
            "seed",
            "episode_seed",
            "info",
        ):
            if data.get(path) is not None:
                self.plan = set()  # found something: a real attacker would use it

    def attach(self, context: AgentContext) -> None:
        self.handed.append(context)
        self._look(context)

    def predict(self, observation, state=None, episode_start=None, deterministic=True):
        self.handed += [observation, state, episode_start, deterministic]
        self._look(observation)
        return super().predict(observation, state, episode_start, deterministic)

    def act(self, obs: np.ndarray) -> np.ndarray:
        return np.zeros(len(obs), dtype=np.int64)


def test_the_reachability_check_has_teeth():
    env = diloco_gym.DiLoCoSyncEnv(regime="bursty")
    env.reset(seed=123_456_789)
    assert "DiLoCoSyncEnv" in _leaks([env.unwrapped], env)  # the old attach(env, seed)
    assert "episode seed" in _leaks([{"episode_seed": 123_456_789}], env)  # the reset info
    assert "DiLoCoSyncEnv" in _leaks([lambda: env], env)  # a closure
    assert "DiLoCoSyncEnv" in _leaks([env.action_masks], env)  # a bound method
    assert "merge costs" in _leaks([env.oracle_costs()], env)


@pytest.mark.parametrize("regime", ["bursty", "sync-heavy"])
def test_a_deployable_agent_cannot_reach_the_future(regime):
    """Everything a deployable agent is handed (attach's context, every predict argument)
    reaches no env, episode, trace, replay, merge-cost table or episode seed, so it
    cannot rebuild the oracle's plan (an agent that could did so exactly on seeds 0-2)."""
    seed = 123_456_789
    env = gym.make("DiLoCoSync-v0", regime=regime)
    spy = _Spy()
    res = run_episode(env, spy, seed)
    assert res["deployable"] is True and spy.plan is None
    assert len(spy.handed) > 4 * res["steps"]
    assert _leaks(spy.handed + [spy], env) == []
    ctx = spy.handed[0]
    assert isinstance(ctx, AgentContext) and ctx.params == env.unwrapped.params
    assert ctx.regime == regime
    with pytest.raises(AttributeError):  # frozen: the runner's, not the agent's, to change
        ctx.params = None
    # The context's mask is the runner's copy of the env's, refreshed before each decision.
    masked = gym.make("DiLoCoSync-v0", regime=regime, merge_budget=9)
    masked.reset(seed=1)
    ctx = attach_agent(masked, spy, 1)
    np.testing.assert_array_equal(ctx.action_mask(), masked.unwrapped.action_masks())
    assert _leaks([ctx], masked) == []


def test_only_non_deployable_agents_receive_the_episode():
    got = {}

    class Peek(Agent):
        deployable = False

        def attach_episode(self, env, episode_seed):
            got["env"], got["seed"] = env, episode_seed

        def act(self, obs):
            return np.zeros(len(obs), dtype=np.int64)

    env = diloco_gym.DiLoCoSyncEnv(regime="bursty")
    res = run_episode(env, Peek(), 17)
    assert got == {"env": env, "seed": 17} and res["deployable"] is False

    class Liar(Peek):
        deployable = True  # claims to be deployable, yet asks for the episode

    with pytest.raises(ValueError, match="deployable = True but defines attach_episode"):
        run_episode(env, Liar(), 17)
    sneaky = OfflineCalibratedOracle()
    sneaky.deployable = True
    with pytest.raises(ValueError, match="attach_episode"):
        run_episode(env, sneaky, 0)


def test_env_copies_share_the_generator_and_its_trace():
    """A trace window's generator holds the whole trace: copies of its env share it (and
    the parameters) instead of carrying a copy each, and still run their own state."""
    from diloco_gym.envs.env import DiLoCoSyncEnv
    from diloco_gym.eval.rollout import env_copies, run_episodes

    src = diloco_gym.REGIMES["bursty"](np.random.default_rng(0))
    tiles = diloco_gym.ReplayRegime(src, duration_s=300.0).tiles()
    env = DiLoCoSyncEnv(regime=tiles[1])
    copies = env_copies(env, 3)
    for c in copies[1:]:
        assert c.generator is env.generator
        assert c.generator.trace.arrival_s is src.arrival_s
        assert c.params is env.params and c.sidecar is env.sidecar
        assert c._state is not env._state
    agents = [make_agent("fixed-256"), make_agent("wa-diloco"), make_agent("fixed-512")]
    got = run_episodes([(e, a, 5, None) for e, a in zip(copies, agents, strict=True)])
    want = [run_episode(DiLoCoSyncEnv(regime=tiles[1]), a, 5) for a in agents]
    assert [g["merge_decisions"] for g in got] == [w["merge_decisions"] for w in want]


class _MaskRecorder(Agent):
    """Merges whenever allowed, and records the mask it was shown at each decision."""

    name = "mask-recorder"

    def __init__(self) -> None:
        self.masks: list[list[bool]] = []
        self.ctx: AgentContext | None = None

    def attach(self, context: AgentContext) -> None:
        self.ctx = context

    def act(self, obs):
        assert self.ctx is not None
        mask = self.ctx.action_mask()
        self.masks.append(mask.tolist())
        return np.full(obs.shape[0], int(mask[1]), dtype=np.int64)


@pytest.mark.parametrize("budget", [None, 10])
def test_the_mask_from_the_step_info_is_the_envs_mask(budget):
    """On the plain env the runner hands the agent the step info's mask; through a wrapper
    it asks the env: the agent sees the same masks, and each is the env's action_masks().
    (Forced decisions asked too, so that the masks are not all [True, True].)"""
    plain, wrapped = _MaskRecorder(), _MaskRecorder()
    kw = {"merge_budget": budget, "skip_forced": False}
    env = diloco_gym.DiLoCoSyncEnv(regime="bursty", **kw)
    res = run_episode(env, plain, 3)
    ref = run_episode(gym.Wrapper(diloco_gym.DiLoCoSyncEnv(regime="bursty", **kw)), wrapped, 3)
    assert plain.masks == wrapped.masks and len(plain.masks) == res["steps"]
    assert res["merge_decisions"] == ref["merge_decisions"]
    assert any(m != [True, True] for m in plain.masks)
    # Replayed by hand: each decision's mask is action_masks() before that step.
    env.reset(seed=3)
    for i, mask in enumerate(plain.masks):
        assert env.action_masks().tolist() == mask, i
        env.step(int(mask[1]))
