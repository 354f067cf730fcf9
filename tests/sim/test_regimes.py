"""Trace generators: seeding, the shape of each regime's workload, and replay of a loaded
trace."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from diloco_gym import REGIMES, DiLoCoSyncEnv, ReplayRegime, SyntheticRegime, Trace, get_regime
from diloco_gym.sim.loaders import load_trace

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _trace(name: str, seed: int) -> Trace:
    return REGIMES[name](np.random.default_rng(seed))


def _per_second(trace: Trace) -> np.ndarray:
    return np.bincount(trace.arrival_s.astype(int), minlength=int(trace.duration_s)).astype(float)


# --------------------------------------------------------------------------- seeding
@pytest.mark.parametrize("name", list(REGIMES))
def test_same_seed_same_trace_different_seed_different_trace(name):
    a, b, c = _trace(name, 3), _trace(name, 3), _trace(name, 4)
    assert a == b
    np.testing.assert_array_equal(a.prompt_tokens, b.prompt_tokens)
    np.testing.assert_array_equal(a.network, b.network)
    assert a != c
    assert not np.array_equal(a.network, c.network)


@pytest.mark.parametrize(
    "name, mean_rate",
    [
        ("ordinary", 6.0),
        ("pressure-heavy", 8.0),
        ("sync-heavy", 10.0),
        ("bursty", 5.0 + 12.0 * 30 / 120),
    ],
)
def test_regime_traces_are_well_formed(name, mean_rate):
    rates = []
    for seed in range(4):
        tr = _trace(name, seed)
        assert tr.duration_s == 600.0 and tr.name == name
        assert tr.network.shape == tr.checkpoint.shape == (600,)
        assert np.all((tr.network >= 0) & (tr.network <= 1))
        assert np.all(tr.prompt_tokens >= 1) and np.all(tr.output_tokens >= 1)
        assert np.all(np.diff(tr.arrival_s) >= 0)
        rates.append(tr.mean_rate_rps)
    assert np.mean(rates) == pytest.approx(mean_rate, rel=0.05)


def test_pressure_heavy_has_more_and_stronger_pressure_episodes():
    def frac_above(name, level):
        trs = [_trace(name, s) for s in range(6)]
        return np.mean([np.mean(np.maximum(t.network, t.checkpoint) >= level) for t in trs])

    # Measured over seeds 0-5: >= 0.6 for 35 % of the time (ordinary 24 %); >= 0.8 for 35 %
    # (ordinary 0 %): pressure-heavy's episodes are more frequent and reach 0.85, not 0.75.
    assert frac_above("pressure-heavy", 0.6) > frac_above("ordinary", 0.6) + 0.05
    assert frac_above("pressure-heavy", 0.8) > 0.2
    assert frac_above("ordinary", 0.8) < 0.01


# --------------------------------------------------------------------------- bursts
@pytest.mark.parametrize("seed", range(5))
def test_bursty_has_30_s_bursts_every_120_s(seed):
    reg = REGIMES["bursty"]
    counts = _per_second(_trace("bursty", seed))
    # Fold the 600 s (five periods) onto one 120 s period: the phase is random per seed.
    folded = counts.reshape(5, 120).mean(axis=0)
    busy = folded > (reg.quiet_rate_rps + reg.busy_rate_rps) / 2
    assert 28 <= busy.sum() <= 32  # ~30 s of burst per period
    rises = np.sum(busy & ~np.roll(busy, 1))
    assert rises == 1  # one contiguous burst per period (circularly)
    assert folded[busy].mean() == pytest.approx(reg.busy_rate_rps, abs=1.5)
    assert folded[~busy].mean() == pytest.approx(reg.quiet_rate_rps, abs=0.6)
    # Folding on another period smears the bursts out: the 120 s structure is real.
    smeared = counts[:500].reshape(5, 100).mean(axis=0)
    assert smeared.max() < folded.max() - 3


def _plateau_onsets(reg: SyntheticRegime, seed: int) -> np.ndarray:
    """Plateau starts of a trace, from the rate function with the same random stream
    (``__call__`` draws the burst timing first)."""
    t = np.arange(0.0, reg.duration_s, 0.01)
    on = reg.rate_rps(t, np.random.default_rng(seed)) >= reg.busy_rate_rps - 1e-9
    return t[1:][on[1:] & ~on[:-1]]


def test_plateau_onsets_reproduce_the_generator():
    """The onset helper agrees with the generated arrivals (more arrivals after onsets)."""
    reg = REGIMES["non-periodic"]
    for seed in range(3):
        counts = _per_second(_trace("non-periodic", seed))
        for onset in _plateau_onsets(reg, seed):
            if onset + 20 < 600:
                start = int(np.ceil(onset))
                assert counts[start : start + 20].mean() > reg.quiet_rate_rps + 6


def test_non_periodic_bursts_ramp_up_before_the_plateau():
    reg = REGIMES["non-periodic"]
    assert reg.ramp_s == 12.0
    windows = {
        "quiet": (-30, -18),
        "early ramp": (-12, -6),
        "late ramp": (-6, 0),
        "plateau": (0, 20),
    }
    totals = dict.fromkeys(windows, 0.0)
    n_bursts = 0
    gaps = []
    for seed in range(12):
        onsets = _plateau_onsets(reg, seed)
        gaps.extend(np.diff(onsets))
        arrivals = _trace("non-periodic", seed).arrival_s
        for i, onset in enumerate(onsets):
            isolated = i == 0 or onset - onsets[i - 1] > reg.burst_s + 30 + reg.ramp_s
            if onset - 30 < 0 or onset + 20 > reg.duration_s or not isolated:
                continue
            n_bursts += 1
            for name, (a, b) in windows.items():
                totals[name] += np.sum((arrivals >= onset + a) & (arrivals < onset + b))
    assert n_bursts >= 30
    rate = {name: totals[name] / (n_bursts * (b - a)) for name, (a, b) in windows.items()}
    q, busy = reg.quiet_rate_rps, reg.busy_rate_rps
    # Linear ramp over 12 s: mean lift 1/4 in the first half, 3/4 in the second.
    assert rate["quiet"] == pytest.approx(q, abs=0.5)
    assert rate["early ramp"] == pytest.approx(q + 0.25 * (busy - q), abs=0.8)
    assert rate["late ramp"] == pytest.approx(q + 0.75 * (busy - q), abs=0.8)
    assert rate["plateau"] == pytest.approx(busy, abs=0.8)
    # Aperiodic: gaps between onsets spread over [0.5, 1.5] x 120 s.
    gaps = np.asarray(gaps)
    assert gaps.min() >= 60 - 0.02 and gaps.max() <= 180 + 0.02
    assert gaps.std() > 15


def test_rate_function_shapes():
    t = np.arange(0.0, 600.0, 0.01)
    bursty, nonp = REGIMES["bursty"], REGIMES["non-periodic"]
    for seed in range(3):
        onset = _plateau_onsets(bursty, seed)[0]
        rate = bursty.rate_rps(t, np.random.default_rng(seed))
        at = np.searchsorted(t, onset)
        assert rate[at - 5] == bursty.quiet_rate_rps  # abrupt onset, no ramp
        assert np.diff(_plateau_onsets(bursty, seed)) == pytest.approx(120.0, abs=0.02)
        onset = _plateau_onsets(nonp, seed)[0]
        rate = nonp.rate_rps(t, np.random.default_rng(seed))
        at = np.searchsorted(t, onset)
        ramp = rate[at - 1200 : at]  # the 12 s before the plateau
        assert np.all(np.diff(ramp) >= -1e-12)
        assert rate[at - 600] == pytest.approx(
            (nonp.quiet_rate_rps + nonp.busy_rate_rps) / 2, abs=0.1
        )
    flat = REGIMES["sync-heavy"].rate_rps(t, np.random.default_rng(0))
    assert np.all(flat == 10.0)


# --------------------------------------------------------------------------- lookup
def test_unknown_regime_lists_the_valid_names():
    with pytest.raises(ValueError) as info:
        get_regime("steady")
    for name in REGIMES:
        assert name in str(info.value)
    assert get_regime("bursty") is REGIMES["bursty"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"quiet_rate_rps": -1.0, "busy_rate_rps": 2.0}, "quiet_rate_rps"),
        ({"quiet_rate_rps": 5.0, "busy_rate_rps": 2.0}, "busy_rate_rps"),
        ({"quiet_rate_rps": 5.0, "busy_rate_rps": 5.0, "duration_s": 0.0}, "duration_s"),
        ({"quiet_rate_rps": 5.0, "busy_rate_rps": 5.0, "burst_s": float("nan")}, "burst_s"),
    ],
)
def test_bad_synthetic_regime_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SyntheticRegime("bad", **kwargs)


def test_regimes_carry_their_calibration():
    assert REGIMES["bursty"].sidecar == REGIMES["sync-heavy"].sidecar
    assert REGIMES["bursty"].calibrated_on == "sync-heavy"
    assert REGIMES["ordinary"].sidecar.sync_slowdown == 0.0
    assert REGIMES["pressure-heavy"].sidecar.pressure_gain > 0
    assert REGIMES["sync-heavy"].sidecar.sync_slowdown > 0


# --------------------------------------------------------------------------- replay
@pytest.fixture
def small_trace() -> Trace:
    # native_small.csv: 4 requests at 0, 0.5, 2.25, 7.75 s over 10 s, tokens 100..400 / 10..40.
    return load_trace(FIXTURES / "native_small.csv")


def test_replay_regime_random_windows(small_trace):
    assert small_trace.num_requests == 4 and small_trace.network is None
    reg = ReplayRegime(small_trace, duration_s=4.0)
    a, b = reg(np.random.default_rng(0)), reg(np.random.default_rng(0))
    assert a == b
    assert a.duration_s == 4.0
    assert a.network.shape == a.checkpoint.shape == (4,)  # drawn from sync-heavy's process
    assert np.all((a.network >= 0) & (a.network <= 1))
    starts = set()
    for seed in range(20):
        w = reg(np.random.default_rng(seed))
        start = w.meta["window_start_s"]
        starts.add(round(start, 6))
        assert 0 <= start <= 6.0 and w.num_requests >= 1
        # Every request of the window is a request of the source, shifted to the window.
        src = np.isin(np.round(small_trace.arrival_s, 9), np.round(w.arrival_s + start, 9))
        assert src.sum() == w.num_requests
        np.testing.assert_array_equal(small_trace.prompt_tokens[src], w.prompt_tokens)
    assert len(starts) > 10


def test_replay_regime_fixed_window_and_rate_scaling(small_trace):
    fixed = ReplayRegime(small_trace, duration_s=6.0, start_s=2.0)(np.random.default_rng(0))
    np.testing.assert_allclose(fixed.arrival_s, [0.25, 5.75])
    np.testing.assert_array_equal(fixed.prompt_tokens, [300, 400])
    np.testing.assert_array_equal(fixed.output_tokens, [30, 40])
    # 0.4 req/s scaled to 0.004 req/s stretches time 100x: arrivals 0, 50, 225, 775 s.
    scaled = ReplayRegime(small_trace, duration_s=600.0, start_s=0.0, target_rate_rps=0.004)(
        np.random.default_rng(0)
    )
    np.testing.assert_allclose(scaled.arrival_s, [0.0, 50.0, 225.0])
    assert scaled.duration_s == 600.0


def test_env_runs_on_a_replayed_fixture_trace(small_trace, rollout):
    reg = ReplayRegime(small_trace, duration_s=600.0, target_rate_rps=0.004, name="fixture")
    env = DiLoCoSyncEnv(regime=reg)
    r = rollout(env, "random", seed=1, policy_seed=1)
    assert env.regime_name == "fixture"
    assert r.summary["requests"] == env.episode.trace.num_requests >= 1
    assert r.summary["merges"] >= 1
    for obs in r.observations:
        assert env.observation_space.contains(obs)


def test_env_with_a_fixed_trace_replays_it_exactly():
    trace = _trace("bursty", 9)
    env = DiLoCoSyncEnv(regime=trace)
    for seed in (0, 1):
        env.reset(seed=seed)
        assert env.episode.trace == trace


@pytest.mark.parametrize("fixture", ["azure_small.csv", "mooncake_small.jsonl"])
def test_other_fixture_formats_replay(fixture):
    tr = load_trace(FIXTURES / fixture)
    w = ReplayRegime(tr, duration_s=min(5.0, tr.duration_s))(np.random.default_rng(2))
    assert w.num_requests >= 1 and w.network is not None
    assert np.all(w.arrival_s < w.duration_s)


# --------------------------------------------------------------------------- sampling
def _lift_reference(reg: SyntheticRegime, t: np.ndarray, onsets: np.ndarray) -> np.ndarray:
    """The burst level as the largest of every burst's shape (a plain loop)."""
    lift = np.zeros(t.shape)
    for onset in onsets:
        if reg.ramp_s:
            ramp = np.clip((t - (onset - reg.ramp_s)) / reg.ramp_s, 0.0, 1.0)
        else:
            ramp = (t >= onset).astype(float)
        lift = np.maximum(lift, ramp * (t < onset + reg.burst_s))
    return lift


