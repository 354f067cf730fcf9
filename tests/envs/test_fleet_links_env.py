"""Changing links in the fleet env (diloco_gym/envs/fleet_links.py): each sync runs with the
links' state of its decision, the link-state observation, and the fleet of fixed links as
the special case."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from diloco_gym.envs.fleet import DiLoCoFleetEnv
from diloco_gym.envs.params import EnvParams
from diloco_gym.sim import fleet as fl
from diloco_gym.sim.fleet_links import with_link_levels
from diloco_gym.sim.fleet_toml import load_fleet_toml
from diloco_gym.sim.regimes import get_regime

ROOT = Path(__file__).resolve().parents[2]


def _fleet(name: str = "fleet-links.toml"):
    fleet, env_kw = load_fleet_toml(ROOT / "docs" / "examples" / name)
    return fleet, EnvParams(**env_kw)


def _run(env: DiLoCoFleetEnv, seed: int, p_launch: float = 0.3):
    """A seeded random run: observations, rewards, the summary."""
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    seen, rewards = [obs], []
    while True:
        m = env.action_masks()
        a = int((m[1] and rng.random() < p_launch) or not m[0])
        obs, r, term, trunc, _ = env.step(a)
        seen.append(obs)
        rewards.append(r)
        if term or trunc:
            return np.array(seen), np.array(rewards), env.episode_summary()


def test_the_example_fleet_observes_each_sites_link_rate():
    fleet, params = _fleet()
    env = DiLoCoFleetEnv(fleet=fleet, params=params)
    names = [f[0] for f in env.obs_features]
    cols = [names.index(f"{s.name}.link_rate") for s in fleet.sites]
    assert cols == list(range(len(names) - 4, len(names)))  # after the fragments
    obs, info = env.reset(seed=3)
    ep = env.episode
    levels = np.asarray(fleet.link_levels)
    seen = [(info["decision"], obs)]
    while True:
        obs, _, term, trunc, info = env.step(0 if env.action_masks()[0] else 1)
        seen.append((min(info["decision"], ep.n_decisions - 1), obs))
        if term or trunc:
            break
    changed = 0
    for d, o in seen:  # the rates of the decision observed, never a later one
        assert np.array_equal(o[cols], levels[list(ep.link_states[d])].astype(np.float32))
        changed += not np.array_equal(o[cols], seen[0][1][cols])
    assert changed > 0
    assert all(env.observation_space.contains(o) for _, o in seen)


def test_each_sync_runs_with_the_plan_of_its_decisions_links():
    fleet, params = _fleet()
    env = DiLoCoFleetEnv(fleet=fleet, params=params)
    _, _, sm = _run(env, seed=5)
    ep = env.episode
    levels = np.asarray(fleet.link_levels)
    base = [s.sidecar_params(get_regime(s.regime).sidecar) for s in fleet.sites]
    nominal = fl.sync_plan(fleet, base, params.step_seconds)
    windows = set()
    syncs = zip(
        sm["merge_decisions"], sm["sync_windows_s"], sm["merge_costs_requests"], strict=True
    )
    for d, w, cost in syncs:
        rates = tuple(float(x) for x in levels[list(ep.link_states[d])])
        plan = fl.sync_plan(with_link_levels(fleet, rates), base, params.step_seconds)
        assert w == plan.window_s >= nominal.window_s
        windows.add(w)
        v = ep.variant_at(d, env.setup.default_option)
        assert env.setup.option_plans[v] == plan
        assert [sc.sync_slowdown for sc in env.setup.option_sidecars[v]] == list(plan.slowdowns)
        assert cost == sum(e.merge_cost_at(d) for e in ep.sites_of(v))
    assert len(windows) > 1  # the example's links change the window


def _same_as_fixed_links(plain: DiLoCoFleetEnv, other: DiLoCoFleetEnv, seeds) -> None:
    """``other`` (links that never leave their nominal rate) runs as ``plain`` (fixed
    links): the same rewards and summary, the same observations with the links' features
    reading 1."""
    for seed in seeds:
        o0, r0, s0 = _run(plain, seed)
        o1, r1, s1 = _run(other, seed)
        assert np.array_equal(r0, r1)
        assert np.array_equal(o1[:, : o0.shape[1]], o0) and np.all(o1[:, o0.shape[1] :] == 1.0)
        s1.pop("episode_seed"), s0.pop("episode_seed")
        assert s0 == s1


def test_links_at_their_nominal_rate_are_the_fleet_of_fixed_links():
    """One level, 1.0: the same rewards and summary as without links, and the links'
    features read 1 (the special case)."""
    fleet, params = _fleet("fleet-v1.toml")
    plain = DiLoCoFleetEnv(fleet=fleet, params=params)
    one = DiLoCoFleetEnv(fleet=replace(fleet, link_levels=(1.0,)), params=params)
    _same_as_fixed_links(plain, one, (0, 9))


def test_the_sites_traffic_is_the_same_with_and_without_links():
    fleet, params = _fleet()
    a = DiLoCoFleetEnv(fleet=fleet, params=params).build_episode(4)
    b = DiLoCoFleetEnv(
        fleet=replace(fleet, link_levels=None, link_probs=None, link_dwell_s=None), params=params
    ).build_episode(4)
    for x, y in zip(a.sites, b.sites, strict=True):
        assert np.array_equal(x.base_s, y.base_s) and np.array_equal(x.req_bin, y.req_bin)
    assert b.link_states is None and a.link_states is not None


def test_the_same_seed_gives_the_same_links_observations_and_rewards():
    fleet, params = _fleet()
    o1, r1, s1 = _run(DiLoCoFleetEnv(fleet=fleet, params=params), 11)
    o2, r2, s2 = _run(DiLoCoFleetEnv(fleet=fleet, params=params), 11)
    assert np.array_equal(o1, o2) and np.array_equal(r1, r2) and s1 == s2


def test_the_corridor_must_hold_the_slowest_links_window():
    fleet, params = _fleet()
    with pytest.raises(fl.FleetConfigError, match="does not fit the fragment corridor") as exc:
        DiLoCoFleetEnv(fleet=replace(fleet, link_levels=(1.0, 0.1), link_probs=None), params=params)
    assert "\n" not in str(exc.value)


def test_a_fleet_with_links_needs_an_episode_seed():
    fleet, params = _fleet()
    env = DiLoCoFleetEnv(fleet=fleet, params=params)
    with pytest.raises(ValueError, match="needs an episode seed"):
        env.setup.links.states(None, 10)


def _run_rounds(env, seed: int):
    """A seeded random run of a rounds env (each free site asked with probability 0.3)."""
    obs, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    rewards = [0.0]
    while True:
        m = env.action_masks().reshape(-1, 2)
        a = np.array([rng.random() < 0.3 if f[0] and f[1] else f[1] for f in m], dtype=np.int8)
        obs, r, term, trunc, _ = env.step(a)
        rewards.append(r)
        if term or trunc:
            return np.array(rewards), env.episode_summary()


def test_rounds_charge_each_contribution_with_its_decisions_links():
    """Per-site timing with changing links: a site's contribution at decision ``d`` costs
    its isolated cost in the links' state of ``d``, and the protocol's rounds scorer equals
    the summary's replay of every site at its own decisions."""
    from diloco_gym.envs.fleet_rounds import make_fleet_env
    from diloco_gym.eval.fleet_rounds import RoundsScorer

    fleet, params = _fleet("fleet-rounds.toml")
    links = replace(fleet, link_levels=(1.0, 0.6), link_dwell_s=30.0)
    env = make_fleet_env(fleet=links, params=params)
    names = env.setup.site_names
    for seed in (0, 1):
        _, sm = _run_rounds(env, seed)
        ep = env.episode
        k = env.setup.default_option
        sends = [sm["site_sync_decisions"][n] for n in names]
        for r, d in enumerate(sm["round_openings"]):  # a round's cost: its sites' own costs
            want = sum(
                ep.sites_of(ep.variant_at(int(x), k))[s].merge_cost_at(int(x))
                for s, x in enumerate(env._rounds[r].send_d)
                if env._rounds[r].sent[s]
            )
            assert sm["merge_costs_requests"][r] == want
            assert (
                min(
                    int(x)
                    for x, on in zip(env._rounds[r].send_d, env._rounds[r].sent, strict=True)
                    if on
                )
                >= d
            )
        scorer = RoundsScorer(ep, env.params, env.setup.sidecars)
        got = scorer.score([sends])
        assert got.exact_pct[0] == pytest.approx(sm["sync_excess_pct"], abs=1e-9)
        assert len({ep.variant_at(d, k) for d in range(ep.n_decisions)}) > 2


