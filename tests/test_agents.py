"""The paper's policies as agents, and what the runner hands a deployable agent."""

from __future__ import annotations

import gc
import types

import gymnasium as gym
import numpy as np
import pytest

import diloco_gym
from diloco_gym.agents.base import Agent, AgentContext
from diloco_gym.agents.heuristics import (
    FixedInterval,
    OfflineCalibratedOracle,
    OnlineForecastWA,
    RandomDeferral,
    WADiLoCo,
)
from diloco_gym.agents.registry import (
    AGENTS,
    BUDGETED,
    HEURISTICS,
    LEARNED,
    is_budget_aware_spec,
    make_agent,
)
from diloco_gym.cli import main
from diloco_gym.envs import core
from diloco_gym.eval.rollout import AttachAgentWrapper, attach_agent, run_episode
from diloco_gym.sim import schedules
from diloco_gym.sim.sidecar import ReplayResult
from diloco_gym.sim.traces import Trace

#: Agents that run without a merge budget; the budget-aware ones (BUDGETED, and the
#: budget-conditioned learned agents) need merge_budget=M and are checked at budgets in
#: tests/eval/test_frontier.py and tests/rl/test_learned.py.
FREE_AGENTS = [n for n in AGENTS if n not in BUDGETED and not is_budget_aware_spec(n)]


def _needs_rl(name: str) -> None:
    if name in LEARNED:
        pytest.importorskip("stable_baselines3")


@pytest.mark.parametrize("regime", list(diloco_gym.REGIMES))
@pytest.mark.parametrize("name", FREE_AGENTS)
def test_every_agent_respects_the_corridor(regime, name):
    _needs_rl(name)
    env = diloco_gym.DiLoCoSyncEnv(regime=regime)
    agent = make_agent(name)
    res = run_episode(env, agent, seed=3)
    p = env.params
    merges = res["merge_decisions"]
    assert schedules.is_feasible(merges, env.episode.n_decisions, p.h_min, p.h_max)
    gaps = np.diff([0] + merges)
    assert gaps.min() >= p.h_min and gaps.max() <= p.h_max


@pytest.mark.parametrize("name", FREE_AGENTS)
def test_agents_are_deterministic(name):
    _needs_rl(name)
    env = diloco_gym.DiLoCoSyncEnv(regime="bursty")
    a = run_episode(env, make_agent(name), seed=5)
    b = run_episode(diloco_gym.DiLoCoSyncEnv(regime="bursty"), make_agent(name), seed=5)
    assert a == b


def test_unknown_agent_lists_valid_names():
    with pytest.raises(ValueError, match="valid agents: no-sync, fixed-256"):
        make_agent("wa-dilocco")


def test_wa_score_matches_formula():
    obs = np.zeros(core.OBS_DIM, dtype=np.float32)
    ix = core.OBS_INDEX
    obs[ix["loss_progress_mean"]] = 0.8
    obs[ix["tokens_mean"]] = 0.6
    obs[ix["loss_progress_min"]] = 0.2
    obs[ix["tokens_min"]] = 0.1
    obs[ix["network"]] = 0.2
    obs[ix["serving"]] = 0.4
    obs[ix["checkpoint"]] = 0.1
    obs[ix["staleness"]] = 0.04
    mean_score = 0.5 * 0.8 + 0.5 * 0.6 - (0.5 * 0.2 + 0.75 * 0.4 + 0.25 * 0.1 + 0.25 * 0.04)
    assert WADiLoCo().score(obs[None])[0] == pytest.approx(mean_score, abs=1e-6)
    assert WADiLoCo().predict(obs)[0] == int(mean_score > 0)
    unanimous = WADiLoCo(aggregate="unanimous")
    min_score = 0.5 * 0.2 + 0.5 * 0.1 - (0.5 * 0.2 + 0.75 * 0.4 + 0.25 * 0.1 + 0.25 * 0.04)
    assert unanimous.score(obs[None])[0] == pytest.approx(min_score, abs=1e-6)
    assert unanimous.predict(obs)[0] == 0  # the slowest learner votes no
    with pytest.raises(ValueError, match="aggregate"):
        WADiLoCo(aggregate="median")


def test_unanimity_uses_the_slowest_learner():
    env = diloco_gym.DiLoCoSyncEnv(regime="bursty")
    obs, _ = env.reset(seed=1)
    for _ in range(5):
        obs, *_ = env.step(0)
    rep = env.unwrapped.learner_reports()
    p = env.params
    clip_loss = np.clip(rep["loss_delta"] / p.loss_clip, 0, 1)
    assert obs[core.OBS_INDEX["loss_progress_min"]] == pytest.approx(clip_loss.min(), rel=1e-5)
    assert obs[core.OBS_INDEX["loss_progress_mean"]] == pytest.approx(clip_loss.mean(), rel=1e-5)