@pytest.mark.parametrize("ramp_s", [0.0, 7.0, 40.0])
def test_burst_level_is_the_max_over_bursts_even_when_they_overlap(ramp_s):
    reg = SyntheticRegime(
        "x", 5.0, 17.0, burst_period_s=30.0, burst_s=45.0, periodic=False, ramp_s=ramp_s
    )
    rng = np.random.default_rng(0)
    onsets = np.sort(rng.uniform(-50, 650, 40))  # dense: bursts overlap a lot
    t = np.sort(rng.uniform(0, 600, 5000))
    np.testing.assert_array_equal(reg._lift(t, onsets), _lift_reference(reg, t, onsets))
    shuffled = rng.permutation(t.size)
    np.testing.assert_array_equal(
        reg._lift(t[shuffled], onsets), _lift_reference(reg, t[shuffled], onsets)
    )


def test_arrivals_are_poisson_in_every_slice():
    """Counts per second of a steady regime: mean = rate and variance = mean (Poisson), and
    no correlation between consecutive seconds."""
    counts = np.concatenate([_per_second(_trace("sync-heavy", s)) for s in range(20)])
    assert counts.mean() == pytest.approx(10.0, abs=0.1)
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.06)
    assert abs(np.corrcoef(counts[:-1], counts[1:])[0, 1]) < 0.03
    # Within a second, arrivals are uniform (time rescaling spreads them inside slices).
    frac = np.concatenate([_trace("ordinary", s).arrival_s % 1.0 for s in range(10)])
    hist = np.histogram(frac, bins=10, range=(0, 1))[0]
    assert np.all(np.abs(hist / hist.mean() - 1) < 0.06)


