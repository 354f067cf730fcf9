"""Merge schedules under the corridor: feasibility, counting, uniform sampling and the exact
optimum, each checked against brute-force enumeration on small instances."""

from __future__ import annotations

from collections import Counter
from functools import cache

import numpy as np
import pytest
from scipy.stats import chisquare

from diloco_gym.sim.schedules import (
    brute_force_schedules,
    budget_range,
    completion_counts,
    completion_table,
    is_feasible,
    optimal_schedule,
    sample_uniform,
    transition_kernel,
)

#: Small corridors (n, h_min, h_max) where brute force enumerates everything quickly.
SMALL = [
    (10, 2, 4),
    (12, 3, 5),
    (15, 2, 6),
    (17, 4, 4),
    (20, 3, 7),
    (9, 1, 3),
    (25, 4, 9),
    (6, 3, 8),
    (30, 5, 8),
]


def brute_completions(n: int, h_min: int, h_max: int, m: int, d: int) -> int:
    """Feasible ways to place exactly ``m`` more merges after a merge at ``d`` (recursion)."""

    @cache
    def count(last: int, left: int) -> int:
        if left == 0:
            return int((n - 1) - last < h_max)
        return sum(
            count(nxt, left - 1) for nxt in range(last + h_min, min(last + h_max, n - 1) + 1)
        )

    return count(d, m)


# --------------------------------------------------------------------------- feasibility
@pytest.mark.parametrize(
    "merges, feasible",
    [
        ([3, 6], True),  # gaps 3, 3; tail 9 - 6 = 3 < 4
        ([4, 8], True),
        ([2, 4, 6, 8], True),
        ([], False),  # the tail 9 - 0 reaches H_max: a merge was due
        ([1, 5], False),  # first gap below H_min
        ([5, 9], False),  # first gap above H_max
        ([3, 4, 8], False),  # second gap below H_min
        ([4, 10], False),  # past the last decision
        ([3], False),  # tail 9 - 3 = 6 >= H_max
    ],
)
def test_is_feasible_by_hand(merges, feasible):
    assert is_feasible(merges, 10, 2, 4) is feasible


@pytest.mark.parametrize("n, h_min, h_max", SMALL)
def test_brute_force_enumerates_exactly_the_feasible_schedules(n, h_min, h_max):
    listed = set(brute_force_schedules(n, h_min, h_max))
    assert all(is_feasible(s, n, h_min, h_max) for s in listed)
    # Every subset of small size that is feasible is listed (check by exhaustive subsets).
    if n <= 12:
        from itertools import combinations

        every = {
            c
            for k in range(n)
            for c in combinations(range(1, n), k)
            if is_feasible(c, n, h_min, h_max)
        }
        assert every == listed


# --------------------------------------------------------------------------- counting
@pytest.mark.parametrize("n, h_min, h_max", SMALL)
def test_budget_range_matches_brute_force(n, h_min, h_max):
    sizes = {len(s) for s in brute_force_schedules(n, h_min, h_max)}
    assert budget_range(n, h_min, h_max) == (min(sizes), max(sizes))
    # Every budget in between is feasible too (the range has no holes).
    assert sizes == set(range(min(sizes), max(sizes) + 1))


@pytest.mark.parametrize("n, h_min, h_max", SMALL)
def test_completion_counts_are_proportional_to_brute_force_counts(n, h_min, h_max):
    m_max = (n - 1) // h_min + 1
    f = completion_counts(n, h_min, h_max, m_max)
    assert f.shape == (m_max + 1, n)
    for m in range(m_max + 1):
        exact = np.array([brute_completions(n, h_min, h_max, m, d) for d in range(n)], float)
        np.testing.assert_array_equal(f[m] > 0, exact > 0)  # feasibility is exact
        if exact.max() > 0:
            np.testing.assert_allclose(f[m] / f[m].max(), exact / exact.max(), rtol=1e-12)
        assert (f[m, 0] > 0) == any(len(s) == m for s in brute_force_schedules(n, h_min, h_max))


