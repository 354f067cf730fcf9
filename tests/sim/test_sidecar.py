"""The sidecar latency model: golden values on a hand-checkable trace, the closed-form
Lindley recursion and the vectorised per-merge costs against slow obvious loops, effect
sizes, and parameter validation."""

from __future__ import annotations

import numpy as np
import pytest

from diloco_gym.sim.sidecar import (
    ReplayResult,
    SidecarParams,
    base_latency_s,
    effect_sizes,
    merge_costs,
    percentile,
    replay,
)


# --------------------------------------------------------------------------- slow references
def slow_replay_latency(
    base_s, req_bin, pressure_bin, sync_bin, p: SidecarParams, bin_s: float
) -> np.ndarray:
    """The Lindley recursion as written in the module docstring, one bin at a time."""
    latency = np.full(len(base_s), np.nan)
    backlog = 0.0
    for k in range(len(pressure_bin)):
        sync = 0.0 if sync_bin is None else float(sync_bin[k])
        m = (1.0 + p.pressure_gain * pressure_bin[k] ** 2) * (1.0 + p.sync_slowdown * sync)
        work = 0.0
        for i in range(len(base_s)):
            if req_bin[i] == k:
                latency[i] = (base_s[i] + backlog / p.slots) * m
                work += base_s[i]
        backlog = max(0.0, backlog + work - p.slots * bin_s / m)
    return latency


def slow_merge_cost(base_s, req_bin, pressure_bin, p, bin_s, start, merge_bins, violated0):
    """Extra violations of one merge at ``start``, counted over its window and tail."""
    n_bins = len(pressure_bin)
    sync = np.zeros(n_bins)
    sync[start : start + merge_bins] = 1.0
    viol = slow_replay_latency(base_s, req_bin, pressure_bin, sync, p, bin_s) > p.slo_s
    horizon = merge_bins + int(round(p.tail_s / bin_s))
    inside = (req_bin >= start) & (req_bin < start + horizon)
    return int(np.sum(viol & ~violated0 & inside))


def random_instance(rng, n_bins=60, n_req=90, bin_s=0.5, **overrides):
    p = SidecarParams(
        **{
            "ttft_ms": 80.0,
            "prefill_ms_per_token": 0.2,
            "decode_ms_per_token": 5.0,
            "slots": 2.0,
            "sync_slowdown": 0.8,
            "pressure_gain": 0.7,
            "slo_ms": 900.0,
            "tail_s": 3.0,
            **overrides,
        }
    )
    prompt = rng.integers(10, 800, n_req)
    output = rng.integers(5, 150, n_req)
    base = base_latency_s(prompt, output, p)
    req_bin = np.sort(rng.integers(0, n_bins, n_req))
    pressure = rng.uniform(0, 1, n_bins)
    return p, base, req_bin, pressure, bin_s


# --------------------------------------------------------------------------- golden values
# Five requests, one slot, one-second bins, no pressure; a merge doubles service time.
#   request   bin  output tokens  base = (100 ms + 10 ms/token * output) / 1000
#   r0        0    40             0.5 s
#   r1        0    90             1.0 s
#   r2        1    20             0.3 s
#   r3        2    20             0.3 s
#   r4        3    40             0.5 s
GOLDEN_P = SidecarParams(
    ttft_ms=100.0,
    prefill_ms_per_token=0.0,
    decode_ms_per_token=10.0,
    slots=1.0,
    sync_slowdown=1.0,
    pressure_gain=0.0,
    slo_ms=1000.0,
    tail_s=2.0,
)
GOLDEN_BIN = np.array([0, 0, 1, 2, 3])
GOLDEN_OUT = np.array([40, 90, 20, 20, 40])


def golden_base():
    return base_latency_s(np.full(5, 123), GOLDEN_OUT, GOLDEN_P)


def test_golden_base_latency():
    np.testing.assert_allclose(golden_base(), [0.5, 1.0, 0.3, 0.3, 0.5])
    p = SidecarParams()  # 50 ms + 0.05 ms * 600 + 6 ms * 100 = 680 ms
    assert base_latency_s(np.array([600]), np.array([100]), p)[0] == pytest.approx(0.68)