def test_tokens_are_log_normal_and_independent():
    reg = REGIMES["bursty"]
    tr = [_trace("bursty", s) for s in range(10)]
    prompt = np.concatenate([t.prompt_tokens for t in tr]).astype(float)
    output = np.concatenate([t.output_tokens for t in tr]).astype(float)
    assert np.median(prompt) == pytest.approx(reg.prompt_median, rel=0.02)
    assert np.median(output) == pytest.approx(reg.output_median, rel=0.02)
    assert np.log(prompt).std() == pytest.approx(reg.prompt_sigma, rel=0.03)
    assert np.log(output).std() == pytest.approx(reg.output_sigma, rel=0.05)
    assert abs(np.corrcoef(np.log(prompt), np.log(output))[0, 1]) < 0.03
    # The normal quantile of each token is uniform: 10 equal-probability bins, equal counts.
    from scipy.stats import norm

    u = norm.cdf(np.log(prompt / reg.prompt_median) / reg.prompt_sigma)
    hist = np.histogram(u, bins=10, range=(0, 1))[0]
    assert np.all(np.abs(hist / hist.mean() - 1) < 0.1)


def test_the_shipped_normal_quantiles_are_scipys_ndtri_bit_for_bit():
    """The token tables' quantile grid ships as data; it must be exactly what
    ``scipy.special.ndtri`` gives at ``(k + 1/2) / 2**14`` (every value, every bit)."""
    from scipy.special import ndtri

    from diloco_gym.sim.regimes import normal_quantiles

    k = 1 << 14
    z = normal_quantiles()
    assert z.dtype == np.float64 and z.shape == (k,)
    assert z.tobytes() == ndtri((np.arange(k) + 0.5) / k).tobytes()
    assert not z.flags.writeable
    assert normal_quantiles() is z  # read once per process


