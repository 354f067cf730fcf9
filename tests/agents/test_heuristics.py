"""The paper's policies as agents (agents/heuristics.py): the corridor, determinism, the
scores they compute, causality and the paper's ordering."""

from __future__ import annotations

import numpy as np
import pytest

import diloco_gym
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
    FLEET_ONLY,
    HEURISTICS,
    LEARNED,
    is_budget_aware_spec,
    make_agent,
)
from diloco_gym.envs.observation import OBS_DIM, OBS_INDEX
from diloco_gym.envs.params import EnvParams
from diloco_gym.eval.rollout import attach_agent, run_episode
from diloco_gym.sim import schedules
from diloco_gym.sim.traces import Trace

#: Agents that run on a single host without a merge budget; the budget-aware ones
#: (BUDGETED, and the budget-conditioned learned agents) need merge_budget=M and are
#: checked at budgets in tests/eval/test_frontier.py and tests/rl/test_learned.py; those
#: of FLEET_ONLY need a capped fleet and are checked there in tests/agents/test_fleet_cap.py.
FREE_AGENTS = [
    n for n in AGENTS if n not in BUDGETED and n not in FLEET_ONLY and not is_budget_aware_spec(n)
]


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


def test_wa_score_matches_formula():
    obs = np.zeros(OBS_DIM, dtype=np.float32)
    ix = OBS_INDEX
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
    assert obs[OBS_INDEX["loss_progress_min"]] == pytest.approx(clip_loss.min(), rel=1e-5)
    assert obs[OBS_INDEX["loss_progress_mean"]] == pytest.approx(clip_loss.mean(), rel=1e-5)


def test_fixed_interval_merges_every_h():
    env = diloco_gym.DiLoCoSyncEnv(regime="sync-heavy")
    res = run_episode(env, FixedInterval(256), seed=0)
    step = 256 // env.params.decision_interval
    assert res["merge_decisions"] == list(range(step, env.episode.n_decisions, step))


def test_batched_predict_shapes():
    obs = np.random.default_rng(0).random((7, OBS_DIM)).astype(np.float32)
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
        OfflineCalibratedOracle().predict(np.zeros(OBS_DIM, dtype=np.float32))


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
    obs = np.random.default_rng(0).random((4000, OBS_DIM)).astype(np.float32)
    agent.attach(None)
    u = agent.uniforms(obs)
    assert 0.0 <= u.min() and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.02
    assert abs(agent.predict(obs)[0].mean() - 0.5) < 0.03


def test_random_deferral_coins_do_not_depend_on_later_observations():
    """After the first observation the coins are a stream: changing every later
    observation changes no draw (a per-observation hash would redraw them all)."""
    rng = np.random.default_rng(1)
    obs = rng.random((50, OBS_DIM)).astype(np.float32)
    other = obs.copy()
    other[1:] = rng.random((49, OBS_DIM)).astype(np.float32)
    a, b = RandomDeferral(), RandomDeferral()
    a.attach(None)
    b.attach(None)
    ua = [a.uniforms(o[None])[0] for o in obs]
    ub = [b.uniforms(o[None])[0] for o in other]
    assert ua == ub
    b.attach(None)  # a new episode with another first observation: another stream
    assert [b.uniforms(o[None])[0] for o in other[::-1]] != ua


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


@pytest.mark.parametrize(
    "name",
    ["fixed-256", "fixed-512", "pressure-gate", "wa-diloco", "calibrated-wa", "online-forecast",
     "fixed-budget", "online-forecast-budget"],
)  # fmt: skip
def test_one_observation_decides_as_a_batch_does(name):
    """An agent asked about one observation (a runner's decision: NumPy scalar arithmetic)
    decides exactly as on a batch holding it (array arithmetic): random observations,
    round values on the features' edges, zero time left and NaNs included."""
    from diloco_gym.agents.base import AgentContext
    from diloco_gym.agents.registry import make_agent

    rng = np.random.default_rng(5)
    obs = rng.random((3000, 17)).astype(np.float32)
    obs[1000:2000] = np.round(obs[1000:2000] * 8) / 8
    obs[2000:2050, 15] = 0.0
    obs[rng.integers(2050, 3000, 200), rng.integers(0, 17, 200)] = np.nan
    agent = make_agent(name)
    agent.attach(AgentContext(EnvParams(merge_budget=12), "bursty"))
    batch = agent.act(obs)
    one = np.concatenate([agent.act(obs[i : i + 1]) for i in range(len(obs))])
    single = np.array([agent.predict(o)[0] for o in obs])
    assert one.dtype == np.int64 and one.shape == (len(obs),)
    np.testing.assert_array_equal(one, batch)
    np.testing.assert_array_equal(single, batch)
    assert 0 < batch.sum() < len(obs)  # both decisions occur: the check can fail


def test_one_observation_scores_bit_for_bit_as_a_batch():
    """The scores themselves, not only the decisions: a WA score and the budget state of
    one observation equal the batch's values bit for bit (the observation's float32
    arithmetic for the score, float64 for the budget state)."""
    from diloco_gym.agents.heuristics import CalibratedWA
    from diloco_gym.envs.budget_features import BudgetPace

    obs = np.random.default_rng(6).random((500, 17)).astype(np.float32)
    for agent in (WADiLoCo(), CalibratedWA()):
        batch = agent.score(obs)
        one = np.array([agent.score(o) for o in obs])
        assert batch.dtype == one.dtype == np.float32
        np.testing.assert_array_equal(one, batch)
    pace = BudgetPace(EnvParams(merge_budget=12))
    obs[1, OBS_INDEX["time_left"]] = 1.0  # n from the gap divides by zero: the gap + 1
    obs[2, OBS_INDEX["merges"]] = 0.0
    obs[3, OBS_INDEX["budget_left"]] = 1.0  # no merge yet: n from the gap
    obs[4, OBS_INDEX["gap"]] = np.nan  # not finite: read as the array form reads it
    obs[5, OBS_INDEX["time_left"]] = np.inf
    batch = pace.read(obs)
    for i in (0, 1, 2, 3, 4, 5, 17, 499):
        one = pace.read(obs[i])
        for key, values in batch.items():
            assert np.asarray(one[key]).dtype == values.dtype == np.float64
            assert one[key] == values[i] or (np.isnan(one[key]) and np.isnan(values[i]))