def test_golden_replay_without_merge():
    # Work per bin: 1.5, 0.3, 0.3, 0.5, 0; capacity 1 per bin.
    # Backlog at the start of each bin: B0 = 0, B1 = 0.5, B2 = max(0, 0.5 + 0.3 - 1) = 0, 0, 0.
    # Latency = base + backlog: 0.5, 1.0, 0.3 + 0.5 = 0.8, 0.3, 0.5. r1 sits exactly at the
    # SLO (1.0 s) and does not violate: violation means strictly above.
    res = replay(golden_base(), GOLDEN_BIN, np.zeros(5), None, GOLDEN_P, 1.0)
    np.testing.assert_allclose(res.latency_s, [0.5, 1.0, 0.8, 0.3, 0.5])
    assert res.violated.tolist() == [False] * 5
    assert res.violation_pct == 0.0
    assert not res.sync_active.any()


def test_golden_replay_with_a_merge_in_bins_1_and_2():
    # Slowdown m = 2 in bins 1-2, so capacity halves there: 1, 0.5, 0.5, 1, 1.
    # B1 = 0.5, B2 = 0.5 + 0.3 - 0.5 = 0.3, B3 = 0.3 + 0.3 - 0.5 = 0.1, B4 = max(0, 0.1+0.5-1) = 0.
    # Latency: r0 0.5, r1 1.0, r2 (0.3 + 0.5) * 2 = 1.6, r3 (0.3 + 0.3) * 2 = 1.2,
    # r4 (0.5 + 0.1) * 1 = 0.6: the backlog outlasts the window and delays r4 by 0.1 s.
    sync = np.array([0, 1, 1, 0, 0], dtype=float)
    res = replay(golden_base(), GOLDEN_BIN, np.zeros(5), sync, GOLDEN_P, 1.0)
    np.testing.assert_allclose(res.latency_s, [0.5, 1.0, 1.6, 1.2, 0.6])
    assert res.violated.tolist() == [False, False, True, True, False]
    assert res.violation_pct == pytest.approx(40.0)
    assert res.sync_active.tolist() == [False, False, True, True, False]
    s = res.summary()
    assert s["requests"] == 5 and s["violated"] == 2
    # Sorted latencies 0.5, 0.6, 1.0, 1.2, 1.6 s; p95 sits at rank 0.95 * 4 = 3.8.
    assert s["p50_ms"] == pytest.approx(1000.0)
    assert s["p95_ms"] == pytest.approx(1200.0 + 0.8 * 400.0)
    assert s["sync_active_frac"] == pytest.approx(0.4)


def test_golden_pressure_slowdown():
    # pressure 0.5 with gain 2: m = 1 + 2 * 0.25 = 1.5 in bin 0, so r0 takes 0.75 s and
    # r1 1.5 s; capacity 1 / 1.5 leaves B1 = 1.5 - 2/3 = 5/6 for r2: (0.3 + 5/6) * 1 = 1.1333.
    p = SidecarParams(
        ttft_ms=100.0,
        prefill_ms_per_token=0.0,
        decode_ms_per_token=10.0,
        slots=1.0,
        sync_slowdown=1.0,
        pressure_gain=2.0,
        slo_ms=1000.0,
    )
    pressure = np.array([0.5, 0.0, 0.0, 0.0, 0.0])
    res = replay(golden_base(), GOLDEN_BIN, pressure, None, p, 1.0)
    b1 = 1.5 - 1.0 / 1.5
    b2 = max(0.0, b1 + 0.3 - 1.0)
    np.testing.assert_allclose(res.latency_s, [0.75, 1.5, 0.3 + b1, 0.3 + b2, 0.5])
    assert res.violated.tolist() == [False, True, True, False, False]
    np.testing.assert_allclose(res.pressure, [0.5, 0.5, 0, 0, 0])


def test_golden_merge_costs():
    # One merge of two bins (window), followed for a 2 s tail (horizon: 4 bins).
    # Start 0: capacity 0.5, 0.5, 1, 1: B = 0, 1.0, 0.8, 0.1; latency r0 0.5 * 2 = 1.0 (at the
    #   SLO, fine), r1 2.0, r2 (0.3 + 1.0) * 2 = 2.6, r3 0.3 + 0.8 = 1.1, r4 0.6 -> 3 requests.
    # Start 1: r2 and r3 (the replay above) -> 2.
    # Start 2: B = 0, 0.5, 0, 0; r3 0.3 * 2 = 0.6, r4 (0.5 + 0) * 2 = 1.0 (at the SLO) -> 0.
    # Starts 3, 4: r4 at most 1.0 s -> 0.
    base = golden_base()
    v0 = replay(base, GOLDEN_BIN, np.zeros(5), None, GOLDEN_P, 1.0).violated
    costs = merge_costs(
        base, GOLDEN_BIN, np.zeros(5), GOLDEN_P, 1.0, np.arange(5), 2, v0.astype(np.float64)
    )
    np.testing.assert_array_equal(costs, [3, 2, 0, 0, 0])
    slow = [
        slow_merge_cost(base, GOLDEN_BIN, np.zeros(5), GOLDEN_P, 1.0, s, 2, v0) for s in range(5)
    ]
    np.testing.assert_array_equal(costs, slow)


