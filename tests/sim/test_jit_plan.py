"""The causal planner's compiled loops (:mod:`diloco_gym.sim.jit_plan`) against plain
computations: the budget DP's first merge against the offline oracle's exact programme
(:func:`diloco_gym.sim.schedules.optimal_schedule`), the chain's forecast against matrix
powers, and the filter's update against Bayes' rule in NumPy."""

from __future__ import annotations

import numpy as np

from diloco_gym.sim import compiled_plan
from diloco_gym.sim.schedules import budget_range, is_feasible, optimal_schedule


def _first(cost, gap, h_min, h_max, m, pace=0.0):
    c = np.asarray(cost, dtype=np.float64)
    return compiled_plan().plan_first(
        c, gap, h_min, h_max, m, pace, np.empty(2 * (c.size + h_max + 1))
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
    # A real difference wins over the pace.
    cost[12] = 1.0
    assert _first(cost, 0, 10, 40, 9, pace=30.0) == 12


def _chain(hazard):
    s = hazard.size
    t = np.zeros((s, s))
    for i in range(s):
        t[i, 0] += hazard[i]
        if i + 1 < s:
            t[i, i + 1] += 1.0 - hazard[i]
    return t


def test_the_forecast_is_the_chain_run_forward():
    rng = np.random.default_rng(2)
    s = 30
    hazard = rng.random(s) * 0.3
    hazard[-1] = 1.0
    kappa = rng.random(s) * 100
    p = rng.random(s)
    p /= p.sum()
    jit = compiled_plan()
    out = np.empty(50)
    jit.expected_costs(p, hazard, kappa, out, np.empty(s), np.empty(s))
    t = _chain(hazard)
    want = [p @ np.linalg.matrix_power(t, j) @ kappa for j in range(50)]
    np.testing.assert_allclose(out, want, rtol=1e-12)
    q = p.copy()
    jit.phase_predict(q, hazard, 7, np.empty(s))
    np.testing.assert_allclose(q, p @ np.linalg.matrix_power(t, 7), rtol=1e-12)


def test_the_update_is_bayes_rule():
    rng = np.random.default_rng(3)
    s = 40
    mu = rng.random(s) * 20 + 0.1
    p = rng.random(s)
    p[5] = 0.0
    p /= p.sum()
    for count, weight in ((0, 1.0), (7, 1.0), (19, 0.5)):
        q = p.copy()
        assert compiled_plan().phase_update(q, mu, float(count), weight) == 0
        lik = np.exp(weight * (count * np.log(mu) - mu))
        want = p * lik / np.sum(p * lik)
        np.testing.assert_allclose(q, want, rtol=1e-10)


def test_undersized_arrays_are_refused_not_overrun():
    jit = compiled_plan()
    p = np.full(10, 0.1)
    hazard = np.full(10, 0.2)
    small = np.empty(3)
    assert jit.phase_predict(p, hazard, 2, small) == -1
    assert jit.phase_update(p, small, 1.0, 1.0) == -1
    assert jit.expected_costs(p, hazard, np.ones(10), np.empty(4), small, np.empty(10)) == -1
    assert jit.plan_first(np.ones(50), 0, 2, 8, 7, 0.0, np.empty(10)) == -1
    np.testing.assert_array_equal(p, np.full(10, 0.1))
