"""The rate-clairvoyant reference (diloco_gym.eval.clairvoyant): the episode's own bursts,
independent arrivals, the exact DP on the expected cost, scored by the exact replay."""

from __future__ import annotations

import numpy as np
import pytest

from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.envs.episode import episode_from_seed
from diloco_gym.eval import clairvoyant as cv
from diloco_gym.eval import frontier as fr
from diloco_gym.eval import protocol
from diloco_gym.sim.regimes import REGIMES, ReplayRegime
from diloco_gym.sim.schedules import sample_uniform


def _slice_times(gen):
    edges = np.arange(0.0, gen.duration_s + 1.0, 1.0)
    return 0.5 * (edges[1:] + edges[:-1])


@pytest.mark.parametrize("regime", ["bursty", "non-periodic"])
def test_same_rate_keeps_the_episodes_bursts_and_redraws_the_arrivals(regime):
    gen = DiLoCoSyncEnv(regime=REGIMES[regime]).generator
    seed = 11
    # With the arrivals drawn from the episode's own generator (after its rate draws), the
    # redraw is the episode itself: the rate function is the episode's, bit for bit.
    rng = np.random.default_rng(seed)
    gen.rate_rps(_slice_times(gen), rng, _sorted=True)
    # (the grid's size does not matter: rate_rps draws the same numbers for any times)
    same = cv.SameRate(gen, seed)(rng)
    assert np.array_equal(same.arrival_s, gen(np.random.default_rng(seed)).arrival_s)
    # With another generator: other arrivals, the same bursts (the busy periods' request
    # density matches the episode's far better than another episode's bursts do).
    other = cv.SameRate(gen, seed)(np.random.default_rng(999))
    assert not np.array_equal(other.arrival_s, same.arrival_s)
    t = _slice_times(gen)
    lam = gen.rate_rps(t, np.random.default_rng(seed), _sorted=True)
    lam_other_episode = gen.rate_rps(t, np.random.default_rng(seed + 1), _sorted=True)
    counts = np.histogram(other.arrival_s, bins=np.arange(0.0, gen.duration_s + 1.0, 1.0))[0]
    corr_same = np.corrcoef(counts, lam)[0, 1]
    corr_other = np.corrcoef(counts, lam_other_episode)[0, 1]
    assert corr_same > 0.5 and corr_same > corr_other + 0.2


def test_expected_cost_is_the_mean_of_the_redraws_and_undefined_on_a_trace(tmp_path):
    env = DiLoCoSyncEnv(regime="bursty")
    e2 = cv.expected_cost_pp(env, 3, draws=2)
    costs = []
    for j in range(2):
        ep = episode_from_seed(
            cv.SameRate(env.generator, 3),
            cv.draw_seed(3, j),
            env.params,
            env.sidecar,
            env.learner_params,
            rate_rps=env.reward_rate_rps,
        )
        costs.append(np.asarray(ep.merge_cost, float) * ep.pct_per_request)
    assert e2 == pytest.approx(np.mean(costs, axis=0), rel=1e-12)
    assert cv.draw_seed(3, 0) != cv.draw_seed(3, 1) != cv.draw_seed(4, 1)
    with pytest.raises(ValueError, match="draws must be >= 1"):
        cv.expected_cost_pp(env, 3, draws=0)
    trace = REGIMES["bursty"](np.random.default_rng(0))
    replay = DiLoCoSyncEnv(regime=ReplayRegime(trace))
    assert cv.expected_cost_pp(replay, 0) is None


def test_the_reference_lies_between_the_oracle_and_random_placement_on_bursts():
    env = DiLoCoSyncEnv(regime="bursty")
    p = env.params
    out = []
    for seed in range(4):
        ep = episode_from_seed(
            env.generator, seed, p, env.sidecar, env.learner_params, rate_rps=env.reward_rate_rps
        )
        scorer = protocol.EpisodeScorer(ep, p, env.sidecar)
        sched = cv.rate_clairvoyant_schedule(cv.expected_cost_pp(env, seed), p.h_min, p.h_max, 10)
        assert sched.size == 10 and np.all(np.diff(sched) >= p.h_min)
        rc = float(scorer.score(sched[None, :]).exact_pct[0])
        orc = protocol.oracle_score(ep, 10, p, env.sidecar, scorer=scorer)
        draws = sample_uniform(ep.n_decisions, p.h_min, p.h_max, 10, 200, np.random.default_rng(1))
        mr = float(scorer.score(draws).exact_pct.mean())
        if orc["exact_optimum"]:
            assert rc >= orc["exact_pct"] - 1e-9  # a feasible schedule: never below the optimum
        out.append((mr, rc, orc["exact_pct"]))
    mr, rc, orc = np.mean(out, axis=0)
    # knowing the bursts is worth most of the gap in the bursty regime, not all of it
    assert orc < rc < mr and (mr - rc) / (mr - orc) > 0.5


def test_frontier_reports_the_reference_and_the_gap_relative_to_it():
    cfg = fr.FrontierConfig(
        regimes=["bursty"],
        budgets_per_hour=[60.0],
        budget_agents=["fixed-budget"],
        free_agents=[],
        seeds=2,
        draws=20,
        in_process_agents=True,
    )
    res = fr.run_frontier(cfg, progress=False)
    rows, b = res["rows"], res["budgets"].iloc[0]
    assert np.isfinite(rows["rate_clairvoyant_pct"]).all()
    curves = res["curves"].set_index(["seed", "budget"])
    for r in rows.itertuples():
        assert r.rate_clairvoyant_pct == curves.loc[(r.seed, r.merges), "rate_clairvoyant_pct"]
    expect = (b["matched_random_pct"] - b["sync_excess_pct"]) / (
        b["matched_random_pct"] - b["rate_clairvoyant_pct"]
    )
    assert b["gap_captured_reachable"] == pytest.approx(expect)
    assert b["reachable_ci_low"] <= b["gap_captured_reachable"] <= b["reachable_ci_high"]
    md = fr.render_markdown(res, {})
    assert "*rate-clairvoyant (knows the bursts)*" in md
    assert "Gap captured relative to the rate-clairvoyant reference" in md