# --------------------------------------------------------------------------- fast vs slow
@pytest.mark.parametrize("seed", range(6))
def test_lindley_closed_form_matches_the_explicit_loop(seed):
    rng = np.random.default_rng(seed)
    p, base, req_bin, pressure, bin_s = random_instance(rng)
    sync = (rng.random(len(pressure)) < 0.3).astype(float)
    for mask in (None, sync):
        fast = replay(base, req_bin, pressure, mask, p, bin_s)
        slow = slow_replay_latency(base, req_bin, pressure, mask, p, bin_s)
        np.testing.assert_allclose(fast.latency_s, slow, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(fast.violated, slow > p.slo_s)
    # The instance is not trivial: a queue builds and some requests violate.
    assert fast.violated.any() and not fast.violated.all()
    assert np.any(fast.latency_s > base * 1.5)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("first, stride, merge_bins", [(0, 1, 4), (3, 2, 5), (1, 3, 3), (0, 5, 6)])
def test_merge_costs_match_brute_force_replays(seed, first, stride, merge_bins):
    rng = np.random.default_rng(100 + seed)
    p, base, req_bin, pressure, bin_s = random_instance(rng)
    v0 = replay(base, req_bin, pressure, None, p, bin_s).violated
    starts = np.arange(first, len(pressure), stride)  # runs to the end: horizons get clipped
    fast = merge_costs(base, req_bin, pressure, p, bin_s, starts, merge_bins, v0.astype(np.float64))
    slow = [
        slow_merge_cost(base, req_bin, pressure, p, bin_s, int(s), merge_bins, v0) for s in starts
    ]
    np.testing.assert_array_equal(fast, slow)
    assert np.sum(slow) > 0


def test_merge_costs_with_an_unbounded_tail_equal_the_whole_replay_excess():
    rng = np.random.default_rng(7)
    p, base, req_bin, pressure, bin_s = random_instance(rng, tail_s=1000.0)
    v0 = replay(base, req_bin, pressure, None, p, bin_s).violated
    starts = np.arange(0, len(pressure), 2)
    costs = merge_costs(base, req_bin, pressure, p, bin_s, starts, 4, v0.astype(np.float64))
    for s, c in zip(starts, costs, strict=True):
        sync = np.zeros(len(pressure))
        sync[s : s + 4] = 1.0
        full = replay(base, req_bin, pressure, sync, p, bin_s)
        assert c == np.sum(full.violated) - np.sum(v0)


def test_merge_costs_edge_cases():
    rng = np.random.default_rng(3)
    p, base, req_bin, pressure, bin_s = random_instance(rng)
    v0 = replay(base, req_bin, pressure, None, p, bin_s).violated.astype(np.float64)
    assert merge_costs(base, req_bin, pressure, p, bin_s, np.array([], dtype=int), 4, v0).shape == (
        0,
    )
    empty = merge_costs(base[:0], req_bin[:0], pressure, p, bin_s, np.arange(5), 4, v0[:0])
    np.testing.assert_array_equal(empty, np.zeros(5))
    one = merge_costs(base, req_bin, pressure, p, bin_s, np.array([10]), 4, v0)
    assert one[0] == slow_merge_cost(base, req_bin, pressure, p, bin_s, 10, 4, v0.astype(bool))
    with pytest.raises(ValueError, match="equally spaced"):
        merge_costs(base, req_bin, pressure, p, bin_s, np.array([0, 1, 3]), 4, v0)
    # No sync slowdown: merges are free.
    free = SidecarParams(sync_slowdown=0.0, slots=2.0)
    v0f = replay(base, req_bin, pressure, None, free, bin_s).violated.astype(np.float64)
    np.testing.assert_array_equal(
        merge_costs(base, req_bin, pressure, free, bin_s, np.arange(50), 4, v0f), np.zeros(50)
    )


def test_merge_only_ever_adds_latency():
    rng = np.random.default_rng(11)
    p, base, req_bin, pressure, bin_s = random_instance(rng)
    without = replay(base, req_bin, pressure, None, p, bin_s)
    sync = (rng.random(len(pressure)) < 0.4).astype(float)
    with_ = replay(base, req_bin, pressure, sync, p, bin_s)
    assert np.all(with_.latency_s >= without.latency_s - 1e-12)
    assert np.all(with_.violated[without.violated])
    assert with_.violation_pct > without.violation_pct


# --------------------------------------------------------------------------- effect sizes
def _result(latency, pressure, sync):
    latency = np.asarray(latency, dtype=float)
    return ReplayResult(latency, latency > 1.0, np.asarray(sync, bool), np.asarray(pressure, float))


def test_effect_sizes_on_a_constructed_replay():
    # Low-pressure requests take 1 s, high-pressure ones 3 s: ratio 3, positive correlation.
    # Sync-active requests are one low and one high; their p95 is 1 + 0.95 * 2 = 2.9 and the
    # inactive ones (two low, one high) have p95 = 1 + (0.95 * 2 - 1) * 2 = 2.8.
    res = _result(
        [1.0, 1.0, 1.0, 3.0, 3.0], [0.1, 0.2, 0.3, 0.6, 0.9], [True, False, False, True, False]
    )
    es = effect_sizes(res, high_pressure=0.6)  # 0.6 itself counts as high (>=)
    assert es["p95_high_low"] == pytest.approx(3.0)
    assert es["p95_sync_ratio"] == pytest.approx(2.9 / 2.8)
    assert 0.8 < es["pressure_latency_corr"] <= 1.0


def test_effect_sizes_degenerate_classes():
    res = _result([1.0, 2.0, 3.0], [0.1, 0.1, 0.1], [False, False, False])
    es = effect_sizes(res)
    assert np.isnan(es["p95_high_low"])  # no high-pressure request
    assert np.isnan(es["p95_sync_ratio"])  # no sync-active request
    assert es["pressure_latency_corr"] == 0.0  # constant pressure
    es = effect_sizes(_result([1.0, 2.0], [0.9, 0.7], [True, True]))
    assert np.isnan(es["p95_high_low"]) and np.isnan(es["p95_sync_ratio"])


def test_percentile_is_linear_interpolation():
    assert percentile(np.array([1.0, 2.0, 3.0, 4.0]), 95) == pytest.approx(3.85)
    assert percentile(np.array([5.0]), 50) == 5.0
    assert np.isnan(percentile(np.array([]), 95))


# --------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "field, value",
    [
        ("ttft_ms", -1.0),
        ("decode_ms_per_token", float("nan")),
        ("slots", 0.0),
        ("slo_ms", 0),
        ("serving_capacity_rps", -2.0),
        ("sync_slowdown", -0.5),
        ("pressure_gain", float("inf")),
        ("high_pressure", 0.0),
        ("high_pressure", 1.5),
        ("tail_s", "12"),
        ("slots", True),
        ("prefill_ms_per_token", None),
    ],
)
def test_bad_sidecar_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"SidecarParams\.{field}"):
        SidecarParams(**{field: value})


