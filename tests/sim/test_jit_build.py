"""The compiled episode builds' shared rules (diloco_gym/sim/jit_build.py) against their
NumPy forms in diloco_gym/sim/sidecar.py, bit for bit: a request's service time, bin and the
work per bin; the no-merge queue; a request's latency; a merge's lost capacity."""

from __future__ import annotations

import numpy as np

from diloco_gym.sim import jit_build
from diloco_gym.sim.sidecar import SidecarParams, base_latency_s, queue, slowdown


def _requests(seed: int, m: int = 3000, duration: float = 600.0):
    rng = np.random.default_rng(seed)
    arrivals = np.sort(rng.random(m) * duration)
    prompt = rng.integers(1, 4000, m).astype(np.float64)
    output = rng.integers(1, 800, m).astype(np.float64)
    return arrivals, prompt, output


def test_requests_into_is_the_service_time_the_bin_and_bincount():
    p, step_s, n_bins = SidecarParams(), 0.14, 4286
    arrivals, prompt, output = _requests(0)
    base = np.empty(arrivals.size)
    bins = np.empty(arrivals.size, dtype=np.int64)
    work = np.zeros(n_bins)
    jit_build.requests_into(
        arrivals, prompt, output, 0, arrivals.size, float(p.ttft_ms),
        float(p.prefill_ms_per_token), float(p.decode_ms_per_token), step_s, n_bins, base,
        bins, 0, work,
    )  # fmt: skip
    np.testing.assert_array_equal(base, base_latency_s(prompt, output, p))
    np.testing.assert_array_equal(
        bins, np.minimum((arrivals / step_s).astype(np.int64), n_bins - 1)
    )
    np.testing.assert_array_equal(work, np.bincount(bins, weights=base, minlength=n_bins))


def test_the_no_merge_queue_and_latency_are_the_sidecars():
    p, step_s, n_bins = SidecarParams(), 0.14, 4286
    arrivals, prompt, output = _requests(1)
    base = base_latency_s(prompt, output, p)
    bins = np.minimum((arrivals / step_s).astype(np.int64), n_bins - 1)
    work = np.bincount(bins, weights=base, minlength=n_bins)
    pressure = np.random.default_rng(2).random(n_bins)
    m0 = np.array([jit_build.slowdown_one(x, p.pressure_gain) for x in pressure])
    np.testing.assert_array_equal(m0, slowdown(pressure, None, p))
    s = np.empty((1, n_bins + 1))
    prefmin = np.empty((1, n_bins + 1))
    jit_build.no_merge_queue_into(work, m0, p.slots * step_s, np.empty((1, n_bins)), s, prefmin)
    s_ref, prefmin_ref = queue(work, m0, p, step_s)
    np.testing.assert_array_equal(s[0], s_ref)
    np.testing.assert_array_equal(prefmin[0], prefmin_ref)
    lat = [
        jit_build.latency_one(base[i], s[0, k], prefmin[0, k], float(p.slots), m0[k])
        for i, k in enumerate(bins)
    ]
    want = (base + (s_ref[bins] - prefmin_ref[bins]) / p.slots) * m0[bins]
    np.testing.assert_array_equal(np.array(lat), want)
    assert np.count_nonzero(np.array(lat) > p.slo_s) > 0  # the queue is loaded


def test_lost_capacity_is_the_running_sum_of_what_a_merge_takes():
    p, step_s = SidecarParams(sync_slowdown=0.7), 0.14
    m0 = np.repeat(1.0 + np.random.default_rng(3).random(50), 8)
    s = np.cumsum(np.r_[0.0, np.random.default_rng(4).normal(size=m0.size)])
    width = m0.size + 20
    s_out, d_out = np.empty(width), np.empty(width)
    frac = p.sync_slowdown / (1.0 + p.sync_slowdown)
    jit_build.lost_capacity_into(m0, s, p.slots * step_s, frac, width, s_out, d_out)
    lost = np.r_[0.0, np.cumsum(p.slots * step_s / m0 * frac)]
    np.testing.assert_array_equal(d_out[: m0.size + 1], lost)
    np.testing.assert_array_equal(d_out[m0.size + 1 :], lost[-1])
    np.testing.assert_array_equal(s_out, s[np.minimum(np.arange(width), m0.size)])
