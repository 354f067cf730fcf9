"""A fleet episode's sites built and costed together (envs/fleet_sites.py) equal each
site's episode built and costed alone, bit for bit."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

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