def test_sidecar_params_accept_ints_and_derive_slo_seconds():
    p = SidecarParams(slots=4, slo_ms=1500)
    assert p.slo_s == 1.5
    with pytest.raises(TypeError):
        SidecarParams(slot=4)  # a misspelt field is not silently ignored


@pytest.mark.parametrize("regime", ["bursty", "sync-heavy", "pressure-heavy", "non-periodic"])
def test_one_merge_cost_equals_the_batched_costs(regime):
    """The lazy per-merge path (what the env uses) equals the batched costs bit for bit."""
    from diloco_gym.envs.episode import episode_from_seed
    from diloco_gym.envs.params import EnvParams
    from diloco_gym.sim.learners import LearnerParams
    from diloco_gym.sim.regimes import get_regime

    gen = get_regime(regime)
    for seed in range(4):
        ep = episode_from_seed(gen, seed, EnvParams(), gen.sidecar, LearnerParams())
        lazy = [ep.merge_cost_at(d) for d in range(ep.n_decisions)]  # before the full array
        assert "merge_cost" not in ep.__dict__
        assert np.array_equal(np.array(lazy), ep.merge_cost)
        assert ep.merge_cost.sum() > 0 or regime == "pressure-heavy"


# --------------------------------------------------------------------------- fast paths
def test_summary_percentiles_equal_one_call_each():
    """``ReplayResult.summary`` takes the three percentiles from one call; each must equal
    ``percentile`` alone (and NaN for an empty replay)."""
    rng = np.random.default_rng(4)
    for n in (1, 2, 7, 4801):
        lat = rng.lognormal(-1.0, 0.8, n)
        res = ReplayResult(lat, lat > 0.5, np.zeros(n, bool), rng.random(n))
        s = res.summary()
        for q in (50, 95, 99):
            assert s[f"p{q}_ms"] == percentile(lat * 1000.0, q)
    empty = ReplayResult(np.zeros(0), np.zeros(0, bool), np.zeros(0, bool), np.zeros(0))
    assert all(np.isnan(empty.summary()[f"p{q}_ms"]) for q in (50, 95, 99))


