"""Correlated traffic between a fleet's synthetic sites (sim/fleet_traffic.py)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import diloco_gym  # noqa: F401
from diloco_gym.sim import fleet as fl
from diloco_gym.sim import fleet_traffic as ft
from diloco_gym.sim.traces import Trace


def trace(arrivals, size, duration=10.0, net=0.1):
    n = len(arrivals)
    k = int(duration)  # one pressure sample per second
    return Trace(np.array(arrivals, float), np.full(n, size), np.full(n, size), duration,
                 np.full(k, net), np.full(k, net), "t")  # fmt: skip


def test_mixing_keeps_shares_order_and_the_sites_pressures():
    own = trace(np.linspace(0.0, 9.9, 1000), 1, net=0.1)
    common = trace(np.linspace(0.05, 9.95, 1000), 2, net=0.9)
    m = ft.mixed_trace(own, common, 0.3, np.random.default_rng(0))
    assert np.all(np.diff(m.arrival_s) >= 0)
    from_common = int((m.prompt_tokens == 2).sum())
    assert 240 <= from_common <= 360 and 600 <= m.num_requests - from_common <= 800
    assert np.array_equal(m.network, own.network) and m.meta["traffic_correlation"] == 0.3
    again = ft.mixed_trace(own, common, 0.3, np.random.default_rng(0))
    assert np.array_equal(again.arrival_s, m.arrival_s)
    whole = ft.mixed_trace(own, common, 1.0, np.random.default_rng(1))
    assert np.array_equal(whole.arrival_s, common.arrival_s)


def test_bad_mixes_are_refused():
    own, common = trace([1.0], 1), trace([2.0], 1, duration=20.0)
    with pytest.raises(ValueError, match=r"traffic_correlation must be in \(0, 1\]"):
        ft.mixed_trace(own, own, 0.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="the common trace lasts 20.0 s, the site's 10.0 s"):
        ft.mixed_trace(own, common, 0.5, np.random.default_rng(0))
    with pytest.raises(fl.FleetConfigError, match=r"traffic_correlation must be a finite number"):
        fl.FleetParams(traffic_correlation=1.5)
    site = fl.SiteConfig(name="real", regime=None, trace="x.csv")
    with pytest.raises(fl.FleetConfigError, match=r"synthetic sites only; sites \['real'\]"):
        fl.FleetParams(sites=(site,), traffic_correlation=0.5)


def _count_corr(rho: float) -> float:
    env = gym.make("DiLoCoFleet-v1", traffic_correlation=rho).unwrapped
    cs = []
    for seed in range(5):
        ep = env.build_episode(seed)
        h = [np.histogram(s.trace.arrival_s, 60, (0.0, s.trace.duration_s))[0] for s in ep.sites]
        cs.append(np.corrcoef(h[0], h[1])[0, 1])
    return float(np.mean(cs))


def test_correlated_sites_rise_and_fall_together():
    assert _count_corr(0.0) < 0.3 < 0.7 < _count_corr(0.75)
    env = gym.make("DiLoCoFleet-v1", traffic_correlation=1.0).unwrapped
    ep = env.build_episode(2)
    assert all(np.array_equal(s.trace.arrival_s, ep.sites[0].trace.arrival_s) for s in ep.sites)
    plain = gym.make("DiLoCoFleet-v1").unwrapped.build_episode(2)
    half = gym.make("DiLoCoFleet-v1", traffic_correlation=0.5).unwrapped.build_episode(2)
    assert np.array_equal(plain.throughputs, half.throughputs)  # the learners are unchanged
    rates = [s.trace.num_requests for s in half.sites]
    assert max(rates) / min(rates) < 1.1  # every site keeps its regime's rate
