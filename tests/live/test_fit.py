"""Effect sizes, bootstrap intervals and the sidecar fit (:mod:`diloco_gym.live.fit`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from diloco_gym.live.fit import (
    RunData,
    bootstrap_intervals,
    fit_service_costs,
    fit_sidecar_live,
    measured_effect_sizes,
    simulate_phase,
)
from diloco_gym.sim.sidecar import SidecarParams


def _fit_run(params: SidecarParams, seed: int = 0) -> RunData:
    """Requests whose latencies come from the sidecar model itself (known parameters)."""
    rng = np.random.default_rng(seed)
    n = 200  # 2 req/s: little queueing, so the idle-server fit sees the service costs
    offsets = np.sort(rng.uniform(0, 100, n))
    prompt = rng.integers(20, 300, n)
    output = rng.integers(10, 120, n)
    windows = [(10.0, 18.0), (40.0, 48.0), (70.0, 78.0)]
    active = np.zeros(n, bool)
    for lo, hi in windows:
        active |= (offsets >= lo) & (offsets < hi)
    data = RunData(
        np.array(["sync"] * n + ["control"] * n, dtype=object),
        np.concatenate([offsets, offsets]),
        np.zeros(2 * n),
        np.concatenate([prompt, prompt]),
        np.concatenate([output, output]),
        np.concatenate([active, np.zeros(n, bool)]),
        np.zeros(2 * n, np.int64),
        np.full(2 * n, np.nan),
        windows,
        100.0,
        100.0,
    )
    lat_sync, _ = simulate_phase(data, "sync", params)
    lat_ctrl, _ = simulate_phase(data, "control", params, with_merges=False)

    def inflight(lat: np.ndarray) -> np.ndarray:  # earlier requests not finished yet
        end = offsets + lat
        return np.array([(end[:i] > offsets[i]).sum() for i in range(n)])

    return RunData(
        data.phase,
        data.offset_s,
        np.concatenate([lat_sync, lat_ctrl]),
        data.prompt_tokens,
        data.output_tokens,
        data.sync_active,
        np.concatenate([inflight(lat_sync), inflight(lat_ctrl)]),
        data.cpu_util,
        windows,
        100.0,
        100.0,
    )


def test_fit_recovers_known_sidecar():
    truth = SidecarParams(
        ttft_ms=40.0,
        prefill_ms_per_token=0.2,
        decode_ms_per_token=5.0,
        slots=4.0,
        sync_slowdown=0.8,
    )
    data = _fit_run(truth)
    measured = measured_effect_sizes(data)
    assert measured["p95_sync_ratio"] > 1.3
    fit = fit_sidecar_live(data, measured)
    p = fit.params
    assert p.decode_ms_per_token == pytest.approx(5.0, rel=0.05)
    assert p.ttft_ms == pytest.approx(40.0, abs=1.0)
    assert fit.sim_p95_sync_ratio == pytest.approx(measured["p95_sync_ratio"], rel=0.02)
    assert p.sync_slowdown == pytest.approx(0.8, rel=0.1)


def test_effect_sizes_and_least_squares_by_hand():
    lat = np.array([1.0, 1.0, 2.0, 2.0])
    data = RunData(
        np.array(["sync"] * 4, dtype=object),
        np.arange(4.0),
        lat,
        np.ones(4, np.int64),
        np.ones(4, np.int64),
        np.array([False, False, True, True]),
        np.array([0, 0, 4, 4]),
        np.full(4, np.nan),
        [(1.5, 3.5)],
        4.0,
        0.0,
    )
    m = measured_effect_sizes(data)
    assert m["p95_sync_ratio"] == pytest.approx(2.0)
    assert m["p95_high_low"] == pytest.approx(2.0)  # in-flight 4 / norm 4 = pressure 1
    assert m["pressure_latency_corr"] == pytest.approx(1.0)
    assert np.isnan(m["cpu_latency_corr"])
    fit = fit_service_costs(
        np.array([0, 0, 0]), np.array([1, 2, 3]), np.array([0.015, 0.020, 0.025])
    )
    assert fit["ttft_ms"] == pytest.approx(10.0) and fit["decode_ms_per_token"] == pytest.approx(
        5.0
    )


def _repeated_data(ratios: list[float], n: int = 60, seed: int = 0) -> RunData:
    """Repeats whose merge-active requests are ``ratio`` times slower (per repeat)."""
    rng = np.random.default_rng(seed)
    phase, lat, active, rep = [], [], [], []
    for k, ratio in enumerate(ratios):
        base = rng.uniform(0.9, 1.1, n)
        act = np.arange(n) % 3 == 0
        phase += ["sync"] * n + ["control"] * n
        lat += list(np.where(act, base * ratio, base)) + list(rng.uniform(0.9, 1.1, n))
        active += list(act) + [False] * n
        rep += [k] * (2 * n)
    m = len(lat)
    return RunData(
        np.array(phase, dtype=object),
        np.zeros(m),
        np.array(lat),
        np.ones(m, np.int64),
        np.ones(m, np.int64),
        np.array(active),
        np.zeros(m, np.int64),
        np.full(m, np.nan),
        [],
        10.0,
        10.0,
        repeat=np.array(rep),
        windows_by_repeat={},
    )


def test_bootstrap_interval_over_repeats():
    steady = _repeated_data([1.5, 1.5, 1.5, 1.5, 1.5])
    noisy = _repeated_data([1.0, 2.0, 1.1, 1.9, 1.5])
    b1 = bootstrap_intervals(steady, resamples=400)
    b2 = bootstrap_intervals(noisy, resamples=400)
    point = measured_effect_sizes(noisy)["p95_sync_ratio"]
    lo, hi = b2["p95_sync_ratio"]
    assert lo <= point <= hi
    assert hi - lo > 3 * (b1["p95_sync_ratio"][1] - b1["p95_sync_ratio"][0])
    assert json.dumps(b2) == json.dumps(bootstrap_intervals(noisy, resamples=400))  # seeded
    assert b1["per_repeat"]["p95_sync_ratio"] == pytest.approx([1.5 * 1.0] * 5, rel=0.1)
    single = bootstrap_intervals(_repeated_data([1.5]), resamples=400)
    assert single["p95_sync_ratio"] is None and "fewer than two" in single["note"]


def test_fit_notes_a_ratio_the_model_cannot_reach():
    """Two merge-active requests, one of them 500x slower: no slowdown up to the search
    bound (64) reproduces that p95 ratio, and the fit says so instead of silently returning
    the bound; a 50x one is reachable and gets no such note."""
    from diloco_gym.live.fit import fit_sidecar_live

    def fit(slow_s: float):
        n = 12
        lat = np.full(n, 0.1)
        act = np.zeros(n, bool)
        act[[3, 8]] = True
        lat[3] = slow_s
        data = RunData(
            np.array(["sync"] * n, dtype=object),
            np.arange(n, dtype=float),
            lat,
            np.ones(n, np.int64),
            np.ones(n, np.int64),
            act,
            np.zeros(n, np.int64),
            np.full(n, np.nan),
            [(3.0, 3.5), (8.0, 8.5)],
            float(n),
            0.0,
        )
        return fit_sidecar_live(data, measured_effect_sizes(data))

    unreachable = fit(50.0)
    assert unreachable.params.sync_slowdown == pytest.approx(64.0, rel=1e-3)
    assert any("cannot reproduce" in note for note in unreachable.notes), unreachable.notes
    reachable = fit(5.0)
    assert reachable.sim_p95_sync_ratio == pytest.approx(47.55, rel=0.02)
    assert not any("cannot reproduce" in note for note in reachable.notes)


def test_replay_requests_bins_sends_and_merge_windows_by_hand():
    """The live replay's binning (:func:`replay_requests`, shared by the fit and the
    fidelity check): on an idle server a request's latency is its nominal time, times
    ``1 + sync_slowdown`` when its bin starts inside a merge window; no windows (``None``)
    and an empty list replay alike."""
    from diloco_gym.live.fit import replay_requests, sync_bins

    p = SidecarParams(ttft_ms=100.0, prefill_ms_per_token=0.0, decode_ms_per_token=10.0,
                      slots=8.0, sync_slowdown=1.0)  # fmt: skip
    offsets = np.array([-0.5, 1.02, 2.0, 3.0])  # the first is clipped to bin 0
    output = np.array([10, 10, 20, 10], np.int64)
    prompt = np.zeros(4, np.int64)
    assert sync_bins([(1.0, 1.1)], 4 * 20, 0.05).nonzero()[0].tolist() == [20, 21]
    none = replay_requests(offsets, prompt, output, 4.0, None, p)
    assert none.latency_s.tolist() == pytest.approx([0.2, 0.2, 0.3, 0.2])
    empty = replay_requests(offsets, prompt, output, 4.0, [], p)
    assert empty.latency_s.tolist() == none.latency_s.tolist()
    merged = replay_requests(offsets, prompt, output, 4.0, [(1.0, 1.1), (2.9, 3.0)], p)
    assert merged.latency_s.tolist() == pytest.approx([0.2, 0.4, 0.3, 0.2])
    assert merged.sync_active.tolist() == [False, True, False, False]