def test_completion_counts_do_not_overflow_on_long_episodes():
    # Raw counts reach C(300, 78)-like sizes, far beyond float range; rows are rescaled.
    f = completion_counts(5000, 16, 64, 320)
    assert np.all(np.isfinite(f)) and f.max() <= 1.0
    lo, hi = budget_range(5000, 16, 64)
    assert (lo, hi) == (-(-(5000 - 64) // 64), (5000 - 1) // 16)
    assert f[lo, 0] > 0 and f[hi, 0] > 0 and f[lo - 1, 0] == 0 and f[hi + 1, 0] == 0
    draws = sample_uniform(
        5000, 16, 64, 100, 20, np.random.default_rng(0), counts=completion_table(5000, 16, 64, 100)
    )
    assert all(is_feasible(row, 5000, 16, 64) for row in draws)


@pytest.mark.parametrize("args", [(10, 0, 4), (10, 5, 4), (0, 2, 4)])
def test_bad_corridor_raises(args):
    with pytest.raises(ValueError, match="h_min|decision"):
        budget_range(*args)


# --------------------------------------------------------------------------- sampling
@pytest.mark.parametrize("n, h_min, h_max", SMALL)
def test_sample_uniform_draws_feasible_schedules_with_exactly_m_merges(n, h_min, h_max):
    rng = np.random.default_rng(0)
    lo, hi = budget_range(n, h_min, h_max)
    for m in range(lo, hi + 1):
        draws = sample_uniform(n, h_min, h_max, m, 200, rng)
        assert draws.shape == (200, m)
        assert draws.dtype.kind == "i"
        for row in draws:
            assert len(row) == m and is_feasible(row, n, h_min, h_max), row


@pytest.mark.parametrize(
    "n, h_min, h_max, m", [(20, 3, 7, 4), (25, 4, 9, 3), (15, 2, 6, 4), (30, 5, 8, 4)]
)
def test_sample_uniform_is_uniform(n, h_min, h_max, m):
    support = brute_force_schedules(n, h_min, h_max, m)
    assert 10 <= len(support) <= 400
    draws_per_cell = 60
    k = draws_per_cell * len(support)
    draws = sample_uniform(n, h_min, h_max, m, k, np.random.default_rng(12345))
    counts = Counter(map(tuple, draws.tolist()))
    assert set(counts) <= set(support)  # nothing outside the support
    observed = np.array([counts.get(s, 0) for s in support])
    assert observed.min() > 0  # everything in it is reached
    result = chisquare(observed)
    assert result.pvalue > 0.001, (len(support), result)


def test_sample_uniform_detects_non_uniformity():
    """The chi-square check has power: a sampler picking the earliest next merge twice as
    often is rejected on the same instance and number of draws."""
    n, h_min, h_max, m = 20, 3, 7, 4
    support = brute_force_schedules(n, h_min, h_max, m)
    rng = np.random.default_rng(1)
    draws = sample_uniform(n, h_min, h_max, m, 60 * len(support) * 2, rng)
    keep = (draws[:, 0] == draws[:, 0].min()) | (rng.random(len(draws)) < 0.5)
    counts = Counter(map(tuple, draws[keep].tolist()))
    observed = np.array([counts.get(s, 0) for s in support])
    assert chisquare(observed).pvalue < 1e-6


@pytest.mark.parametrize("m", [-1, 1, 50])
def test_sample_uniform_rejects_infeasible_budgets(m):
    lo, hi = budget_range(40, 4, 8)
    assert not lo <= m <= hi
    with pytest.raises(ValueError, match=rf"feasible budgets: {lo}\.\.{hi}"):
        sample_uniform(40, 4, 8, m, 5, np.random.default_rng(0))


def test_sample_uniform_reuses_counts_and_is_seeded():
    counts = completion_table(200, 16, 64, 8)
    a = sample_uniform(200, 16, 64, 4, 50, np.random.default_rng(5), counts=counts)
    b = sample_uniform(200, 16, 64, 4, 50, np.random.default_rng(5))
    np.testing.assert_array_equal(a, b)
    c = sample_uniform(200, 16, 64, 4, 50, np.random.default_rng(6))
    assert not np.array_equal(a, c)


# --------------------------------------------------------------------------- optimum
def brute_optima(cost, h_min, h_max) -> dict:
    """Least total cost per number of merges, over every feasible schedule."""
    best: dict[int, float] = {}
    for s in brute_force_schedules(len(cost), h_min, h_max):
        total = float(sum(cost[d] for d in s))
        best[len(s)] = min(best.get(len(s), np.inf), total)
    return best


@pytest.mark.parametrize("seed", range(25))
def test_optimal_schedule_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(8, 25)) if seed else 12
    h_min = int(rng.integers(2, 5)) if seed else 1
    h_max = int(rng.integers(h_min, h_min + 6))
    # Non-negative costs (merge costs) on even seeds; signed ones (a reward) on odd seeds.
    cost = rng.uniform(0, 10, n) if seed % 2 == 0 else rng.uniform(-5, 5, n)
    if seed % 3 == 0:
        cost = np.round(cost)  # ties
    best = brute_optima(cost, h_min, h_max)
    merges, total = optimal_schedule(cost, h_min, h_max)
    assert is_feasible(merges, n, h_min, h_max)
    assert total == pytest.approx(cost[merges].sum())
    assert total == pytest.approx(min(best.values()))
    lo, hi = budget_range(n, h_min, h_max)
    for m in range(lo, hi + 1):
        merges_m, total_m = optimal_schedule(cost, h_min, h_max, m=m)
        assert len(merges_m) == m
        assert is_feasible(merges_m, n, h_min, h_max)
        assert total_m == pytest.approx(cost[merges_m].sum())
        assert total_m == pytest.approx(best[m])
        assert total <= total_m + 1e-9  # the free budget is never worse


def test_optimal_schedule_tie_breaks():
    # All-zero cost: with an exact budget, ties go to the earliest decision.
    merges, total = optimal_schedule(np.zeros(20), 3, 6, m=4)
    assert total == 0.0
    assert merges.tolist() == sorted(merges.tolist())
    assert merges[0] == min(s[0] for s in brute_force_schedules(20, 3, 6, 4))
    # With a free budget, ties go to fewer merges.
    merges, total = optimal_schedule(np.zeros(20), 3, 6)
    lo, _ = budget_range(20, 3, 6)
    assert total == 0.0 and len(merges) == lo


def test_optimal_schedule_avoids_expensive_windows():
    cost = np.ones(40)
    cost[10:14] = 100.0  # a burst
    merges, total = optimal_schedule(cost, 4, 8)
    assert not any(10 <= d < 14 for d in merges)
    assert total == len(merges)


def test_optimal_schedule_bad_input():
    with pytest.raises(ValueError, match="finite"):
        optimal_schedule(np.array([0.0, np.nan, 1.0, 2.0]), 1, 2)
    with pytest.raises(ValueError, match=r"feasible budgets: \d+\.\.\d+"):
        optimal_schedule(np.zeros(20), 3, 6, m=1)
    with pytest.raises(ValueError, match="m must be >= 0"):
        optimal_schedule(np.zeros(20), 3, 6, m=-2)
    with pytest.raises(ValueError, match="h_min"):
        optimal_schedule(np.zeros(20), 6, 3)


# --------------------------------------------------------------------------- exactness at length
def _exact_marginals(n: int, h_min: int, h_max: int, m: int, back: list[list[int]]):
    """Exact ``P(merge j at d)`` for a uniform schedule with ``m`` merges, as floats from
    Python-integer counts: (ways to reach ``d`` with ``j + 1`` merges) x (completions from
    ``d`` with ``m - 1 - j`` more) / (all schedules)."""
    total = back[m][0]
    fwd = [1] + [0] * (n - 1)  # ways to stand at d after j merges (j = 0: the start)
    out = np.zeros((m, n))
    for j in range(m):
        nxt = [0] * n
        for d, ways in enumerate(fwd):
            if ways:
                for e in range(d + h_min, min(d + h_max, n - 1) + 1):
                    nxt[e] += ways
        fwd = nxt
        out[j] = [a * back[m - 1 - j][d] / total for d, a in enumerate(fwd)]
    return out


def _int_completions(n: int, h_min: int, h_max: int, m_max: int) -> list[list[int]]:
    rows = [[int((n - 1) - d < h_max) for d in range(n)]]
    for _ in range(m_max):
        prev = rows[-1]
        rows.append([sum(prev[d + h_min : min(d + h_max, n - 1) + 1]) for d in range(n)])
    return rows


def _kernel_marginals(n: int, h_min: int, h_max: int, m: int, table) -> np.ndarray:
    """Per-merge marginals obtained by propagating the sampler's own transition kernel."""
    dist = np.zeros(n)
    dist[0] = 1.0
    out = np.zeros((m, n))
    width = h_max - h_min + 1
    for j in range(m):
        cur = np.flatnonzero(dist > 0)
        k = transition_kernel(n, h_min, h_max, m, j, cur, counts=table)
        new = np.zeros(n + h_max + 1)
        np.add.at(
            new, (cur[:, None] + h_min + np.arange(width)).ravel(), (dist[cur][:, None] * k).ravel()
        )
        assert new[n:].sum() == 0.0  # the kernel never steps past the episode
        dist = new[:n]
        out[j] = dist
    return out


def test_sampler_kernel_is_exact_at_full_episode_length_for_every_budget():
    """517 decisions, corridor 16..64: within one row the counts span far more than 1e16
    (the float table of cumulative sums cancelled and was off by up to TV ~1 at 29-32
    merges); the sampler's kernel, propagated exactly, must give the integer marginals."""
    n, h_min, h_max = 517, 16, 64
    lo, hi = budget_range(n, h_min, h_max)
    assert (lo, hi) == (8, 32)
    back = _int_completions(n, h_min, h_max, hi)
    spread = max(max(r) / min(x for x in r if x) for r in back[1:])
    assert spread > 1e16  # the regime where float differences of partial sums cancel
    table = completion_table(n, h_min, h_max, hi)
    worst = 0.0
    for m in range(lo, hi + 1):
        exact = _exact_marginals(n, h_min, h_max, m, back)
        ours = _kernel_marginals(n, h_min, h_max, m, table)
        worst = max(worst, float(np.abs(ours - exact).max()))
        assert np.abs(ours - exact).max() <= 1e-9, (m, np.abs(ours - exact).max())
    assert worst < 1e-9


def test_sampler_at_the_largest_budget_puts_the_exact_mass_on_the_first_merge():
    # 32 merges in 517 decisions: P(first merge at decision 16) is 0.889 exactly.
    n, h_min, h_max, m = 517, 16, 64, 32
    back = _int_completions(n, h_min, h_max, m)
    p16 = back[m - 1][16] / back[m][0]
    assert p16 == pytest.approx(0.889, abs=1e-3)
    draws = sample_uniform(n, h_min, h_max, m, 4000, np.random.default_rng(3))
    share = float(np.mean(draws[:, 0] == 16))
    assert abs(share - p16) < 4 * np.sqrt(p16 * (1 - p16) / 4000)
    assert all(is_feasible(r, n, h_min, h_max) for r in draws[:50])


def test_completion_table_handles_hours_long_episodes():
    # A 6 h trace has ~19,000 decisions (24 h: ~77,000): the counts overflow any float, the
    # log table does not (the day-long table for 1,300 merges: ~1 s and ~57 MiB here).
    n, h_min, h_max = 19_250, 16, 64
    lo, hi = budget_range(n, h_min, h_max)
    assert (lo, hi) == (-(-n // h_max) - 1, (n - 1) // h_min)
    t = completion_table(n, h_min, h_max, 400)
    assert all(np.isfinite(r).all() for r in t.rows)
    assert t.feasible(400) and t.feasible(lo) and not t.feasible(lo - 1)
    draws = sample_uniform(n, h_min, h_max, 400, 5, np.random.default_rng(0), counts=t)
    assert all(is_feasible(r, n, h_min, h_max) for r in draws)
    # At the smallest budget every gap is near h_max; the sampler must still find them.
    draws = sample_uniform(n, h_min, h_max, lo, 3, np.random.default_rng(1), counts=t)
    assert all(is_feasible(r, n, h_min, h_max) for r in draws)


def test_sample_uniform_rejects_wrong_count_tables():
    with pytest.raises(TypeError, match="CompletionTable"):
        sample_uniform(
            200, 16, 64, 4, 5, np.random.default_rng(0), counts=completion_counts(200, 16, 64, 8)
        )
    with pytest.raises(ValueError, match="built for n=300"):
        sample_uniform(
            200, 16, 64, 4, 5, np.random.default_rng(0), counts=completion_table(300, 16, 64, 8)
        )
    with pytest.raises(ValueError, match="up to 3, not 4"):
        sample_uniform(
            200, 16, 64, 4, 5, np.random.default_rng(0), counts=completion_table(200, 16, 64, 3)
        )


def test_reach_only_table_gives_the_same_draws_as_the_full_table():
    from diloco_gym.sim.schedules import CompletionTable

    n, h_min, h_max, m_max = 5000, 16, 64, 120
    cut = CompletionTable(n, h_min, h_max, m_max)
    full = CompletionTable(n, h_min, h_max, m_max, reach_only=False)
    assert sum(r.size for r in cut.rows) < 0.7 * sum(r.size for r in full.rows)
    lo, _ = budget_range(n, h_min, h_max)
    for m in (lo, 100, m_max):
        a = sample_uniform(n, h_min, h_max, m, 200, np.random.default_rng(m), counts=cut)
        b = sample_uniform(n, h_min, h_max, m, 200, np.random.default_rng(m), counts=full)
        np.testing.assert_array_equal(a, b)


def test_sample_uniform_zero_draws_and_bad_k():
    assert sample_uniform(200, 16, 64, 4, 0, np.random.default_rng(0)).shape == (0, 4)
    with pytest.raises(ValueError, match="k must be >= 0"):
        sample_uniform(200, 16, 64, 4, -1, np.random.default_rng(0))
