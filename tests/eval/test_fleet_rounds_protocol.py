"""The protocol on a fleet with per-site timing (eval/fleet_rounds.py)."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import diloco_gym  # noqa: F401
from diloco_gym.envs import fleet_cap as env_cap
from diloco_gym.eval import fleet_rounds as fr
from diloco_gym.eval.fleet import FleetReportConfig
from diloco_gym.eval.report import run_protocol
from diloco_gym.sim import fleet as fl
from diloco_gym.sim import rounds as rd
from diloco_gym.sim.schedules import is_feasible, optimal_schedule

LONG = {"h_min_steps": 256}


def env_of(grace=9.0, quorum=None, delays=(0.0, 0.0, 0.0), fragments=1):
    sites = tuple(fl.SiteConfig(name=f"s{i}", delay_max_s=d) for i, d in enumerate(delays))
    f = fl.FleetParams(
        sites=sites, model_version=1, timing="rounds", grace_s=grace, quorum=quorum,
        fragments=fragments,
    )  # fmt: skip
    return gym.make("DiLoCoFleet-v1", fleet=f, **LONG).unwrapped


def run(env, seed, pol):
    ep = env.build_episode(seed)
    obs, info = env.reset(seed=seed, options={"episode": ep})
    k = 0
    while True:
        obs, r, term, trunc, info = env.step(pol(k, obs))
        k += 1
        if trunc:
            return ep, info["episode_summary"]


def first_site_then_wait(env):
    def pol(k, obs):
        if obs[env.obs_index["round_open"]] < 0.5:
            return np.array([1, 0, 0])
        return np.array([0, k % 3 == 0, 0])

    return pol


@pytest.mark.parametrize("fragments", [1, 2, 3])
def test_the_agent_is_scored_by_the_envs_own_replay(fragments):
    """The protocol's exact replay of the agent's per-site syncs is the env's own, with one
    fragment or several (a round syncs one fragment; its syncs are the fragment's)."""
    env = env_of(delays=(0.0, 3.0, 6.0), fragments=fragments)
    for seed in (0, 1):
        ep, s = run(env, seed, first_site_then_wait(env))
        sc = fr.score_rounds_episode(env, ep, s, 50, np.random.default_rng(0))
        assert sc["sync_excess_pct"] == pytest.approx(s["sync_excess_pct"], abs=1e-9)
        assert sc["additive_excess_pct"] == pytest.approx(s["additive_excess_pct"], abs=1e-9)
        lower = sc["oracle_lower_bound_pct"]
        assert 0.0 < lower <= min(sc["sync_excess_pct"], sc["oracle_same_budget_pct"]) + 1e-12


def _bound_and_scored(env, seed, pol, draws=300):
    """A rounds episode's certified lower bound, and the exact sync-excess of every
    schedule the protocol scores on it: the agent's, matched-random rows, the oracle."""
    from diloco_gym.sim.schedules import sample_uniform

    ep, s = run(env, seed, pol)
    p, n = env.params, ep.n_decisions
    scorer = fr.RoundsScorer(ep, p, env.setup.sidecars)
    round_sites = [list(x) for x in s["round_sites"]]
    delays = env.round_delays(ep)
    lower = fr.rounds_lower_bound(scorer, env.rules, delays, round_sites, p.h_min, p.h_max)
    rng = np.random.default_rng(seed)
    openings = sample_uniform(n, p.h_min, p.h_max, len(round_sites), draws, rng)
    rows, _ = fr.control_sends(openings, round_sites, env.rules, delays, n - 1, rng)
    orc = fr.rounds_oracle(scorer.costs, env.rules, delays, round_sites, p.h_min, p.h_max)
    scored = scorer.score([fr.site_rows(env, s), orc, *rows]).exact_pct
    return ep, s, scorer, lower, scored


@pytest.mark.parametrize(
    "kw",
    [
        {"delays": (0.0, 3.0, 6.0)},  # stragglers, every site in every round
        {"quorum": 2, "delays": (0.0, 3.0, 6.0)},  # sites dropped from rounds
        {"grace": 0.0},  # the one-instant rules
        {"delays": (0.0, 3.0, 6.0), "fragments": 2},  # each round syncs one fragment
        {"quorum": 2, "delays": (0.0, 3.0, 6.0), "fragments": 3},
    ],
)
def test_the_rounds_bound_is_below_every_schedule_the_protocol_scores(kw):
    """The certified lower bound of a rounds episode is below the agent's, the oracle's
    and every matched-random row's exact sync-excess (rows that drop a late site
    included), and it is not trivial."""
    env = env_of(**kw)
    for seed in (0, 1, 2):
        *_, lower, scored = _bound_and_scored(env, seed, first_site_then_wait(env))
        assert 0.0 < lower <= scored.min() + 1e-12, (kw, seed)
        assert lower > 0.25 * scored[1]  # within a factor 4 of the oracle


def test_with_one_instant_rules_the_rounds_bound_is_the_one_instant_fleets():
    """Grace 0, every site in the quorum, no stragglers: every site syncs at each opening,
    and the bound is the one-instant fleet's, the sites' single-host bounds weighted by
    their requests, bit for bit."""
    from diloco_gym.eval.lower_bound import lower_bound_pct

    env = env_of(grace=0.0)
    ep, s, scorer, lower, _ = _bound_and_scored(env, 4, first_site_then_wait(env), draws=5)
    m = len(s["round_sites"])
    assert all(len(x) == 3 for x in s["round_sites"])
    want = 0.0
    for e, sc, count in zip(ep.sites, env.setup.sidecars, scorer.n_requests, strict=True):
        want += lower_bound_pct(e, m, env.params, sc) * float(count) / scorer.total
    assert lower == want


def test_a_bound_above_a_scored_schedule_stops_the_report(monkeypatch):
    """The bound rests on a premise (a sync only adds violations); a bound above any
    schedule the protocol scored would disprove it, and is an error, not a row."""
    env = env_of(delays=(0.0, 3.0, 6.0))
    ep, s = run(env, 0, first_site_then_wait(env))
    monkeypatch.setattr(fr, "rounds_lower_bound", lambda *a, **k: 1e9)
    with pytest.raises(RuntimeError, match="premise fails"):
        fr.score_rounds_episode(env, ep, s, 20, np.random.default_rng(0))


def test_matched_random_keeps_each_rounds_sites_and_the_rules():
    env = env_of(quorum=2, delays=(0.0, 3.0, 6.0))
    ep, s = run(env, 3, first_site_then_wait(env))
    n = ep.n_decisions
    m = len(s["round_sites"])
    delays = rd.draw_delays(ep.seed, m, env.rules)
    rng = np.random.default_rng(1)
    from diloco_gym.sim.schedules import sample_uniform

    openings = sample_uniform(n, env.params.h_min, env.params.h_max, m, 30, rng)
    rows, dropped = fr.control_sends(openings, s["round_sites"], env.rules, delays, n - 1, rng)
    counts = {k: len(v) for k, v in s["site_sync_decisions"].items()}
    for sched, row in zip(openings, rows, strict=True):
        assert is_feasible(sched, n, env.params.h_min, env.params.h_max)
        got = {f"s{i}": len(x) for i, x in enumerate(row)}
        assert sum(got.values()) + 0 >= sum(counts.values()) - dropped
        for site in range(3):
            sends = sorted(row[site])
            ks = [k for k in range(m) if site in s["round_sites"][k]]
            assert len(sends) <= len(ks)
            for d in sends:
                k = max(j for j in range(m) if sched[j] <= d)
                lo, hi = rd.send_range(int(sched[k]), int(delays[k, site]), env.rules.grace, n - 1)
                assert lo <= d <= hi and site in s["round_sites"][k]
    if dropped == 0:
        assert all(len(x) == counts[f"s{i}"] for row in rows for i, x in enumerate(row))


def test_the_oracle_beats_every_draw_additively_and_is_the_instant_dp_at_grace_0():
    env = env_of(delays=(0.0, 3.0, 0.0))
    ep, s = run(env, 4, first_site_then_wait(env))
    m = len(s["round_sites"])
    delays = rd.draw_delays(ep.seed, m, env.rules)
    scorer = fr.RoundsScorer(ep, env.params, env.setup.sidecars)
    orc = fr.rounds_oracle(scorer.costs, env.rules, delays, s["round_sites"], 32, 64)
    n = ep.n_decisions
    from diloco_gym.sim.schedules import sample_uniform

    openings = sample_uniform(n, 32, 64, m, 200, np.random.default_rng(2))
    rows, _ = fr.control_sends(openings, s["round_sites"], env.rules, delays, n - 1,
                               np.random.default_rng(3))  # fmt: skip
    o = scorer.score([orc]).additive_pct[0]
    assert o <= scorer.score(rows).additive_pct.min() + 1e-12
    agent_row = [s["site_sync_decisions"][f"s{i}"] for i in range(3)]
    assert o <= scorer.score([agent_row]).additive_pct[0]
    # With no grace and no delay every site syncs at the opening: the one-instant DP.
    env0 = env_of(grace=0.0)
    ep0, s0 = run(env0, 4, lambda k, obs: np.ones(3, dtype=int))
    m0 = len(s0["round_sites"])
    sc0 = fr.RoundsScorer(ep0, env0.params, env0.setup.sidecars)
    orc0 = fr.rounds_oracle(sc0.costs, env0.rules, np.zeros((m0, 3), int), s0["round_sites"],
                            32, 64)  # fmt: skip
    sched, total = optimal_schedule(sc0.costs.sum(axis=0), 32, 64, m0)
    assert orc0 == [list(map(int, sched))] * 3
    assert sc0.costs.sum(axis=0)[sched].sum() == pytest.approx(total)


def test_the_report_runs_rounds_fleets_and_refuses_the_own_rule_elsewhere(tmp_path):
    res = run_protocol(
        FleetReportConfig(
            fleet="docs/examples/fleet-rounds.toml",
            agents=["online-forecast", "online-forecast+own", "offline-oracle"],
            seeds=3,
            draws=20,
        )
    )
    rows = res["rows"]
    assert set(rows["agent"]) == {"online-forecast", "online-forecast+own", "offline-oracle"}
    assert (rows["oracle_same_budget_pct"] <= rows["matched_random_mean"] + 1e-9).all()
    assert "control_dropped" in rows
    with pytest.raises(ValueError, match=r"'\+own' site rule needs a fleet with timing"):
        run_protocol(
            FleetReportConfig(fleet="docs/examples/fleet.toml", agents=["online-forecast+own"],
                              seeds=2, draws=5)
        )  # fmt: skip


ROUNDS_EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "fleet-rounds.toml"


def test_the_rounds_summary_carries_the_rounds_columns_and_an_upper_bound_oracle():
    """The per-agent summary of a rounds report has the rounds' columns (means of the
    rows'), so the frontier and a sweep's summary carry them; its table heads the oracle
    as an upper bound and its rows do not claim the single-host local search."""
    from diloco_gym.eval.fleet import fleet_summary_table

    res = run_protocol(
        FleetReportConfig(fleet=str(ROUNDS_EXAMPLE),
                          agents=["pressure-gate", "pressure-gate+own"], seeds=2, draws=10)
    )  # fmt: skip
    summary, rows = res["summary"], res["rows"]
    for agent, g in rows.groupby("agent"):
        got = summary[summary["agent"] == agent].iloc[0]
        for col in fr.ROUNDS_SUMMARY_COLUMNS:
            assert got[col] == pytest.approx(g[col].mean())
    assert fr.is_rounds(summary) and not fr.is_rounds(rows.drop(columns=["dropped_contributions"]))
    assert "| oracle (upper bound) pp |" in fleet_summary_table(summary)
    assert set(rows["oracle_schedule"]) == {fr.ORACLE_ROUNDS}
    assert "local search" not in fr.ORACLE_ROUNDS and "upper bound" in fr.ORACLE_ROUNDS


def _capped(cap: float, quorum: int = 1):
    """A bursty site beside an always-busy one, per-site timing and a site cap."""
    sites = (fl.SiteConfig(name="bursty"), fl.SiteConfig(name="busy", regime="sync-heavy"))
    f = fl.FleetParams(
        sites=sites, model_version=1, timing="rounds", grace_s=9.0, quorum=quorum,
        site_cap_pp=cap,
    )  # fmt: skip
    return gym.make("DiLoCoFleet-v1", fleet=f, **LONG).unwrapped


def test_under_a_site_cap_matched_random_keeps_the_rounds_that_respect_it():
    """The capped rounds control: every kept row respects the cap (the replay), the cap
    binds on the uncapped control's rows (some break it), and a cap too loose to bind
    gives the uncapped control's rows and scores exactly."""
    from diloco_gym.envs import fleet_cap as env_cap
    from diloco_gym.eval.fleet_cap import cap_check
    from diloco_gym.sim.schedules import sample_uniform

    env = _capped(4.0)
    ep, s = run(env, 2, lambda k, obs: np.array([1, 1]))
    check = cap_check(env)
    round_sites = [list(x) for x in s["round_sites"]]
    delays = env.round_delays(ep)
    rows, opened, _, acc = fr.capped_rounds_control(
        env, ep, round_sites, delays, 40, np.random.default_rng(0), None, check
    )
    assert len(rows) == 40 and 0.0 < acc < 1.0
    p, n = env.params, ep.n_decisions

    def kept(openings, rows):
        table = env_cap.contribution_table(openings, rows, 2)
        return env_cap.rounds_respect_cap(
            openings, table, env.rules, ep.site_costs, check.lags, check.caps, p.h_max
        )

    assert kept(opened, rows).all()
    rng = np.random.default_rng(1)
    draw = sample_uniform(n, p.h_min, p.h_max, len(round_sites), 200, rng)
    free, _ = fr.control_sends(draw, round_sites, env.rules, delays, n - 1, rng)
    assert not kept(draw, free).all()  # the cap binds on uniform rows
    loose = _capped(100.0)
    ep2, s2 = run(loose, 2, lambda k, obs: np.array([1, 1]))
    a = fr.score_rounds_episode(
        loose, ep2, s2, 30, np.random.default_rng(5), None, cap_check(loose)
    )
    b = fr.score_rounds_episode(loose, ep2, s2, 30, np.random.default_rng(5))
    assert a.pop("matched_random_cap_acceptance") == 1.0
    assert a.keys() == b.keys()
    for key in a:  # equal, NaN included (no certified bound on rounds)
        assert a[key] == b[key] or (a[key] != a[key] and b[key] != b[key]), key
    assert a["control_dropped"] == b["control_dropped"]


def _control_sends_one_by_one(openings, round_sites, rules, delays, last, rng):
    """The control's contributions drawn one call per contribution (the reference the
    one-call draw must equal)."""
    from diloco_gym.sim import rounds as rd

    rows, dropped = [], 0
    for sched in np.asarray(openings, dtype=np.int64):
        row = [[] for _ in range(rules.n_sites)]
        for k, o in enumerate(sched.tolist()):
            for s in round_sites[k]:
                lo, hi = rd.send_range(o, int(delays[k, s]), rules.grace, last)
                if lo > hi:
                    dropped += 1
                    continue
                row[s].append(int(rng.integers(lo, hi + 1)))
        rows.append(row)
    return rows, dropped


@pytest.mark.parametrize("grace", [0.0, 9.0])
def test_the_controls_contributions_are_those_of_one_draw_each(grace):
    """One call draws the control's contributions: the rows, the drops and the generator's
    state after are those of one draw per contribution, in row, round and site order."""
    from diloco_gym.sim import rounds as rd

    rules = rd.round_rules(grace, 3, [0.0, 18.0, 0.0, 9.0], [1.0, 1.0, 2.0, 1.0], 4.5)
    rng0 = np.random.default_rng(3)
    n = 400
    # rounds at least 8 decisions apart (a round's grace and delays fit in the gap, as
    # the corridor's H_min ensures)
    openings = np.cumsum(rng0.integers(8, 40, size=(50, 6)), axis=1)
    openings[::5, -1] = n - 2  # a last round near the end: a late site is never ready
    delays = rng0.integers(0, 5, size=(6, 4))
    round_sites = [[0, 1, 2, 3], [2, 0], [3], [1, 3, 0], [0, 1, 2, 3], [2]]
    a, b = np.random.default_rng(11), np.random.default_rng(11)
    rows, dropped, table = fr.control_draws(openings, round_sites, rules, delays, n - 1, a)
    want = _control_sends_one_by_one(openings, round_sites, rules, delays, n - 1, b)
    assert (rows, dropped) == want and dropped > 0  # some are never ready: dropped
    assert a.random() == b.random()
    # the table is the env's reading of those rows (each contribution in its own round)
    assert np.array_equal(table, env_cap.contribution_table(openings, rows, rules.n_sites))


def test_with_changing_links_the_rounds_bound_is_below_every_scored_schedule():
    """Per-site timing and changing links (the example fleet): each decision's credits are
    its own sync's, and the bound stays below every schedule the protocol scores."""
    path = Path(__file__).resolve().parents[2] / "docs" / "examples" / "fleet-rounds-links.toml"
    env = gym.make("DiLoCoFleet-v1", fleet=str(path)).unwrapped
    n_sites = env.fleet.n_sites

    def pol(k, obs):
        opening = obs[env.obs_index["round_open"]] < 0.5 and k % 3 == 0
        return np.ones(n_sites, dtype=int) if opening else np.zeros(n_sites, dtype=int)

    for seed in (0, 1):
        *_, lower, scored = _bound_and_scored(env, seed, pol)
        assert 0.0 < lower <= scored.min() + 1e-12, seed