def test_rounds_with_links_at_their_nominal_rate_are_rounds_with_fixed_links():
    from diloco_gym.envs.fleet_rounds import make_fleet_env

    fleet, params = _fleet("fleet-rounds.toml")
    plain = make_fleet_env(fleet=fleet, params=params)
    one = make_fleet_env(fleet=replace(fleet, link_levels=(1.0,)), params=params)
    r0, s0 = _run_rounds(plain, 3)
    r1, s1 = _run_rounds(one, 3)
    assert np.array_equal(r0, r1)
    s0.pop("episode_seed"), s1.pop("episode_seed")
    assert s0 == s1


def _traced(tmp_path, shares: dict[str, str], length: int = 1800):
    """The example fleet v1 with link traces at some sites (``shares``: site -> the CSV
    rows after the header, the last row marking the end at ``length`` s)."""
    fleet, params = _fleet("fleet-v1.toml")
    sites = []
    for st in fleet.sites:
        if st.name in shares:
            p = tmp_path / f"{st.name}.csv"
            p.write_text(f"time_s,share\n{shares[st.name]}\n{length},1\n")
            st = replace(st, link_trace=str(p))
        sites.append(st)
    return replace(fleet, sites=tuple(sites)), params


def test_a_link_trace_sets_each_decisions_link_rate(tmp_path):
    """The observed rate at decision d is the trace's share at the episode's tile start
    plus d's time (causal: the link as it runs now); episodes tile the trace by seed; the
    sync at d runs at those rates' plan; the same seed gives the same run."""
    first = _fleet("fleet-v1.toml")[0].sites[0].name
    fleet, params = _traced(tmp_path, {first: "0,1\n100,0.5\n700,0.8\n1300,0.5"})
    env = DiLoCoFleetEnv(fleet=fleet, params=params)
    assert env.setup.links.on and env.setup.links.levels == (1.0, 0.8, 0.5)
    k = env.obs_index[f"{first}.link_rate"]
    for seed in (0, 1, 2):
        obs, _ = env.reset(seed=seed)
        ep = env.episode
        n = ep.n_decisions
        span = n * params.decision_seconds
        tiles = int(1800 // span)
        t = (seed % tiles) * span + np.arange(n) * params.decision_seconds
        want = np.select([t < 100, t < 700, t < 1300], [1.0, 0.5, 0.8], 0.5)
        got = np.array([env.setup.links.rates(s)[0] for s in ep.link_states])
        assert np.array_equal(got, want)
        assert obs[k] == np.float32(want[0])
        assert all(s[1:] == (0,) * (len(s) - 1) for s in ep.link_states)  # no trace: nominal
    a, b = _run(env, 5), _run(env, 5)
    assert all(np.array_equal(x, y) for x, y in zip(a[:2], b[:2], strict=True))


def test_a_nominal_link_trace_is_the_fleet_of_fixed_links(tmp_path):
    """A trace whose share is 1 throughout: the fixed-link fleet's rewards and summary, its
    features reading 1 (the special case)."""
    fleet, params = _fleet("fleet-v1.toml")
    plain = DiLoCoFleetEnv(fleet=fleet, params=params)
    traced, _ = _traced(tmp_path, {st.name: "0,1" for st in fleet.sites})
    _same_as_fixed_links(plain, DiLoCoFleetEnv(fleet=traced, params=params), (0, 4))


def test_a_link_trace_shorter_than_an_episode_is_refused_naming_it(tmp_path):
    first = _fleet("fleet-v1.toml")[0].sites[0].name
    fleet, params = _traced(tmp_path, {first: "0,0.5"}, length=200)
    env = DiLoCoFleetEnv(fleet=fleet, params=params)
    with pytest.raises(
        ValueError, match=rf"{first}.csv: link_trace of site '{first}' covers 200 s"
    ):
        env.reset(seed=0)
