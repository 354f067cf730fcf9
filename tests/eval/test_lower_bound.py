"""The certified lower bound on the exact optimum (diloco_gym.eval.lower_bound): its
premise (a merge only adds violations), and the bound against brute force at high load."""

from __future__ import annotations

import numpy as np
import pytest
from protocol_helpers import hot_instance

from diloco_gym.envs.schedule import sync_mask
from diloco_gym.eval import protocol
from diloco_gym.eval.lower_bound import lower_bound_pct, pair_credits
from diloco_gym.eval.oracle import ORACLE_BOUND, oracle_score
from diloco_gym.eval.scorer import EpisodeScorer
from diloco_gym.sim import schedules
from diloco_gym.sim.sidecar import replay


def _credit(ep, p, sc, sched: np.ndarray) -> int:
    """The bound's credit of one schedule, from its definition and whole replays: each
    merge's own added violations among the requests arriving up to the next merge (from
    the start for the first merge, to the end for the last)."""
    base = ep.baseline.violated
    dec = np.minimum(ep.req_bin // p.decision_interval, ep.n_decisions - 1)
    total = 0
    for k, d in enumerate(sched):
        mask = sync_mask(np.array([[d]]), ep.pressure_bin.size, p)
        res = replay(ep.base_s, ep.req_bin, ep.pressure_bin, mask, sc, p.step_seconds)
        added = res.violated[0] & ~base
        lo = 0 if k == 0 else d
        hi = sched[k + 1] if k + 1 < sched.size else ep.n_decisions
        total += int((added & (dec >= lo) & (dec < hi)).sum())
    return total


def test_the_premise_holds_a_merge_only_adds_violations():
    """Adding a merge to a schedule never lowers its exact sync-excess, and every schedule's
    exact excess is at least its credit (the sum the bound minimises)."""
    env = hot_instance(20.0, 1)
    ep, p, sc = env.episode, env.params, env.sidecar
    credits = pair_credits(ep, p, sc)
    scorer = EpisodeScorer(ep, p, sc)
    # the credits of one merge are its isolated excess, split by arrival
    np.testing.assert_array_equal(credits[0] + credits[2], scorer.iso_excess)
    every = np.array(schedules.brute_force_schedules(ep.n_decisions, p.h_min, p.h_max, 4))
    exact = protocol.replay_full(ep, every, p, sc)
    pct = ep.pct_per_request
    for sched, value in zip(every, exact, strict=True):
        assert value >= _credit(ep, p, sc, sched) * pct - 1e-9
        for k in range(sched.size):  # drop one merge: never more excess
            sub = np.delete(sched, k)
            assert protocol.replay_full(ep, sub[None, :], p, sc)[0] <= value + 1e-9
        if sched[0] >= 8:  # a few schedules only: the loop replays each subset
            break
    # the bound is the least credit over every feasible schedule (the DP is exact)
    least = min(_credit(ep, p, sc, s) for s in every[:: max(1, len(every) // 60)])
    assert lower_bound_pct(ep, 4, p, sc, credits=credits) <= least * pct + 1e-9
    # ... and equal to the least credit over every schedule, by enumeration of the credits
    before, window, tail = credits
    steps = every[:, 1:] - every[:, :-1] - p.h_min
    totals = before[every[:, 0]] + window[every[:, :-1], steps].sum(axis=1) + tail[every[:, -1]]
    assert lower_bound_pct(ep, 4, p, sc, credits=credits) == pytest.approx(totals.min() * pct)


def test_the_bound_is_below_the_brute_force_optimum_and_can_be_tight():
    """Enumerable instances from steady to saturating load: the bound never exceeds the
    exact optimum (every schedule replayed), equals it where merges do not interact, and is
    strictly informative (> 0) on the loaded ones; the additive optimum, by contrast, is no
    lower bound (it is above the optimum on some of them)."""
    below, gaps, additive_above = [], [], 0
    for rate in (10.0, 16.0, 20.0):
        for seed in range(3):
            env = hot_instance(rate, seed)
            ep, p, sc = env.episode, env.params, env.sidecar
            scorer = EpisodeScorer(ep, p, sc)
            credits = pair_credits(ep, p, sc)
            for m in (3, 5):
                every = np.array(
                    schedules.brute_force_schedules(ep.n_decisions, p.h_min, p.h_max, m)
                )
                opt = protocol.replay_full(ep, every, p, sc).min()
                lb = lower_bound_pct(ep, m, p, sc, credits=credits)
                below.append(lb <= opt + 1e-9)
                gaps.append(opt - lb)
                if scorer.episode_proven:
                    assert lb == pytest.approx(opt, abs=1e-9)
                add = schedules.optimal_schedule(scorer.cost, p.h_min, p.h_max, m)[1]
                additive_above += int(add * scorer.pct > opt + 1e-9)
    assert all(below)
    assert min(gaps) == pytest.approx(0.0, abs=1e-9) and max(gaps) > 0.1
    assert additive_above > 0  # the naive 'bound' would have been wrong here


def test_the_oracle_reports_the_bound_when_it_cannot_enumerate():
    env = hot_instance(20.0, 0)
    ep, p, sc = env.episode, env.params, env.sidecar
    scorer = EpisodeScorer(ep, p, sc)
    every = np.array(schedules.brute_force_schedules(ep.n_decisions, p.h_min, p.h_max, 5))
    opt = protocol.replay_full(ep, every, p, sc).min()
    o = oracle_score(ep, 5, p, sc, scorer=scorer, enumerate_max=0)
    assert o["status"] == ORACLE_BOUND
    assert o["lower_bound_pct"] <= opt + 1e-9 <= o["exact_pct"] + 2e-9
    exact = oracle_score(ep, 5, p, sc, scorer=scorer)
    assert exact["lower_bound_pct"] == exact["exact_pct"] == pytest.approx(opt, abs=1e-9)
    assert lower_bound_pct(ep, 0, p, sc) == 0.0
    with pytest.raises(ValueError, match="no feasible schedule has 40 merges"):
        lower_bound_pct(ep, 40, p, sc)


def _brute_chain(credits, gap_lo, positions, gaps) -> float:
    """chain_bound by enumeration: every schedule of len(positions) decisions keeping to
    the position and gap ranges, its pair-credit total (first: arrivals before it and up
    to the next; last: to the end)."""
    import itertools

    before, window, tail = credits
    n = before.size
    best = np.inf
    for sched in itertools.combinations(range(n), len(positions)):
        if any(not a <= t <= b for t, (a, b) in zip(sched, positions, strict=True)):
            continue
        steps = np.diff(sched)
        if any(not a <= g <= b for g, (a, b) in zip(steps, gaps, strict=False)):
            continue
        total = before[sched[0]] + tail[sched[-1]]
        for t, g in zip(sched[:-1], steps, strict=False):
            total += window[t, g - gap_lo]
        best = min(best, float(total))
    return best


def test_chain_bound_is_the_least_total_over_the_ranges_by_brute_force():
    """The chain bound (any position and gap ranges, as a site's syncs with per-site timing
    need) is the least pair-credit total over the schedules keeping to them, checked by
    enumeration on random credits; and with the corridor's ranges it is lower_bound_pct."""
    from diloco_gym.eval.lower_bound import chain_bound

    rng = np.random.default_rng(3)
    n, gap_lo, gap_hi = 14, 2, 13
    for trial in range(40):
        credits = (
            rng.integers(0, 9, n),
            rng.integers(0, 9, (n, gap_hi - gap_lo + 1)),
            rng.integers(0, 9, n),
        )
        r = int(rng.integers(1, 5))
        positions = []
        for _ in range(r):
            a = int(rng.integers(0, n))
            positions.append((a, a + int(rng.integers(0, 8))))
        gaps = []
        for _ in range(r - 1):
            a = int(rng.integers(gap_lo, 6))
            gaps.append((a, min(gap_hi, a + int(rng.integers(0, 6)))))
        got = chain_bound(credits, gap_lo, positions, gaps)
        assert got == _brute_chain(credits, gap_lo, positions, gaps), trial
    assert chain_bound(credits, gap_lo, [], []) == 0.0

    env = hot_instance(20.0, 1)
    ep, p, sc = env.episode, env.params, env.sidecar
    credits = pair_credits(ep, p, sc)
    n = ep.n_decisions
    lo, hi = schedules.budget_range(n, p.h_min, p.h_max)
    assert hi - lo >= 2
    for m in range(max(lo, 1), hi + 1):
        ranges = [(p.h_min, p.h_max)] + [(0, n - 1)] * (m - 1)
        a, b = ranges[-1]
        ranges[-1] = (max(a, n - p.h_max), b)  # the last merge within h_max of the end
        got = chain_bound(credits, p.h_min, ranges, [(p.h_min, p.h_max)] * (m - 1))
        assert got * ep.pct_per_request == lower_bound_pct(ep, m, p, sc, credits=credits)