@pytest.mark.parametrize("content", [b"not an array", "array"])
def test_a_damaged_normal_quantiles_file_is_named(tmp_path, monkeypatch, content):
    from importlib import resources

    from diloco_gym.sim import regimes

    path = tmp_path / "data" / "normal_quantiles_14.npy"
    path.parent.mkdir()
    if content == "array":
        np.save(path, np.zeros(7))
    else:
        path.write_bytes(content)
    monkeypatch.setattr(resources, "files", lambda package: tmp_path)
    regimes.normal_quantiles.cache_clear()
    try:
        match = "normal_quantiles_14.npy.*damaged; reinstall diloco-gym"
        with pytest.raises(ValueError, match=match):
            regimes.normal_quantiles()
    finally:
        regimes.normal_quantiles.cache_clear()


# --------------------------------------------------------------------------- load
def test_regime_capacity_and_utilization():
    reg = REGIMES["sync-heavy"]
    sc = reg.sidecar
    # Exact mean of the token tables: slots / mean nominal service time.
    from diloco_gym.sim.regimes import _token_table

    service = (
        sc.ttft_ms
        + sc.prefill_ms_per_token * _token_table(600.0, 0.5, 32768.0).mean()
        + sc.decode_ms_per_token * _token_table(100.0, 0.2, 4096.0).mean()
    ) / 1000
    assert reg.capacity_rps() == pytest.approx(sc.slots / service)
    assert 20.0 < reg.capacity_rps() < 26.0
    assert reg.utilization() == pytest.approx(10.0 / reg.capacity_rps())
    assert REGIMES["bursty"].mean_rate_rps == pytest.approx(8.0)
    assert REGIMES["non-periodic"].mean_rate_rps == pytest.approx(5.0 + 12.0 * 31.0 / 120.0)


