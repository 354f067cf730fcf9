"""The simulator's side of a live verdict (:mod:`diloco_gym.live.verdicts`): the window's
episode, the agent's and the matched-random schedules and their predicted excess are
exactly what the env and the protocol's report compute."""

from __future__ import annotations

import numpy as np
import pytest

from diloco_gym.agents.registry import make_agent
from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.eval.protocol import EpisodeScorer, counts_for, episode_control
from diloco_gym.eval.rollout import run_episode
from diloco_gym.live.verdicts import (
    agent_schedule,
    matched_random_schedules,
    merge_windows_s,
    predicted_excess,
    predicted_violation_pct,
    schedule_from_starts,
    window_episode,
)
from diloco_gym.sim.regimes import get_regime
from diloco_gym.sim.traces import Trace, window

SEED = 3


@pytest.fixture(scope="module")
def regime():
    return get_regime("bursty")


@pytest.fixture(scope="module")
def trace(regime):
    return window(regime(np.random.default_rng(11)), 0.0, 300.0)


@pytest.fixture(scope="module")
def we(trace, regime):
    return window_episode(trace, regime.sidecar, seed=SEED)


@pytest.fixture(scope="module")
def reported(trace, regime):
    """What the report's rollout gives each agent on the window's episode."""
    env = DiLoCoSyncEnv(regime=trace, sidecar=regime.sidecar)
    env.reset(seed=SEED)
    ep = env.episode
    return {
        name: run_episode(env, make_agent(name), SEED, ep)
        for name in ("online-forecast", "fixed-256")
    }


def test_window_episode_is_the_envs_episode(we, trace, regime, reported):
    env = DiLoCoSyncEnv(regime=trace, sidecar=regime.sidecar)
    env.reset(seed=SEED)
    ep = env.episode
    assert we.n_decisions == ep.n_decisions == we.episode.n_decisions
    for field in ("base_s", "req_bin", "pressure_bin", "merge_cost"):
        assert np.array_equal(getattr(we.episode, field), getattr(ep, field)), field
    assert we.scorer.matches(ep) and we.seed == SEED and we.params == env.params
    res = reported["fixed-256"]
    assert we.control_violation_pct == res["no_sync_violation_pct"]


def test_a_window_too_short_gives_the_envs_error(regime):
    short = Trace(np.array([0.5, 1.0]), np.array([10, 10]), np.array([5, 5]), 20.0, name="w3")
    with pytest.raises(ValueError, match=r"trace 'w3' of 20\.0 s is too short") as info:
        window_episode(short, regime.sidecar)
    assert "\n" not in str(info.value)


def test_window_episode_refuses_wrong_types(trace, regime):
    with pytest.raises(TypeError, match="trace must be a Trace, got str"):
        window_episode("bursty", regime.sidecar)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="sidecar must be a SidecarParams, got dict"):
        window_episode(trace, {})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seed must be an int"):
        window_episode(trace, regime.sidecar, seed=-1)


@pytest.mark.parametrize("name", ["online-forecast", "fixed-256"])
def test_agent_schedule_is_what_the_report_rolls_out(we, reported, name):
    sched = agent_schedule(we, make_agent(name))
    res = reported[name]
    assert sched.dtype == np.int8 and sched.shape == (we.n_decisions,)
    assert int(sched.sum()) == res["merges"] > 0
    assert np.flatnonzero(sched).tolist() == res["merge_decisions"]
    # and by name
    assert np.array_equal(agent_schedule(we, name), sched)


def test_fixed_256_merges_every_32_decisions(we):
    at = np.flatnonzero(agent_schedule(we, "fixed-256"))
    assert at[0] == 32 and set(np.diff(at).tolist()) == {32}
    assert at.size == (we.n_decisions - 1) // 32


def test_matched_random_schedules_are_the_protocols_draws(we):
    m, draws = 7, 25
    got = matched_random_schedules(we, m, draws, SEED)
    assert got.shape == (draws, we.n_decisions) and got.dtype == np.int8
    counts = counts_for(we.n_decisions, we.params, 40)
    control = episode_control(we.scorer, m, draws, SEED, counts)
    idx = np.nonzero(got)[1].reshape(draws, m)
    assert np.array_equal(idx, control.schedules)
    # the window's seed is the default, and another seed draws others
    assert np.array_equal(matched_random_schedules(we, m, draws), got)
    assert not np.array_equal(matched_random_schedules(we, m, draws, SEED + 1), got)
    # exactly the control's scores
    assert np.array_equal(predicted_excess(we, got), control.scores.exact_pct)


