"""``MatchedRandomScore`` (diloco_gym/eval/matched_score.py, public in
``diloco_gym.wrappers``): each episode's exact sync-excess and its matched random's figures,
the numbers the report gives for that episode and agent."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest

import diloco_gym  # noqa: F401  (registers the ids)
from diloco_gym.agents.registry import make_agent
from diloco_gym.eval.matched_score import SCORE_FIELDS, SCORE_KEY, MatchedRandomScore
from diloco_gym.eval.report import ReportConfig, run_protocol
from diloco_gym.eval.rollout import attach_agent

COMPARED = ("sync_excess_pct", "matched_random_mean", "matched_random_p05", "matched_random_p95")


def _episode(env: gym.Env, agent, seed: int) -> tuple[dict, int]:
    """One episode of ``agent`` (attached as the runner does); the last info and the
    number of scored infos seen before it."""
    obs, info = env.reset(seed=seed)
    ctx = attach_agent(env, agent, seed)
    early = 0
    while True:
        action, _ = agent.predict(obs)
        obs, _r, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return info, early
        early += SCORE_KEY in info
        ctx._set_mask(env.unwrapped.action_masks())


@pytest.mark.slow
def test_the_wrappers_figures_are_the_reports(tmp_path):
    agents = ["fixed-512", "pressure-gate", "random-deferral"]
    config = ReportConfig(
        regimes=["bursty"], agents=agents, seeds=2, draws=30, in_process_agents=True
    )
    rows = run_protocol(config, progress=False)["rows"]
    env = MatchedRandomScore(gym.make("DiLoCoSync-Bursty-v0"), draws=30)
    for name in agents:
        agent = make_agent(name)
        for seed in (0, 1):
            info, early = _episode(env, agent, seed)
            assert early == 0  # only the last step carries the score
            got = info[SCORE_KEY]
            assert set(got) == set(SCORE_FIELDS)
            row = rows[(rows["agent"] == name) & (rows["seed"] == seed)].iloc[0]
            for key in COMPARED:
                assert got[key] == pytest.approx(row[key], abs=1e-12, rel=0), (name, seed, key)
            assert got["merges"] == row["merges"] and got["episode_seed"] == seed
            assert got["gap_pp"] == got["sync_excess_pct"] - got["matched_random_mean"]
            assert got["matched_random_p05"] <= got["matched_random_mean"]
            assert got["matched_random_mean"] <= got["matched_random_p95"]


def test_actions_pass_through_unchanged():
    plain = gym.make("DiLoCoSync-Bursty-v0")
    wrapped = MatchedRandomScore(gym.make("DiLoCoSync-Bursty-v0"), draws=5)
    rng = np.random.default_rng(0)
    a, _ = plain.reset(seed=3)
    b, _ = wrapped.reset(seed=3)
    while True:
        action = int(rng.integers(2))
        a, ra, ta, ua, ia = plain.step(action)
        b, rb, tb, ub, ib = wrapped.step(action)
        assert np.array_equal(a, b) and ra == rb and (ta, ua) == (tb, ub)
        if ta or ua:
            break
    assert SCORE_KEY not in ia and ib[SCORE_KEY]["merges"] == len(
        ia["episode_summary"]["merge_decisions"]
    )
    assert ib[SCORE_KEY]["draws"] == 5


def test_bad_use_is_refused():
    with pytest.raises(TypeError, match="wraps a DiLoCoSync env"):
        MatchedRandomScore(gym.make("CartPole-v1"))
    with pytest.raises(ValueError, match="draws must be >= 1, got 0"):
        MatchedRandomScore(gym.make("DiLoCoSync-Bursty-v0"), draws=0)
    with pytest.raises(RuntimeError, match="call reset"):
        MatchedRandomScore(gym.make("DiLoCoSync-Bursty-v0")).step(0)


def test_the_score_is_the_matched_random_deferrals_distribution():
    """The control the wrapper scores against is what MatchedRandomDeferral plays: its
    draws at the same merges fall inside the control's range as often as a 5-95 % range
    says (a loose check over 40 draws, none of them the agent's)."""
    from diloco_gym.eval.protocol import MatchedRandomDeferral

    env = MatchedRandomScore(gym.make("DiLoCoSync-Bursty-v0"), draws=200)
    info, _ = _episode(env, make_agent("fixed-512"), 0)
    score = info[SCORE_KEY]
    played = []
    for draw_seed in range(40):
        control = MatchedRandomScore(
            MatchedRandomDeferral(gym.make("DiLoCoSync-Bursty-v0"), score["merges"], draw_seed),
            draws=1,
        )
        control.reset(seed=0)
        while True:
            _, _, terminated, truncated, last = control.step(0)
            if terminated or truncated:
                break
        assert last[SCORE_KEY]["merges"] == score["merges"]
        played.append(last[SCORE_KEY]["sync_excess_pct"])
    inside = np.mean(
        [score["matched_random_p05"] <= x <= score["matched_random_p95"] for x in played]
    )
    assert inside >= 0.6
    frame = pd.Series(played)
    assert abs(frame.mean() - score["matched_random_mean"]) < 3 * frame.std() / np.sqrt(40) + 0.5