@pytest.mark.parametrize("name", ["bursty", "non-periodic"])
def test_mean_rate_matches_the_traces(name):
    rates = [_trace(name, s).mean_rate_rps for s in range(12)]
    assert np.mean(rates) == pytest.approx(REGIMES[name].mean_rate_rps, rel=0.04)


@pytest.mark.parametrize("name", list(REGIMES))
def test_default_sidecar_keeps_todays_rates_and_traces(name):
    from dataclasses import replace

    reg = REGIMES[name]
    assert reg.with_load() is reg
    # A sidecar with the same capacity (other slowdown parameters) changes nothing.
    other = replace(reg.sidecar, sync_slowdown=1.3, pressure_gain=0.7)
    assert reg.with_load(other) is reg
    assert reg.with_load(other)(np.random.default_rng(4)) == _trace(name, 4)


def test_with_load_keeps_utilization_on_a_smaller_sidecar():
    from dataclasses import replace

    reg = REGIMES["bursty"]
    low = replace(reg.sidecar, slots=4.0)  # a quarter of the capacity
    scaled = reg.with_load(low)
    assert scaled.quiet_rate_rps == pytest.approx(reg.quiet_rate_rps / 4)
    assert scaled.busy_rate_rps == pytest.approx(reg.busy_rate_rps / 4)
    assert scaled.utilization(low) == pytest.approx(reg.utilization())
    assert scaled.burst_period_s == reg.burst_period_s and scaled.burst_s == reg.burst_s
    double = reg.with_load(rate_scale=2.0)
    assert double.quiet_rate_rps == 10.0 and double.busy_rate_rps == 34.0
    assert reg.with_load(target_utilization=0.5).utilization() == pytest.approx(0.5)
    assert reg.with_load(low, target_utilization=0.5).utilization(low) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="not both"):
        reg.with_load(rate_scale=2.0, target_utilization=0.5)
    with pytest.raises(ValueError, match="rate_scale must be a positive"):
        reg.with_load(rate_scale=0.0)


