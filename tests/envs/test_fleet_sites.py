"""A fleet episode's sites built and costed together (envs/fleet_sites.py) equal each
site's episode built and costed alone, bit for bit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import diloco_gym  # noqa: F401  (registers the ids)
from diloco_gym.envs.episode import episode_from_seed
from diloco_gym.envs.fleet import DiLoCoFleetEnv, site_seed
from diloco_gym.envs.fleet_sites import SiteCosts, cost_groups, site_episodes, site_groups
from diloco_gym.sim import fleet as fl
from diloco_gym.sim.regimes import get_regime
from diloco_gym.sim.sidecar import SidecarParams

ARRAYS = ("exo", "throughputs", "base_s", "req_bin", "pressure_bin")


def _same(a, b) -> None:
    for name in ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    for name in ("arrival_s", "prompt_tokens", "output_tokens", "network", "checkpoint"):
        x, y = getattr(a.trace, name), getattr(b.trace, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    assert a.trace.name == b.trace.name and a.trace.duration_s == b.trace.duration_s
    for x, y in zip(a.queue, b.queue, strict=True):
        assert np.array_equal(x, y)
    assert np.array_equal(a.baseline.latency_s, b.baseline.latency_s)
    assert np.array_equal(a.baseline.violated, b.baseline.violated)
    assert np.array_equal(a.baseline.pressure, b.baseline.pressure)
    assert (a.n_decisions, a.seed, a.sidecar, a.params) == (
        b.n_decisions,
        b.seed,
        b.sidecar,
        b.params,
    )
    assert a.reward_per_request == b.reward_per_request


def test_site_episodes_equal_the_episodes_built_alone():
    env = DiLoCoFleetEnv()
    s = env.setup
    seeds = [site_seed(7, i) for i in range(4)]
    # a second sidecar with another sync slowdown: the build reads none of it
    sidecars = [s.sidecars[0], replace(s.sidecars[0], sync_slowdown=0.9), *s.sidecars[2:]]
    rates = [s.rates[0], 3.0, s.rates[2], s.rates[3]]
    got, _ = site_episodes(s.generators[0], seeds, s.params, sidecars, env.learner_params, rates)
    for k, e in enumerate(got):
        alone = episode_from_seed(
            s.generators[0], seeds[k], s.params, sidecars[k], env.learner_params, rate_rps=rates[k]
        )
        _same(e, alone)


def test_groups_join_only_what_one_batch_builds_or_costs():
    bursty, ordinary = get_regime("bursty"), get_regime("ordinary")
    sc = SidecarParams()
    slower = replace(sc, sync_slowdown=0.9)
    other = replace(sc, slots=8.0)
    gens = [bursty, bursty, ordinary, bursty, bursty]
    assert site_groups(gens, [sc, slower, sc, other, sc]) == [[0, 1, 4], [2], [3]]
    assert cost_groups([sc, slower, sc, other, sc]) == [[0, 2, 4], [1], [3]]
    replay = object()  # not a synthetic regime: built alone
    assert site_groups([replay, replay], [sc, sc]) == [[0], [1]]


def test_site_costs_equal_each_episode_costed_alone():
    env = DiLoCoFleetEnv()
    ep = env.build_episode(3)
    alone = DiLoCoFleetEnv().build_episode(3)  # its own episodes, costed one by one
    costs = SiteCosts(ep.sites)
    for d in (0, 5, 17, ep.n_decisions - 1):
        costs.fill(d)
        for e, a in zip(ep.sites, alone.sites, strict=True):
            assert e.cost_memo[0, d] == a._one_cost.cost_at(d * env.params.decision_interval)
            assert e.merge_cost_at(d) == a.merge_cost[d]


def test_a_fleet_of_mixed_regimes_builds_as_before():
    sites = tuple(
        fl.SiteConfig(name=f"s{i}", regime=r)
        for i, r in enumerate(("bursty", "ordinary", "bursty"))
    )
    env = DiLoCoFleetEnv(fl.FleetParams(sites=sites))
    assert env.setup.groups == [[0, 2], [1]]
    ep = env.build_episode(11)
    s = env.setup
    for i, e in enumerate(ep.sites):
        alone = episode_from_seed(
            s.generators[i], site_seed(11, i), s.params, s.sidecars[i], env.learner_params,
            rate_rps=s.rates[i],
        )  # fmt: skip
        _same(e, alone)


def test_a_fleet_episodes_site_costs_are_each_sites_full_table():
    env = DiLoCoFleetEnv()
    for full_first in (False, True):
        ep = env.build_episode(5)
        alone = DiLoCoFleetEnv().build_episode(5)
        if full_first:  # the oracle's table before any sync: the memos start from it
            assert np.array_equal(ep.merge_cost, alone.merge_cost)
        assert ep._grouped.whole
        for d in (2, 30, 2, ep.n_decisions - 1):  # a decision asked twice too
            want = [float(e.merge_cost[d]) for e in alone.sites]
            assert ep.site_costs_at(d, 0) == want
            total = 0.0
            for c in want:
                total += c
            assert ep.merge_cost_at(d) == total


# --- correlated traffic between trace sites (traffic_correlation, sim/fleet_traffic.py) ---

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("bursty", "non-periodic", "ordinary", "sync-heavy")


def _trace_fleet(rho: float, rates=(0.55, 0.55, 0.55, 0.55), **kw) -> fl.FleetParams:
    sites = tuple(
        fl.SiteConfig(name=n, regime=None, trace=str(ROOT / "traces" / f"{n}.csv"),
                      target_rate_rps=r)
        for n, r in zip(NAMES, rates, strict=True)
    )  # fmt: skip
    return fl.FleetParams(sites=sites, traffic_correlation=rho, **kw)


def _episodes(fleet: fl.FleetParams, seed: int):
    return DiLoCoFleetEnv(fleet=fleet).build_episode(seed).sites


def _pairs(t) -> set[tuple[int, int]]:
    return set(zip(t.prompt_tokens.tolist(), t.output_tokens.tolist(), strict=True))


def test_correlated_trace_sites_share_the_reference_window():
    env = DiLoCoFleetEnv(fleet=_trace_fleet(0.0))
    plain = env.build_episode(3).sites
    for i, e in enumerate(plain):  # rho = 0: each site its own window, as always
        alone = episode_from_seed(env.setup.generator_for(i, 3), site_seed(3, i),
                                  env.setup.params, env.setup.sidecars[i],
                                  env.learner_params, rate_rps=env.setup.rates[i])  # fmt: skip
        _same(e, alone)
    whole = _episodes(_trace_fleet(1.0), 3)
    ref = plain[0].trace.arrival_s  # the first trace site's window is the common one
    assert all(np.array_equal(s.trace.arrival_s, ref) for s in whole)
    _same(whole[0], plain[0])  # the reference site's episode is unchanged
    for i in range(1, 4):  # sizes drawn from the site's own file, its own pressures
        assert _pairs(whole[i].trace) <= _pairs(env.setup.generators[i].trace)
        assert np.array_equal(whole[i].trace.network, plain[i].trace.network)
        assert np.array_equal(whole[i].throughputs, plain[i].throughputs)  # same learners
    half = _episodes(_trace_fleet(0.5), 3)
    for a, b in zip(half, _episodes(_trace_fleet(0.5), 3), strict=True):
        _same(a, b)  # deterministic: same seed, same traces
    for s, p in zip(half[1:], plain[1:], strict=True):  # about half of each, binomially
        shared = int(np.isin(s.trace.arrival_s, ref).sum())
        own = int(np.isin(s.trace.arrival_s, p.trace.arrival_s).sum())
        assert shared + own == s.trace.num_requests
        assert abs(shared - ref.size / 2) < 50 and abs(own - p.trace.num_requests / 2) < 50


def test_correlated_trace_sites_keep_their_rates():
    # site 1 at twice the reference's rate: at rho = 1 it takes every common request twice
    fleet = _trace_fleet(1.0, rates=(0.5, 1.0, 0.5, 0.25))
    sites = _episodes(fleet, 1)
    ref = sites[0].trace.arrival_s
    assert np.array_equal(sites[1].trace.arrival_s, np.repeat(ref, 2))
    assert set(sites[3].trace.arrival_s.tolist()) <= set(ref.tolist())
    # over the independent windows, each site's mean count stays its nominal rate's
    for rho in (0.5, 1.0):
        env = DiLoCoFleetEnv(fleet=_trace_fleet(rho, rates=(0.5, 1.0, 0.5, 0.25)))
        assert env.setup.rates == [0.5, 1.0, 0.5, 0.25]  # the reward scale is unchanged
        units = env.setup.independent_episodes
        counts = np.mean([[e.trace.num_requests for e in env.build_episode(k).sites]
                          for k in range(units)], axis=0)  # fmt: skip
        expected = np.array(env.setup.rates) * 600.0
        assert np.all(np.abs(counts / expected - 1.0) < 0.08), (rho, counts, expected)


def test_mixed_fleets_mix_each_kind_with_its_own_common_component():
    trace = fl.SiteConfig(name="t0", regime=None, trace=str(ROOT / "traces/ordinary.csv"),
                          target_rate_rps=5.0)  # fmt: skip
    trace2 = replace(trace, name="t1", trace=str(ROOT / "traces/sync-heavy.csv"),
                     target_rate_rps=5.0)  # fmt: skip
    syn = [fl.SiteConfig(name=f"b{i}") for i in range(2)]
    fleet = fl.FleetParams(sites=(syn[0], trace, syn[1], trace2), traffic_correlation=1.0)
    sites = _episodes(fleet, 4)
    bursty = _episodes(fl.FleetParams(traffic_correlation=1.0), 4)  # four bursty sites
    for i in (0, 2):  # the synthetic sites serve their regime's common trace, as before
        assert np.array_equal(sites[i].trace.arrival_s, bursty[0].trace.arrival_s)
    assert sites[3].trace.num_requests == sites[1].trace.num_requests
    assert np.array_equal(sites[3].trace.arrival_s, sites[1].trace.arrival_s)
    # traffic_common picks the reference trace site
    other = _episodes(replace(fleet, traffic_common="t1"), 4)
    plain_t1 = _episodes(replace(fleet, traffic_correlation=0.0), 4)[3]
    assert np.array_equal(other[1].trace.arrival_s, plain_t1.trace.arrival_s)


def test_a_common_window_taken_too_often_is_refused_before_any_episode(tmp_path, monkeypatch):
    import gymnasium as gym

    # the reference at 1/256 req/s, the other site at 8: each common request 2048 times
    text = "[fleet]\nmodel_version = 1\ntraffic_correlation = 1.0\n"
    for name, rate in (("bursty", 1 / 256), ("sync-heavy", 8.0)):
        path = (ROOT / "traces" / f"{name}.csv").as_posix()
        text += f'\n[[site]]\nname = "{name}"\ntrace = "{path}"\ntarget_rate_rps = {rate}\n'
    fleet = tmp_path / "fast.toml"
    fleet.write_text(text)
    monkeypatch.setenv("DILOCO_GYM_MAX_REQUESTS", "1000")
    with pytest.raises(fl.FleetConfigError) as exc:
        gym.make("DiLoCoFleet-v1", fleet=str(fleet))
    msg = str(exc.value)
    assert msg.startswith(str(fleet)) and "\n" not in msg
    assert "site 'sync-heavy': requests taken from the common window of 'bursty'" in msg
    assert "DILOCO_GYM_MAX_REQUESTS" in msg
    gym.make("DiLoCoFleet-v1", fleet=str(fleet), traffic_correlation=0.0)  # independent: built
    monkeypatch.setenv("DILOCO_GYM_MAX_REQUESTS", "100000")
    env = gym.make("DiLoCoFleet-v1", fleet=str(fleet)).unwrapped  # a raised limit: built
    sites = env.build_episode(0).sites
    assert sites[1].trace.num_requests == 2048 * sites[0].trace.num_requests
