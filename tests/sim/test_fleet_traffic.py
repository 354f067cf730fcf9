"""Correlated traffic between a fleet's synthetic sites (sim/fleet_traffic.py)."""

from __future__ import annotations

from pathlib import Path

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
    with pytest.raises(ValueError, match=r"the common window lasts 20.0 s, the site's 10.0 s"):
        ft.mixed_replay(own, common, 0.5, 1.0, own, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"share of the common window must be a finite"):
        ft.mixed_replay(own, own, 0.5, float("inf"), own, np.random.default_rng(0))


def test_trace_sites_mix_and_bad_references_are_refused():
    site = fl.SiteConfig(name="real", regime=None, trace="x.csv")
    syn = fl.SiteConfig(name="syn")
    mixed = fl.FleetParams(sites=(syn, site), traffic_correlation=0.5)  # accepted now
    assert mixed.traffic_common is None
    assert fl.FleetParams(sites=(syn, site), traffic_correlation=0.5, traffic_common="real")
    bad = [
        ({"traffic_common": "syn"}, r"must name a trace site, one of \['real'\], got 'syn'"),
        ({"traffic_common": "nope"}, r"must name a trace site, one of \['real'\], got 'nope'"),
        ({"traffic_common": 3}, r"traffic_common must be a site name, got 3"),
        ({"traffic_common": "real", "traffic_correlation": 0.0},
         r"traffic_common applies only with traffic_correlation > 0"),
    ]  # fmt: skip
    for kw, msg in bad:
        kw = {"traffic_correlation": 0.5, **kw}
        with pytest.raises(fl.FleetConfigError, match=msg):
            fl.FleetParams(sites=(syn, site), **kw)


def test_a_bad_traffic_common_in_a_file_is_one_line_naming_file_and_key(tmp_path):
    from diloco_gym.sim.fleet_toml import load_fleet_toml

    csv = Path(__file__).resolve().parents[2] / "traces" / "bursty.csv"
    site = f'[[site]]\nname = "a"\ntrace = "{csv.as_posix()}"\n'
    cases = [
        ('traffic_correlation = 0.5\ntraffic_common = "b"', "traffic_common must name a trace"),
        ("traffic_correlation = 0.5\ntraffic_common = 1", "key 'traffic_common' must be a str"),
        ('traffic_common = "a"', "traffic_common applies only with traffic_correlation > 0"),
        ("traffic_correlation = 2.0", "traffic_correlation must be a finite number in"),
    ]
    for i, (fleet, msg) in enumerate(cases):
        path = tmp_path / f"f{i}.toml"
        path.write_text(f"[fleet]\n{fleet}\n\n{site}")
        with pytest.raises(fl.FleetConfigError) as exc:
            load_fleet_toml(path)
        text = str(exc.value)
        assert text.startswith(str(path)) and msg in text and "\n" not in text, text


def test_mixed_replay_takes_the_common_window_at_the_sites_rate():
    own = trace(np.linspace(0.0, 9.9, 1000), 1, net=0.1)
    common = trace(np.linspace(0.05, 9.95, 1000), 2, net=0.9)
    sizes = trace([0.0, 1.0], 1)
    sizes = Trace(sizes.arrival_s, np.array([5, 7]), np.array([6, 8]), 10.0)
    m = ft.mixed_replay(own, common, 0.5, 1.5, sizes, np.random.default_rng(0))
    assert np.all(np.diff(m.arrival_s) >= 0) and np.array_equal(m.network, own.network)
    from_common = ~np.isin(m.arrival_s, own.arrival_s)
    assert 650 <= from_common.sum() <= 850  # 0.5 * 1.5 * 1000 in expectation
    assert 420 <= (~from_common).sum() <= 580  # 0.5 * 1000
    # the common requests' sizes are pairs drawn from ``sizes``
    pairs = set(zip(m.prompt_tokens[from_common], m.output_tokens[from_common], strict=True))
    assert pairs == {(5, 6), (7, 8)}
    whole = ft.mixed_replay(own, common, 1.0, 1.0, sizes, np.random.default_rng(1))
    assert np.array_equal(whole.arrival_s, common.arrival_s)
    twice = ft.mixed_replay(own, common, 1.0, 2.0, sizes, np.random.default_rng(1))
    assert np.array_equal(twice.arrival_s, np.repeat(common.arrival_s, 2))
    counts = ft.take_counts(100_000, 1.25, np.random.default_rng(2))
    assert set(counts.tolist()) == {1, 2} and abs(counts.mean() - 1.25) < 0.01


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