def test_matched_random_schedules_refuse_bad_budgets(we):
    with pytest.raises(ValueError, match="draws must be >= 1, got 0"):
        matched_random_schedules(we, 5, 0)
    with pytest.raises(ValueError, match="merges must be >= 0"):
        matched_random_schedules(we, -1, 3)
    with pytest.raises(ValueError, match="merges"):
        matched_random_schedules(we, we.n_decisions, 3)  # more merges than fit
    with pytest.raises(ValueError, match="DRAWS"):
        matched_random_schedules(we, 5, 10**9)


def test_predicted_excess_is_the_exact_scorer(we):
    agent = agent_schedule(we, "online-forecast")
    rand = matched_random_schedules(we, 4, 3)
    none = np.zeros(we.n_decisions, dtype=np.int8)
    rows = np.vstack([agent, rand, none])
    got = predicted_excess(we, rows)
    fresh = EpisodeScorer(we.episode, we.params, we.sidecar)
    want_agent = fresh.score(np.flatnonzero(agent)[None, :]).exact_pct
    want_rand = fresh.score(np.nonzero(rand)[1].reshape(3, 4)).exact_pct
    assert got.shape == (5,)
    assert got[0] == want_agent[0] and np.array_equal(got[1:4], want_rand)
    assert got[4] == 0.0 and (got[:4] > 0).all()
    assert predicted_excess(we, agent).tolist() == [got[0]]


def test_predicted_violation_pct_is_the_envs_replay(we, reported):
    res = reported["online-forecast"]
    sched = agent_schedule(we, "online-forecast")
    got = predicted_violation_pct(we, sched)
    assert got == we.control_violation_pct + predicted_excess(we, sched)[0]
    # the env's whole-episode replay decides violations from the latency: the same up to
    # a request within rounding of its SLO
    assert abs(got - res["violation_pct"]) <= we.episode.pct_per_request + 1e-9
    with pytest.raises(ValueError, match="one schedule expected, got 2"):
        predicted_violation_pct(we, np.vstack([sched, sched]))


def test_bad_schedules_are_refused(we):
    with pytest.raises(ValueError, match=rf"one 0/1 entry per decision \({we.n_decisions}\)"):
        predicted_excess(we, np.zeros(we.n_decisions + 1))
    bad = np.zeros(we.n_decisions)
    bad[40] = 2
    with pytest.raises(ValueError, match="entries must be 0 or 1"):
        predicted_excess(we, bad)
    with pytest.raises(ValueError, match="schedule must be 1-D"):
        merge_windows_s(np.zeros((2, 3)), we.params)


def test_merge_windows_follow_the_envs_clock_and_round_trip(we, reported):
    sched = agent_schedule(we, "online-forecast")
    wins = merge_windows_s(sched, we.params)
    p = we.params
    assert [s for s, _ in wins] == reported["online-forecast"]["merge_times_s"]
    assert all(n == p.merge_steps * p.step_seconds for _, n in wins)
    assert [s for s, _ in wins] == [d * p.decision_seconds for d in np.flatnonzero(sched)]
    assert p.decision_seconds == pytest.approx(1.12)
    starts = [s for s, _ in wins]
    assert np.array_equal(schedule_from_starts(starts, p, we.n_decisions), sched)
    # a launch late inside its decision is still that decision
    late = [s + 0.9 * p.decision_seconds for s in starts]
    assert np.array_equal(schedule_from_starts(late, p, we.n_decisions), sched)
    assert schedule_from_starts([], p, 5).tolist() == [0] * 5


def test_schedule_from_starts_refuses_bad_starts(we):
    p, n = we.params, we.n_decisions
    dec = p.decision_seconds
    with pytest.raises(ValueError, match=r"fall in one decision \(3,") as info:
        schedule_from_starts([3 * dec + 0.01, 3 * dec + 0.5], p, n)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="outside the window's"):
        schedule_from_starts([-0.5], p, n)
    with pytest.raises(ValueError, match="outside the window's"):
        schedule_from_starts([n * dec + 0.01], p, n)
    with pytest.raises(ValueError, match="must be finite"):
        schedule_from_starts([float("nan")], p, n)