def test_replay_tiles_are_disjoint_and_cover_the_trace():
    tr = _trace("bursty", 2)
    tiles = ReplayRegime(tr, duration_s=150.0).tiles()
    assert [t.start_s for t in tiles] == [0.0, 150.0, 300.0, 450.0]
    windows = [t(np.random.default_rng(i)) for i, t in enumerate(tiles)]
    assert sum(w.num_requests for w in windows) == tr.num_requests
    got = np.concatenate([w.arrival_s + t.start_s for w, t in zip(windows, tiles, strict=True)])
    np.testing.assert_allclose(got, tr.arrival_s, atol=1e-9)
    # Same window index and seed: same episode trace (pressure series included).
    assert tiles[1](np.random.default_rng(1)) == windows[1]


def test_trace_utilization_and_rate_scale():
    from diloco_gym.sim.regimes import replay_rate_scale, trace_utilization
    from diloco_gym.sim.traces import scale_rate

    tr = _trace("sync-heavy", 0)
    sc = REGIMES["sync-heavy"].sidecar
    u = trace_utilization(tr, sc)
    assert u == pytest.approx(REGIMES["sync-heavy"].utilization(), rel=0.05)
    assert replay_rate_scale(tr, sc) == 1.0
    assert replay_rate_scale(tr, sc, rate_scale=3.0) == 3.0
    k = replay_rate_scale(tr, sc, target_utilization=0.8)
    assert trace_utilization(scale_rate(tr, tr.mean_rate_rps * k), sc) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="not both"):
        replay_rate_scale(tr, sc, rate_scale=1.0, target_utilization=0.5)


def test_idle_violation_pct_is_exact_over_the_token_tables():
    from dataclasses import replace

    from diloco_gym.sim.regimes import trace_idle_violation_pct

    reg = REGIMES["sync-heavy"]
    sampled = np.mean(
        [trace_idle_violation_pct(_trace("sync-heavy", s), reg.sidecar) for s in range(10)]
    )
    assert reg.idle_violation_pct() == pytest.approx(sampled, abs=0.3)
    assert 0.5 < reg.idle_violation_pct() < 5.0
    # A 10 s SLO: no request is over it on an idle sidecar; a 0.1 s SLO: every one is.
    assert reg.idle_violation_pct(replace(reg.sidecar, slo_ms=10_000.0)) == 0.0
    assert reg.idle_violation_pct(replace(reg.sidecar, slo_ms=100.0)) == 100.0


def test_from_raw_with_scratch_gives_the_same_arrays_and_reuses_its_memory():
    """``from_raw(..., scratch)``: the arrays of a batch without scratch, bit for bit, for
    batches of several sizes; the second call of a batch no larger than the first writes
    into the same memory (nothing new is allocated for it)."""
    reg = get_regime("pressure-heavy")
    raws = [reg.draw_raw(np.random.default_rng(s)) for s in range(6)]
    scratch: dict = {}
    for batch in (raws[:4], raws[1:3], raws[:6]):
        want = reg.from_raw(batch, np.float64)
        got = reg.from_raw(batch, np.float64, scratch)
        for a, b in zip(want, got, strict=True):
            np.testing.assert_array_equal(a, b)
    first = reg.from_raw(raws[:5], np.float64, scratch)[0]
    again = reg.from_raw(raws[1:4], np.float64, scratch)[0]
    assert np.shares_memory(first, again)
    assert {"arrivals", "prompt", "output", "pressure", "raw1", "raw2"} <= set(scratch)
