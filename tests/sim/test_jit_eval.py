"""The evaluation's compiled loops (:mod:`diloco_gym.sim.jit_eval`) against the NumPy rules
they replace, bit for bit: the exact scorer's replay (``EpisodeScorer._score_grid`` and
:func:`diloco_gym.sim.sidecar.merge_window`) and the matched-random sampler (the NumPy
draw loop, kept here as the reference)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import diloco_gym
from diloco_gym.eval.scorer import EpisodeScorer
from diloco_gym.sim import schedules
from diloco_gym.sim.regimes import REGIMES
from diloco_gym.sim.sidecar import merge_window


def _episode(busy: float, seed: int, duration_s: float = 600.0):
    """An episode of bursty load with bursts of ``busy`` req/s (24: well above the
    sidecar's capacity, so merges interact and windows are replayed)."""
    regime = dataclasses.replace(REGIMES["bursty"], busy_rate_rps=busy, duration_s=duration_s)
    env = diloco_gym.DiLoCoSyncEnv(regime=regime)
    env.reset(seed=seed)
    return env.episode, env.params, env.sidecar


def _schedules(ep, p, rng) -> list[np.ndarray]:
    """Random feasible schedules of several budgets, the additive optimum's, and the
    budgets' extremes."""
    n = ep.n_decisions
    lo, hi = schedules.budget_range(n, p.h_min, p.h_max)
    out = []
    for m in sorted({max(lo, 1), max(lo, 1) + 1, (lo + hi) // 2, hi - 1, hi}):
        out.append(schedules.sample_uniform(n, p.h_min, p.h_max, m, 60, rng))
        out.append(schedules.optimal_schedule(ep.merge_cost, p.h_min, p.h_max, m)[0][None, :])
    return out


@pytest.mark.parametrize("busy", [17.0, 24.0, 40.0])
def test_compiled_scores_equal_the_grid_rule(busy):
    """``score_rows`` gives ``_score_grid``'s extra violations and replayed flags exactly,
    at the default load (nothing replayed), at high load (merges interact) and saturated
    (windows that never drain)."""
    rng = np.random.default_rng(int(busy))
    replayed = 0
    for seed in (0, 1):
        ep, p, sc = _episode(busy, seed)
        scorer = EpisodeScorer(ep, p, sc)
        for sch in _schedules(ep, p, rng):
            total, rep = scorer._score_compiled(sch)
            ref_total, ref_rep = scorer._score_grid(sch)
            assert total.tobytes() == ref_total.tobytes()
            np.testing.assert_array_equal(rep, ref_rep)
            replayed += int(rep.sum())
    if busy > 17.0:
        assert replayed > 0


def test_compiled_scores_without_precomputed_thresholds():
    """The windows' other path (thresholds from the slowdown per request, as the isolated
    cost computes them, when none are precomputed) gives the same scores."""
    ep, p, sc = _episode(40.0, 1)
    scorer = EpisodeScorer(ep, p, sc)
    sch = schedules.sample_uniform(
        ep.n_decisions, p.h_min, p.h_max, 12, 80, np.random.default_rng(2)
    )
    with_thr = scorer._score_compiled(sch)
    scorer._thresholds = (np.empty(0), np.empty(0))
    without = scorer._score_compiled(sch)
    ref_total, ref_rep = scorer._score_grid(sch)
    for total, rep in (with_thr, without):
        assert total.tobytes() == ref_total.tobytes()
        np.testing.assert_array_equal(rep, ref_rep)
    assert ref_rep.any()


def test_compiled_scores_on_a_long_episode_and_single_merges():
    """An hour at high load (windows far longer than a merge's cost horizon) and one-merge
    schedules at every decision: the compiled scores equal the grid rule's."""
    ep, p, sc = _episode(24.0, 3, duration_s=3600.0)
    scorer = EpisodeScorer(ep, p, sc)
    m = ep.n_decisions // 40
    sch = schedules.sample_uniform(
        ep.n_decisions, p.h_min, p.h_max, m, 30, np.random.default_rng(5)
    )
    for batch in (sch, np.arange(ep.n_decisions)[:, None]):
        total, rep = scorer._score_compiled(batch)
        ref_total, ref_rep = scorer._score_grid(batch)
        assert total.tobytes() == ref_total.tobytes()
        np.testing.assert_array_equal(rep, ref_rep)


def _moves(best: np.ndarray, n: int, h_min: int, h_max: int) -> np.ndarray:
    """Feasible schedules one move from ``best``: one merge moved, or a suffix shifted."""
    out = []
    for j in range(best.size):
        for delta in (-5, -2, -1, 1, 2, 5):
            one, tail = best.copy(), best.copy()
            one[j] += delta
            tail[j:] += delta
            out += [c for c in (one, tail) if schedules.is_feasible(c, n, h_min, h_max)]
    return np.array(out)


def test_resuming_from_a_shared_prefix_gives_the_same_scores():
    """Scores with ``around`` (rows resumed from a reference's states where they share its
    first merges: a local search's neighbours) equal the scores without it, bit for bit,
    for neighbours, identical rows, unrelated rows, and an unusable reference."""
    for busy in (24.0, 40.0):
        ep, p, sc = _episode(busy, 4)
        scorer = EpisodeScorer(ep, p, sc)
        rng = np.random.default_rng(3)
        for m in (9, 14, 25):
            best = schedules.optimal_schedule(ep.merge_cost, p.h_min, p.h_max, m)[0]
            cand = np.concatenate(
                [
                    _moves(best, ep.n_decisions, p.h_min, p.h_max),
                    best[None, :],
                    schedules.sample_uniform(ep.n_decisions, p.h_min, p.h_max, m, 20, rng),
                ]
            )
            plain = scorer.score(cand)
            for ref in (best, best[::-1], best[:-1]):
                got = scorer.score(cand, around=ref)
                assert got.exact_pct.tobytes() == plain.exact_pct.tobytes()
                np.testing.assert_array_equal(got.replayed, plain.replayed)


def test_score_falls_back_to_the_grid_rule_for_unordered_schedules(monkeypatch):
    """A schedule that repeats or reorders a decision goes to the grid rule (the compiled
    loop assumes strictly increasing decisions), which it always went to."""
    ep, p, sc = _episode(24.0, 0)
    scorer = EpisodeScorer(ep, p, sc)
    seen = []
    monkeypatch.setattr(scorer, "_score_grid", lambda sch: seen.append(sch) or (None, None))
    monkeypatch.setattr(scorer, "_score_compiled", lambda sch: pytest.fail("compiled"))
    for odd in ([[40, 40, 100]], [[100, 40, 200]]):
        with pytest.raises(TypeError):  # the stub's None scores
            scorer.score(np.array(odd))
    assert [s.tolist() for s in seen] == [[[40, 40, 100]], [[100, 40, 200]]]


@pytest.mark.parametrize("busy", [17.0, 24.0, 40.0])
def test_compiled_windows_equal_merge_window(busy):
    """``window_rows`` (the scorer's isolated merges) gives :func:`merge_window`'s drain,
    drain bin and excess exactly, for windows from one bin to the episode's end."""
    ep, p, sc = _episode(busy, 2)
    scorer = EpisodeScorer(ep, p, sc)
    rng = np.random.default_rng(11)
    n_bins = scorer.n_bins
    starts = np.sort(rng.integers(0, n_bins, 300))
    lengths = np.maximum(1, (rng.random(300) * (n_bins - starts)).astype(np.int64))
    lengths[:20] = n_bins - starts[:20]
    lengths[20:40] = np.minimum(1 + np.arange(20), n_bins - starts[20:40])
    drained, t_drain, excess = scorer._isolated(starts, lengths)
    (ref_d, ref_t), ref_e = merge_window(
        scorer._q,
        scorer._base_bl,
        starts,
        np.zeros(starts.size),
        scorer.prefmin[starts],
        lengths,
        scorer.w,
        sc,
    )
    np.testing.assert_array_equal(drained, ref_d)
    np.testing.assert_array_equal(t_drain, ref_t)
    assert excess.tobytes() == ref_e.tobytes()


def _sample_reference(n, h_min, h_max, m, k, rng, counts=None) -> np.ndarray:
    """The NumPy draw loop the compiled picks replaced (gather each draw's cumulative
    weights, compare with its uniform)."""
    f = counts if counts is not None else schedules.completion_table(n, h_min, h_max, max(m, 0))
    out = np.empty((k, m), dtype=np.int64)
    if k == 0:
        return out
    cur = np.zeros(k, dtype=np.int64)
    width = h_max - h_min + 1
    for j in range(m):
        c_lo = int(cur.min())
        cw = np.cumsum(f.window_weights(m - j, c_lo, int(cur.max())), axis=1)[cur - c_lo]
        u = rng.random(k) * cw[:, -1]
        pick = np.minimum((cw <= u[:, None]).sum(axis=1), width - 1)
        cur = cur + h_min + pick
        out[:, j] = cur
    return out


def test_compiled_sampler_reproduces_the_numpy_draws_and_stream():
    """``sample_uniform`` draws the same schedules as the NumPy loop from the same
    generator, and leaves the generator in the same state: random corridors and budgets,
    the budgets' extremes, one-wide corridors, one draw, no draws, no merges."""
    rng = np.random.default_rng(0)
    cases = [(535, 16, 64, m, 1000) for m in (8, 9, 14, 33)]
    cases += [(5, 1, 1, 4, 7), (10, 3, 3, 3, 5), (8, 2, 9, 0, 3), (40, 2, 9, 5, 0)]
    cases += [(60, 4, 12, 6, 1), (2000, 8, 40, 120, 50)]
    for _ in range(30):
        h_min = int(rng.integers(1, 12))
        h_max = h_min + int(rng.integers(0, 30))
        n = int(rng.integers(1, 400))
        lo, hi = schedules.budget_range(n, h_min, h_max)
        if lo <= hi:
            cases.append(
                (n, h_min, h_max, int(rng.integers(lo, hi + 1)), int(rng.integers(1, 200)))
            )
    for n, h_min, h_max, m, k in cases:
        lo, hi = schedules.budget_range(n, h_min, h_max)
        assert lo <= m <= hi, (n, h_min, h_max, m)
        counts = schedules.completion_table(n, h_min, h_max, max(m + 3, 0))
        for table in (None, counts):
            a, b = np.random.default_rng([n, m, 7]), np.random.default_rng([n, m, 7])
            got = schedules.sample_uniform(n, h_min, h_max, m, k, a, counts=table)
            ref = _sample_reference(n, h_min, h_max, m, k, b, counts=table)
            np.testing.assert_array_equal(got, ref)
            assert a.bit_generator.state == b.bit_generator.state
            assert got.shape == (k, m)
            for row in got[:5]:
                assert schedules.is_feasible(row, n, h_min, h_max)


def _credits_reference(ep, p, sc) -> np.ndarray:
    """The added violations by decision of one whole-episode replay per decision's merge
    (:func:`replay` with its mask): what ``credit_counts`` counts."""
    from diloco_gym.envs.schedule import sync_mask
    from diloco_gym.sim.sidecar import replay

    n, n_bins = ep.n_decisions, ep.pressure_bin.size
    dec = np.minimum(ep.req_bin // p.decision_interval, n - 1)
    base = np.asarray(ep.baseline.violated, dtype=bool)
    mask = sync_mask(np.arange(n)[:, None], n_bins, p)
    res = replay(ep.base_s, ep.req_bin, ep.pressure_bin, mask, sc, p.step_seconds)
    r, j = np.nonzero(np.asarray(res.violated, dtype=bool) & ~base[None, :])
    return np.bincount(r * n + dec[j], minlength=n * n).reshape(n, n)


@pytest.mark.parametrize("busy", [17.0, 24.0, 40.0])
def test_compiled_credit_counts_equal_the_whole_episode_replays(busy):
    """``credit_counts`` counts, per decision's merge and arrival decision, exactly the
    violations the whole-episode replay with that merge adds; ``pair_credits`` built on it
    keeps its identities (before + tail is each merge's added violations)."""
    from diloco_gym.eval.lower_bound import pair_credits
    from diloco_gym.sim import compiled_eval
    from diloco_gym.sim.sidecar import slowdown

    ep, p, sc = _episode(busy, 5, duration_s=300.0)
    n, n_bins = ep.n_decisions, ep.pressure_bin.size
    assert ep.pressure_bin.dtype == np.float64 and ep.base_s.dtype == np.float64
    ref = _credits_reference(ep, p, sc)
    base_s = np.ascontiguousarray(ep.base_s)
    req_bin = np.ascontiguousarray(ep.req_bin, dtype=np.int64)
    got = np.full((n, n), -1, dtype=np.int64)
    compiled_eval().credit_counts(
        np.arange(n), p.decision_interval, p.merge_steps, n,
        np.bincount(req_bin, weights=base_s, minlength=n_bins),
        slowdown(ep.pressure_bin, None, sc), sc.slots * p.step_seconds,
        1.0 + sc.sync_slowdown, base_s, req_bin, sc.slots, sc.slo_s,
        np.asarray(ep.baseline.violated, dtype=bool), got,
    )  # fmt: skip
    np.testing.assert_array_equal(got, ref)
    before, window, tail = pair_credits(ep, p, sc)
    np.testing.assert_array_equal(before + tail, ref.sum(axis=1))
    if busy > 17.0:
        assert ref.sum() > 0


def _values_numpy(cost, h_min, h_max, m=None):
    """The oracle's DP values as the NumPy form computed them before they were compiled
    (strided sliding-window minima; free budget in blocks of ``h_min`` decisions)."""
    n = cost.size
    tail_ok = np.arange(n) >= n - h_max
    width = h_max - h_min + 1
    if m is None:
        g = np.full(n, np.inf)
        val = np.full(n + h_max + 1, np.inf)
        win = np.lib.stride_tricks.sliding_window_view(val[h_min:], width)
        d_hi = n
        while d_hi > 0:
            d_lo = max(0, d_hi - h_min)
            best = win[d_lo:d_hi].min(axis=1)
            gb = np.where(tail_ok[d_lo:d_hi], np.minimum(0.0, best), best)
            g[d_lo:d_hi] = gb
            val[d_lo:d_hi] = cost[d_lo:d_hi] + gb
            d_hi = d_lo
        return g, val
    g = np.empty((m + 1, n))
    g[0] = np.where(tail_ok, 0.0, np.inf)
    ext = np.full(n + h_max + 1, np.inf)
    win = np.lib.stride_tricks.sliding_window_view(ext[h_min:], width)
    for j in range(1, m + 1):
        ext[:n] = cost + g[j - 1]
        g[j] = win[:n].min(axis=1)
    return g, None


def test_the_oracle_dp_values_are_the_numpy_forms_bit_for_bit():
    """``free_budget_values`` and ``budget_values`` give the sliding-window minima of the
    NumPy form exactly, on costs full of ties and on continuous ones, across corridors."""
    from diloco_gym.sim import jit_eval

    rng = np.random.default_rng(9)
    for trial in range(200):
        n = int(rng.integers(30, 600))
        h_min = int(rng.integers(1, 20))
        h_max = h_min + int(rng.integers(0, 50))
        cost = rng.integers(0, 4, n).astype(float) if trial % 2 else rng.random(n) * 50
        g = np.full(n, np.inf)
        val = np.full(n + h_max + 1, np.inf)
        jit_eval.free_budget_values(cost, h_min, h_max, n - h_max, g, val)
        g_ref, val_ref = _values_numpy(cost, h_min, h_max)
        np.testing.assert_array_equal(g, g_ref)
        np.testing.assert_array_equal(val, val_ref)
        m = int(rng.integers(1, 12))
        gm = np.empty((m + 1, n))
        jit_eval.budget_values(cost, h_min, h_max, n - h_max, gm, np.empty(n + h_max + 1))
        np.testing.assert_array_equal(gm, _values_numpy(cost, h_min, h_max, m)[0])
