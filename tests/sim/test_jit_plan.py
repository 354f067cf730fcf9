"""The causal planner's compiled budget DP (:mod:`diloco_gym.sim.jit_plan`): its first merge
against the offline oracle's exact programme (:func:`diloco_gym.sim.schedules.optimal_schedule`),
its ties, and its refusal of arrays it would overrun."""

from __future__ import annotations

import numpy as np

from diloco_gym.sim import compiled_plan
from diloco_gym.sim.schedules import budget_range, is_feasible, optimal_schedule


def _first(cost, gap, h_min, h_max, m, pace=0.0, early=0.0):
    c = np.asarray(cost, dtype=np.float64)
    return compiled_plan().plan_first(
        c, gap, h_min, h_max, m, pace, early, np.empty(2 * (c.size + h_max + 1))
    )


def test_the_plan_starts_where_the_exact_optimum_does():
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(300):
        n = int(rng.integers(30, 250))
        h_min = int(rng.integers(2, 8))
        h_max = int(rng.integers(h_min, 24))
        lo, hi = budget_range(n, h_min, h_max)
        if hi < 1:
            continue
        m = int(rng.integers(max(lo, 1), hi + 1))
        cost = rng.random(n)
        merges, _ = optimal_schedule(cost, h_min, h_max, m)
        assert _first(cost, 0, h_min, h_max, m) == merges[0]
        # Mid-episode: after the optimum's first merge, from the first decision the corridor
        # opens, the plan's next merge is the optimum's second (principle of optimality).
        if m > 1:
            d = merges[0] + h_min
            assert d + _first(cost[d:], h_min, h_min, h_max, m - 1) == merges[1]
            checked += 1
    assert checked > 100


def test_the_plan_is_feasible_and_refuses_an_impossible_budget():
    rng = np.random.default_rng(1)
    n, h_min, h_max = 200, 5, 20
    for m in range(*budget_range(n, h_min, h_max)):
        if m < 1:
            continue
        cost = rng.random(n)
        # Follow the plan decision by decision: the replanned schedule is feasible, with m merges.
        merges: list[int] = []
        last = 0
        for d in range(1, n):
            gap = d - last
            if gap < h_min or len(merges) == m:
                continue
            if _first(cost[d:], gap, h_min, h_max, m - len(merges)) == 0:
                merges.append(d)
                last = d
        assert len(merges) == m and is_feasible(merges, n, h_min, h_max)
        assert merges == list(optimal_schedule(cost, h_min, h_max, m)[0])
    # One merge cannot cover 200 decisions with gaps of at most 20: no plan.
    assert _first(rng.random(n), 0, h_min, h_max, 1) == -1
    assert _first(rng.random(n), 0, h_min, h_max, 0) == -1


def test_ties_go_to_the_even_pace():
    # A flat cost: every feasible plan ties. Earliest without a pace, else the gap nearest it.
    cost = np.full(300, 5.0)
    assert _first(cost, 0, 10, 40, 9) == 10
    assert _first(cost, 0, 10, 40, 9, pace=30.0) == 30
    assert _first(cost[20:], 20, 10, 40, 8, pace=30.0) == 10  # a gap of 30 from the last merge
    # A real difference wins over the pace ...
    cost[12] = 1.0
    assert _first(cost, 0, 10, 40, 9, pace=30.0) == 12
    # ... unless the early-merge penalty (per decision short of the pace) outweighs it:
    # 18 decisions early at 0.3 each cost 5.4 > the 4.0 saved, at 0.2 each 3.6 < 4.0.
    assert _first(cost, 0, 10, 40, 9, pace=30.0, early=0.3) == 30
    assert _first(cost, 0, 10, 40, 9, pace=30.0, early=0.2) == 12


def test_undersized_scratch_or_a_gap_past_the_corridor_is_refused_not_overrun():
    jit = compiled_plan()
    assert jit.plan_first(np.ones(50), 0, 2, 8, 7, 0.0, 0.0, np.empty(10)) == -1
    assert jit.plan_first(np.ones(50), 9, 2, 8, 7, 0.0, 0.0, np.empty(200)) == -1
    assert jit.plan_first(np.ones(50), 0, 2, 8, 7, 0.0, 0.0, np.empty(200)) == 2