def test_fixed_interval_merges_every_h():
    env = diloco_gym.DiLoCoSyncEnv(regime="sync-heavy")
    res = run_episode(env, FixedInterval(256), seed=0)
    step = 256 // env.params.decision_interval
    assert res["merge_decisions"] == list(range(step, env.episode.n_decisions, step))


def test_batched_predict_shapes():
    obs = np.random.default_rng(0).random((7, core.OBS_DIM)).astype(np.float32)
    for name in HEURISTICS:
        if name == "offline-oracle":
            continue
        a, _ = make_agent(name).predict(obs)
        assert a.shape == (7,) and set(np.unique(a)) <= {0, 1}
    with pytest.raises(ValueError, match="features"):
        make_agent("wa-diloco").predict(np.zeros(3))


def test_oracle_without_the_episode_says_why_and_names_the_wrapper():
    with pytest.raises(
        RuntimeError, match="non-deployable.*future merge costs.*AttachAgentWrapper"
    ):
        OfflineCalibratedOracle().predict(np.zeros(core.OBS_DIM, dtype=np.float32))


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


# --------------------------------------------------------------------------- deployability
_FORBIDDEN = (gym.Env, gym.Wrapper, core.Episode, Trace, ReplayResult)
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


def test_only_the_oracle_is_non_deployable():
    assert [n for n in HEURISTICS if not make_agent(n).deployable] == ["offline-oracle"]


def test_random_deferral_draws_depend_only_on_what_it_sees():
    """No episode seed: each episode's coins come from a stream seeded by its first
    observation, so an episode's schedule does not depend on what ran before, and merges
    follow p."""
    env = diloco_gym.DiLoCoSyncEnv(regime="bursty")
    agent = RandomDeferral()
    first = run_episode(env, agent, 5)["merge_decisions"]
    run_episode(env, agent, 3)
    assert run_episode(env, agent, 5)["merge_decisions"] == first
    assert run_episode(env, RandomDeferral(), 5)["merge_decisions"] == first
    assert run_episode(env, RandomDeferral(seed=1), 5)["merge_decisions"] != first
    obs = np.random.default_rng(0).random((4000, core.OBS_DIM)).astype(np.float32)
    agent.attach(None)
    u = agent.uniforms(obs)
    assert 0.0 <= u.min() and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.02
    assert abs(agent.predict(obs)[0].mean() - 0.5) < 0.03


def test_random_deferral_coins_do_not_depend_on_later_observations():
    """After the first observation the coins are a stream: changing every later
    observation changes no draw (a per-observation hash would redraw them all)."""
    rng = np.random.default_rng(1)
    obs = rng.random((50, core.OBS_DIM)).astype(np.float32)
    other = obs.copy()
    other[1:] = rng.random((49, core.OBS_DIM)).astype(np.float32)
    a, b = RandomDeferral(), RandomDeferral()
    a.attach(None)
    b.attach(None)
    ua = [a.uniforms(o[None])[0] for o in obs]
    ub = [b.uniforms(o[None])[0] for o in other]
    assert ua == ub
    b.attach(None)  # a new episode with another first observation: another stream
    assert [b.uniforms(o[None])[0] for o in other[::-1]] != ua


def test_report_marks_non_deployable_agents():
    from diloco_gym.eval.report import ReportConfig, render_markdown, run_protocol

    res = run_protocol(
        ReportConfig(regimes=["bursty"], agents=["fixed-512", "offline-oracle"], seeds=2, draws=20),
        progress=False,
    )
    rows, summ = res["rows"], res["summary"].set_index("agent")
    assert dict(zip(rows["agent"], rows["deployable"], strict=True)) == {
        "fixed-512": True,
        "offline-oracle": False,
    }
    assert bool(summ.loc["offline-oracle", "deployable"]) is False
    assert bool(summ.loc["fixed-512", "deployable"]) is True
    md = render_markdown(res, [])
    assert "| offline-oracle (non-deployable) |" in md and "| fixed-512 |" in md
    with pytest.raises(ValueError, match="given twice"):
        run_protocol(
            ReportConfig(regimes=["bursty"], agents=["fixed-512", "fixed-512"], seeds=2, draws=2),
            progress=False,
        )


def test_cli_run_marks_the_oracle_non_deployable(capsys):
    assert main(["run", "--agent", "offline-oracle", "--regime", "bursty", "--seeds", "2"]) == 0
    assert "agent offline-oracle (non-deployable) on bursty" in capsys.readouterr().out


def test_evaluate_policy_accepts_heuristic_agents():
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor

    env = Monitor(diloco_gym.DiLoCoSyncEnv(regime="bursty"))
    env.reset(seed=0)
    mean, std = evaluate_policy(WADiLoCo(), env, n_eval_episodes=2, deterministic=True)
    assert np.isfinite(mean) and mean < 0  # merges cost SLO violations in bursty