def test_isolated_cost_from_the_episode_queue_equals_its_own():
    """``IsolatedMergeCost(queue=...)`` with the episode's no-merge queue (as the episode
    builder computed it) costs every decision exactly as the one computing its own queue."""
    from diloco_gym.envs.episode import episode_from_seed
    from diloco_gym.envs.params import EnvParams
    from diloco_gym.sim.learners import LearnerParams
    from diloco_gym.sim.regimes import get_regime
    from diloco_gym.sim.sidecar import IsolatedMergeCost

    p = EnvParams()
    for name, seed in (("bursty", 0), ("sync-heavy", 3), ("non-periodic", 5)):
        reg = get_regime(name)
        ep = episode_from_seed(reg, seed, p, reg.sidecar, LearnerParams())
        assert ep.queue is not None
        args = (
            ep.base_s,
            ep.req_bin,
            ep.pressure_bin,
            reg.sidecar,
            p.step_seconds,
            p.merge_steps,
            ep.baseline.violated,
        )
        own, shared = IsolatedMergeCost(*args), IsolatedMergeCost(*args, queue=ep.queue)
        np.testing.assert_array_equal(own.prefmin, shared.prefmin)
        for name, mine in own.queue._asdict().items():
            np.testing.assert_array_equal(mine, getattr(shared.queue, name), name)
        starts = np.arange(ep.n_decisions) * p.decision_interval
        costs = [shared.cost_at(s) for s in starts]
        assert costs == [own.cost_at(s) for s in starts]
        np.testing.assert_array_equal(costs, ep.merge_cost)


def test_isolated_cost_sorts_requests_given_out_of_order():
    """Requests not in bin order are still costed as in ``merge_costs`` (the stable sort
    is skipped only when the bins are already sorted)."""
    from diloco_gym.sim.sidecar import IsolatedMergeCost

    rng = np.random.default_rng(2)
    p = SidecarParams()
    n_bins, m = 400, 300
    req_bin = rng.integers(0, n_bins, m)  # unsorted
    base_s = rng.uniform(0.05, 0.4, m)
    pressure = rng.random(n_bins)
    v0 = replay(base_s, req_bin, pressure, None, p, 0.14).violated
    starts = np.arange(0, n_bins - 100, 8)
    expected = merge_costs(base_s, req_bin, pressure, p, 0.14, starts, 57, v0.astype(float))
    one = IsolatedMergeCost(base_s, req_bin, pressure, p, 0.14, 57, v0)
    np.testing.assert_array_equal([one.cost_at(s) for s in starts], expected)


def test_summary_fractions_equal_numpy_means():
    """The summary's violation % and sync-active fraction (counts over sizes) are exactly
    ``100 * mask.mean()`` and ``mask.mean()``, for one replay and for K at once."""
    rng = np.random.default_rng(11)
    for shape in ((1,), (3,), (4801,), (3, 997), (2, 0)):
        lat = rng.lognormal(-1.0, 0.8, shape)
        v, a = rng.random(shape) < rng.random(), rng.random(shape) < 0.3
        res = ReplayResult(lat, v, a, rng.random(shape))
        s = res.summary()
        n = v.size
        assert res.violation_pct == (100.0 * float(v.mean()) if n else 0.0)
        assert s["violation_pct"] == res.violation_pct and s["violated"] == int(v.sum())
        assert s["sync_active_frac"] == (float(a.mean()) if n else 0.0)
        assert type(s["sync_active_frac"]) is float and type(s["violation_pct"]) is float