def test_oracle_is_optimal_at_equal_budget():
    """No agent beats the oracle on the cost it optimises, at the agent's own budget."""
    env = diloco_gym.DiLoCoSyncEnv(regime="bursty")
    p = env.params
    for seed in range(3):
        for name in HEURISTICS:
            res = run_episode(env, make_agent(name), seed)
            cost = env.episode.merge_cost
            m = res["merges"]
            best, total = schedules.optimal_schedule(cost, p.h_min, p.h_max, m)
            assert total <= cost[res["merge_decisions"]].sum() + 1e-9
            assert len(best) == m
        free = run_episode(env, OfflineCalibratedOracle(), seed)
        _, opt = schedules.optimal_schedule(env.episode.merge_cost, p.h_min, p.h_max)
        assert env.episode.merge_cost[free["merge_decisions"]].sum() == pytest.approx(opt)


def test_online_forecast_is_causal():
    """Two traces equal up to t give the online agent identical actions up to t."""
    gen = diloco_gym.get_regime("bursty")
    a = gen(np.random.default_rng(0))
    t_cut = 300.0
    keep = a.arrival_s < t_cut
    rng = np.random.default_rng(1)
    extra = np.sort(rng.uniform(t_cut, a.duration_s, 3000))
    b = Trace(
        np.concatenate([a.arrival_s[keep], extra]),
        np.concatenate([a.prompt_tokens[keep], np.full(extra.size, 4000)]),
        np.concatenate([a.output_tokens[keep], np.full(extra.size, 300)]),
        a.duration_s,
        network=a.network,
        checkpoint=a.checkpoint,
    )
    runs = []
    for tr in (a, b):
        env = diloco_gym.DiLoCoSyncEnv(regime=tr, skip_forced=False, reward_rate_rps=8.0)
        obs, _ = env.reset(seed=0)
        agent = OnlineForecastWA()
        attach_agent(env, agent, 0)
        acts = []
        while True:
            t = env.decision * env.params.decision_seconds
            act = int(agent.predict(obs)[0])
            if t < t_cut:
                acts.append(act)
            obs, _, _, trunc, _ = env.step(act)
            if trunc:
                break
        runs.append(acts)
    assert runs[0] == runs[1]
    assert len(runs[0]) > 200


def test_bursty_ordering_over_20_seeds():
    """The paper's ordering: oracle < online-forecast < fixed-256, and fixed-256 > fixed-512."""
    env = diloco_gym.DiLoCoSyncEnv(regime="bursty")
    mean = {}
    for name in ("offline-oracle", "online-forecast", "fixed-256", "fixed-512"):
        agent = make_agent(name)
        mean[name] = np.mean([run_episode(env, agent, s)["sync_excess_pct"] for s in range(20)])
    assert mean["offline-oracle"] < mean["online-forecast"] < mean["fixed-256"]
    assert mean["fixed-256"] > mean["fixed-512"]


def test_cli_run_prints_per_seed_table(capsys):
    assert main(["run", "--agent", "wa-diloco", "--regime", "bursty", "--seeds", "2"]) == 0
    out = capsys.readouterr().out
    assert "sync-excess %" in out and "total" in out
    assert len([ln for ln in out.splitlines() if ln.strip().startswith(("0 ", "1 "))]) == 2


def test_cli_run_unknown_names(capsys):
    with pytest.raises(SystemExit, match="valid agents"):
        main(["run", "--agent", "nope", "--regime", "bursty", "--seeds", "1"])
    with pytest.raises(SystemExit, match="valid regimes: ordinary"):
        main(["run", "--agent", "fixed-256", "--regime", "burst", "--seeds", "1"])


def test_cli_run_on_a_trace_file(tmp_path, capsys):
    from diloco_gym.sim.loaders import save_native

    tr = diloco_gym.get_regime("bursty")(np.random.default_rng(0))
    path = tmp_path / "t.csv"
    save_native(Trace(tr.arrival_s, tr.prompt_tokens, tr.output_tokens, tr.duration_s), path)
    assert (
        main(
            [
                "run",
                "--agent",
                "fixed-512",
                "--trace",
                str(path),
                "--format",
                "native",
                "--seeds",
                "2",
            ]
        )
        == 0
    )
    assert "fixed-512 on t" in capsys.readouterr().out


def test_cli_train_without_the_rl_extra(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "diloco_gym.rl.train", None)  # as if SB3 were missing
    with pytest.raises(SystemExit) as exc:
        main(["train", "--algo", "ppo", "--timesteps", "10", "--out", "x"])
    assert exc.value.code == 2
    assert "needs the 'rl' extra" in capsys.readouterr().err
