"""The protocol on a fleet (diloco_gym/eval/fleet.py); the fleet agents (agents/fleet.py) are
tested in tests/agents/test_fleet_agents.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from diloco_gym.agents.fleet import fleet_agent
from diloco_gym.agents.heuristics import PressureGate
from diloco_gym.envs.fleet import DiLoCoFleetEnv
from diloco_gym.envs.params import EnvParams
from diloco_gym.eval import protocol
from diloco_gym.eval.fleet import SYNC_NAMES, FleetReportConfig, FleetScorer, write_fleet_report
from diloco_gym.eval.report import run_protocol
from diloco_gym.eval.rollout import run_episode
from diloco_gym.sim.fleet import FleetParams, SiteConfig
from diloco_gym.sim.fleet_toml import load_fleet_toml
from diloco_gym.sim.schedules import sample_uniform

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "fleet.toml"
LINKS = EXAMPLE.with_name("fleet-links.toml")


@pytest.mark.slow
def test_fleet_scorer_is_the_sum_of_the_sites_exact_replays():
    env = DiLoCoFleetEnv(fragments=2)
    ep = env.build_episode(3)
    sc = FleetScorer(ep, env.params, env.setup.sidecars)
    p = env.params
    sch = sample_uniform(ep.n_decisions, p.h_min, p.h_max, 40, 5, np.random.default_rng(0))
    got = sc.score(sch).exact_pct
    # reference: each site's full replay (the slow path), in requests, over all requests
    req = 0.0
    for e, s in zip(ep.sites, env.setup.sidecars, strict=True):
        req = req + protocol.replay_full(e, sch, p, s) * e.n_requests / 100.0
    assert np.allclose(got, req * 100.0 / ep.n_requests, atol=1e-9)


def test_changing_links_are_scored_with_each_syncs_own_link_state():
    """Each site's exact sync-excess on a fleet with changing links equals that site's
    whole-episode replay with each sync's own episode (its links' window and slowdown),
    for random schedules; the oracle is no worse than matched random."""
    from diloco_gym.envs.schedule import schedule_summary

    env = DiLoCoFleetEnv(
        fleet=load_fleet_toml(LINKS)[0], params=EnvParams(**load_fleet_toml(LINKS)[1])
    )
    ep = env.build_episode(2)
    sc = FleetScorer(ep, env.params, env.setup.sidecars)
    p = env.params
    k = env.setup.default_option
    sch = sample_uniform(ep.n_decisions, p.h_min, p.h_max, 60, 3, np.random.default_rng(1))
    kinds = {ep.variant_at(d, k) for d in range(ep.n_decisions)}
    assert len(kinds) > 3  # the links change the plan
    for i, site in enumerate(sc.sites):  # one exact scorer per distinct sync at that site
        own = {
            (env.setup.option_params[v].merge_seconds, env.setup.option_sidecars[v][i])
            for v in kinds
        }
        assert len(site.parts) == len(own) < len(kinds)
    per = sc.site_scores(sch)
    for i, (e, site) in enumerate(zip(ep.sites, per, strict=True)):
        for row, exact in zip(sch, site.exact_pct, strict=True):
            own = [ep.sites_of(ep.variant_at(d, k))[i] for d in row]
            ref = schedule_summary(e, row.tolist(), p, env.setup.sidecars[i], own)
            assert exact == pytest.approx(ref["sync_excess_pct"], abs=1e-9)
    out = protocol.score_episode(sc, sch[0], 100, np.random.default_rng(0))
    assert out["oracle_same_budget_pct"] <= out["matched_random_mean"]


def test_one_site_fleet_scores_as_the_single_env():
    env = DiLoCoFleetEnv(fleet=FleetParams(sites=(SiteConfig(name="b"),), merge_seconds=8.0))
    ep = env.build_episode(1)
    fs = FleetScorer(ep, env.params, env.setup.sidecars)
    ss = protocol.EpisodeScorer(ep.sites[0], env.params, env.setup.sidecars[0])
    p = env.params
    sch = sample_uniform(ep.n_decisions, p.h_min, p.h_max, 12, 4, np.random.default_rng(2))
    assert np.array_equal(fs.score(sch).exact_pct, ss.score(sch).exact_pct)


def test_oracle_is_at_least_as_good_as_matched_random_and_agent():
    env = DiLoCoFleetEnv()
    ep = env.build_episode(2)
    sc = FleetScorer(ep, env.params, env.setup.sidecars)
    res = run_episode(env, fleet_agent(PressureGate()), 2, episode=ep)
    out = protocol.score_episode(sc, res["merge_decisions"], 200, np.random.default_rng(0))
    assert out["oracle_additive_pct"] <= out["additive_excess_pct"] + 1e-9
    assert out["oracle_additive_pct"] <= out["matched_random_additive_mean"] + 1e-9
    assert out["sync_excess_pct"] == pytest.approx(res["sync_excess_pct"], abs=0.05)


@pytest.mark.slow
def test_fleet_report_verdicts_and_determinism():
    cfg = FleetReportConfig(
        fleet=str(EXAMPLE), agents=["pressure-gate", "offline-oracle"], seeds=3, draws=50
    )
    a = run_protocol(cfg)
    b = run_protocol(cfg)
    assert a["rows"].equals(b["rows"])
    s = a["summary"].set_index("agent")
    # 3 episodes cannot reach alpha = 0.05: inconclusive, never "tied"
    assert s.loc["pressure-gate", "verdict"] == "inconclusive (too few episodes)"
    assert a["calibration_verdict"] in ("calibrated", "uncalibrated", "uncertain")
    rows = a["rows"]
    assert (rows["oracle_additive_pct"] <= rows["matched_random_additive_mean"] + 1e-9).all()


def test_report_config_errors():
    with pytest.raises(ValueError, match="seeds must be >= 2"):
        FleetReportConfig(fleet=str(EXAMPLE), agents=["pressure-gate"], seeds=1)


@pytest.mark.slow
def test_fleet_report_seals_deployable_agents_and_the_opt_out_gives_the_same_rows():
    """A fleet report runs deployable agents sealed in their own process (as the single-host
    report does; the fleet view's feature names travel with the public context) and says
    so; in-process evaluation gives the same rows."""
    kw = dict(fleet=str(EXAMPLE), agents=["pressure-gate", "online-forecast"], seeds=2, draws=20)
    sealed = run_protocol(FleetReportConfig(**kw))
    inproc = run_protocol(FleetReportConfig(**kw, in_process_agents=True))
    assert sealed["agent_sealing"].startswith("sealed")
    assert inproc["agent_sealing"].startswith("in-process")
    pd.testing.assert_frame_equal(sealed["rows"], inproc["rows"])
    assert "nonzero_units" in sealed["summary"].columns


def test_a_worst_site_weight_labels_the_oracle_that_no_longer_minimises_the_total(tmp_path):
    """With ``worst_site_weight > 0`` the oracle minimises the sum plus the weighted worst
    site, so its reported total sync-excess can exceed the plain oracle's at the same number
    of syncs (it does here); the report, its console table and the frontier's table say
    which objective the oracle column is."""
    from dataclasses import replace

    from diloco_gym.eval.fleet import fleet_summary_table, oracle_label, write_fleet_report
    from diloco_gym.eval.fleet_frontier import frontier_table
    from diloco_gym.sim.fleet_toml import load_fleet_toml

    fl, env_kw = load_fleet_toml(EXAMPLE)
    totals = {}
    for lam in (0.0, 5.0):
        env = DiLoCoFleetEnv(fleet=replace(fl, worst_site_weight=lam), **env_kw)
        ep = env.build_episode(0)
        sc = FleetScorer(ep, env.params, env.setup.sidecars)
        syncs = np.arange(0, ep.n_decisions, 8)[:40]
        out = protocol.score_episode(sc, syncs, 20, np.random.default_rng(0))
        totals[lam] = out["oracle_same_budget_pct"]
    assert totals[5.0] > totals[0.0]

    assert oracle_label(0.0) == "oracle pp"
    assert oracle_label(5.0) == "oracle (sum + 5 x worst site) pp"
    weighted = tmp_path / "fleet.toml"
    text = EXAMPLE.read_text()
    assert "worst_site_weight = 0.0 " in text
    weighted.write_text(text.replace("worst_site_weight = 0.0 ", "worst_site_weight = 5.0 "))
    cfg = FleetReportConfig(
        fleet=str(weighted), agents=["pressure-gate"], seeds=2, draws=10, in_process_agents=True
    )
    result = run_protocol(cfg)
    assert "| oracle (sum + 5 x worst site) pp |" in fleet_summary_table(result["summary"], 5.0)
    assert "| oracle pp |" in fleet_summary_table(result["summary"])
    md = (write_fleet_report(result, tmp_path / "rep") / "report.md").read_text()
    assert "| oracle (sum + 5 x worst site) pp |" in md
    assert "the oracle minimises the summed isolated cost plus 5 times the worst site" in md
    frame = pd.DataFrame(
        [{"budget": 40, "agent": "a", "syncs_per_hour": 1.0, "sync_excess_pct": 1.0,
          "matched_random_mean": 2.0, "oracle_same_budget_pct": 0.5, "gap_captured": 0.67,
          "worst_site_sync_excess_pct": 1.5, "verdict": "v"}]
    )  # fmt: skip
    assert "| oracle (sum + 5 x worst site) pp |" in frontier_table(frame, 5.0)


def test_the_report_records_the_fleets_traffic_correlation(tmp_path):
    from diloco_gym.eval.fleet import FleetReportConfig
    from diloco_gym.eval.report import run_protocol

    p = tmp_path / "corr.toml"
    p.write_text(
        '[fleet]\ntraffic_correlation = 0.5\n[[site]]\nname = "a"\nregime = "bursty"\n'
        '[[site]]\nname = "b"\nregime = "bursty"\n'
    )
    config = FleetReportConfig(
        fleet=str(p), agents=["fixed-512"], seeds=2, draws=10, in_process_agents=True
    )
    fleet = run_protocol(config)["fleet"]
    assert fleet["traffic_correlation"] == 0.5 and fleet["traffic_common"] is None


def test_a_links_fleets_report_says_how_its_links_change(tmp_path):
    cfg = FleetReportConfig(
        fleet=str(LINKS), agents=["online-forecast"], seeds=2, draws=10, in_process_agents=True
    )
    res = run_protocol(cfg)
    f = res["fleet"]
    assert f["link_levels"] == [1.0, 0.75, 0.5] and f["link_probs"] == [0.6, 0.25, 0.15]
    assert f["link_dwell_s"] == 60.0 and f["sync_window_slowest_s"] > f["sync_window_s"]
    write_fleet_report(res, tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "Links change over time: each site's link runs at 1, 0.75, 0.5" in md
    fixed = run_protocol(
        FleetReportConfig(
            fleet=str(EXAMPLE),
            agents=["online-forecast"],
            seeds=2,
            draws=10,
            in_process_agents=True,
        )
    )["fleet"]
    assert fixed["link_levels"] is None and fixed["sync_window_slowest_s"] is None


@pytest.mark.slow
def test_a_one_site_fleets_report_is_the_single_hosts_row_for_row(tmp_path):
    """The fleet report of a one-site fleet (the paper's 8 s sync) gives the single-host
    report's numbers in every column both write: sync-excess, matched random, the oracle
    and its certified lower bound (the episodes include one where the oracle is an upper
    bound, so the bound is compared), the statistics."""
    from diloco_gym.eval.report import ReportConfig, run_protocol

    one = tmp_path / "one.toml"
    one.write_text('[fleet]\nmerge_seconds = 8.0\n\n[[site]]\nname = "bursty"\nregime = "bursty"\n')
    agents = ["online-forecast", "pressure-gate"]
    single_res = run_protocol(
        ReportConfig(regimes=["bursty"], agents=agents, seeds=5, draws=50, in_process_agents=True),
        progress=False,
    )
    fleet_res = run_protocol(
        FleetReportConfig(fleet=str(one), agents=agents, seeds=5, draws=50, in_process_agents=True)
    )
    single, fleet = single_res["rows"], fleet_res["rows"]
    # one summary: the single host's statistics, the fleet naming its columns after syncs
    a = single_res["summary"].set_index("agent")
    b = fleet_res["summary"].rename(columns={v: k for k, v in SYNC_NAMES.items()})
    b = b.set_index("agent")
    shared = [c for c in a.columns if c in b.columns]
    assert {"diff_pp", "p_holm", "verdict", "gap_captured", "units_needed", "best_p_holm"} <= set(
        shared
    )
    assert set(a.columns) - set(shared) == {"regime", "p95_ms"}
    pd.testing.assert_frame_equal(a.loc[agents, shared], b.loc[agents, shared])
    common = [c for c in single.columns if c in fleet.columns]
    assert {"sync_excess_pct", "matched_random_mean", "oracle_lower_bound_pct"} <= set(common)
    for col in common:
        pd.testing.assert_series_equal(
            single[col].reset_index(drop=True), fleet[col].reset_index(drop=True), obj=col
        )
    assert fleet["oracle_schedule"].str.startswith("upper bound").any()


def test_a_fleets_certified_bound_is_its_sites_bounds_weighted_by_their_requests():
    from diloco_gym.eval.lower_bound import lower_bound_pct

    env = DiLoCoFleetEnv(fleet=str(EXAMPLE.with_name("fleet-v1.toml")))
    ep = env.build_episode(0)
    sc = FleetScorer(ep, env.params, env.setup.sidecars)
    res = run_episode(env, fleet_agent(PressureGate()), 0, episode=ep)
    out = protocol.score_episode(sc, res["merge_decisions"], 30, np.random.default_rng(0))
    assert out["oracle_schedule"].startswith("upper bound")
    m = len(res["merge_decisions"])
    want = sum(
        lower_bound_pct(e, m, env.params, s) * e.n_requests / sc.total
        for e, s in zip(ep.sites, env.setup.sidecars, strict=True)
    )
    assert out["oracle_lower_bound_pct"] == pytest.approx(want, rel=1e-12)
    assert 0.0 < out["oracle_lower_bound_pct"] <= out["oracle_same_budget_pct"]


def _summary_rows(seeds: list[int]) -> pd.DataFrame:
    """Fleet report rows of two agents (one non-deployable) on ``seeds``, as the report
    writes them, with made-up scores: agent ``a`` is 1 pp below matched random, ``b``
    0.5 pp (and 0.01 pp per seed); seed 5's rows (a repeated tile in the test below) are
    far off."""
    rows = []
    for name, gain, deployable in (("a", 1.0, True), ("b", 0.5, False)):
        for s in seeds:
            off = 50.0 if s == 5 else 0.0
            rows.append(
                {
                    "agent": name, "deployable": deployable, "seed": s, "syncs": 10,
                    "syncs_per_hour": 60.0, "duration_s": 600.0,
                    "sync_excess_pct": 5.0 - gain + 0.01 * s + off,
                    "matched_random_mean": 5.0 + off, "matched_random_p05": 4.0,
                    "matched_random_p95": 6.0, "oracle_same_budget_pct": 3.0,
                    "oracle_lower_bound_pct": 2.5, "oracle_schedule": protocol.ORACLE_EXACT,
                    "scoring": protocol.SCORING_EXACT, "additive_exact_gap_pp": 0.0,
                    "requests": 1000, "no_sync_violation_pct": 2.0, "progress": 1.0 + off,
                    "worst_site_sync_excess_pct": 6.0 + off,
                }
            )  # fmt: skip
    return pd.DataFrame(rows)


def test_the_fleet_summary_is_the_single_hosts_with_the_fleet_as_one_setting():
    """One gate: Holm over every agent of the report (the non-deployable one included, as
    on a single host), every number over the independent episodes only (seed 5 repeats a
    tile and stays out of the means), and the fleet's names of the columns in syncs."""
    from diloco_gym.eval.fleet import fleet_summary
    from diloco_gym.eval.summary import holm

    df = _summary_rows(list(range(6)))
    indep = set(range(5))  # seed 5 repeats a tile
    out = fleet_summary(df, ["a", "b"], indep, "calibrated", 0.05).set_index("agent")
    assert out.loc["a", "diff_pp"] == pytest.approx(-1.0 + 0.02)
    assert out.loc["b", "diff_pp"] == pytest.approx(-0.5 + 0.02)
    assert out.loc["a", "matched_random_mean"] == pytest.approx(5.0)  # seed 5 left out
    assert out.loc["a", "worst_site_sync_excess_pct"] == pytest.approx(6.0)
    assert out.loc["a", "progress"] == pytest.approx(1.0)
    assert list(out["units"]) == [5, 5] and list(out["units_all"]) == [6, 6]
    assert list(out["holm_family"]) == [2, 2]
    np.testing.assert_allclose(out["p_holm"], holm(out["p_value"].to_numpy()))
    assert out.loc["a", "gap_captured"] == pytest.approx(0.98 / 2.0)
    assert {"syncs_per_hour", "ci_low", "ci_high", "units_needed", "best_p_holm"} <= set(out)
    assert not {"merges_per_hour", "matched_random_pct", "regime", "p95_ms"} & set(out)
    # 5 units, all below random: the smallest p a sign-flip test gives, 2/32, is above
    # alpha even before Holm
    assert list(out["units_needed"]) == [protocol.units_needed(0.05, 2)] * 2
    assert all(v.startswith("inconclusive") for v in out["verdict"])


def test_a_fleet_report_explains_an_inconclusive_verdict_as_the_single_host_does(tmp_path):
    """Two episodes cannot reach alpha: report.md says so in the single host's words (the
    units, the best p they could give after Holm, the units needed, --seeds), and its table
    has the single host's n (non-zero) and gap captured columns."""
    res = run_protocol(
        FleetReportConfig(
            fleet=str(EXAMPLE),
            agents=["online-forecast", "pressure-gate"],
            seeds=2,
            draws=10,
            in_process_agents=True,
        )
    )
    assert set(res["summary"]["verdict"]) == {"inconclusive (too few episodes)"}
    write_fleet_report(res, tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    need = protocol.units_needed(0.05, 2)
    for agent in ("online-forecast", "pressure-gate"):
        assert f"**{agent}: inconclusive (too few episodes)**: 2 independent seeds" in md
    assert f"At least {need} independent seeds with a non-zero difference are needed" in md
    assert "(--seeds)" in md and "| n (non-zero) |" in md and "| gap captured |" in md
    # the single host's figure, the fleet as one setting named after its file
    assert (
        "](fig_fleet_fleet.png)" in md and (tmp_path / "rep" / "fig_fleet_fleet.png").stat().st_size
    )
    assert json.loads((tmp_path / "rep" / "report.json").read_text())["figures"] == [
        "fig_fleet_fleet.png"
    ]


def test_a_fleet_with_link_traces_is_reported_with_each_syncs_own_rates(tmp_path):
    """Link traces through the report: report.json names them, report.md says the links
    follow them, and the agent's exact sync-excess is the env's own replay."""
    # at 0.2 the first site's 10 Gbit/s link is the fleet's slowest: the window grows
    (tmp_path / "a.csv").write_text("time_s,share\n0,1\n200,0.2\n500,0.75\n1300,1\n")
    text = EXAMPLE.with_name("fleet-v1.toml").read_text()
    first = load_fleet_toml(EXAMPLE.with_name("fleet-v1.toml"))[0].sites[0].name
    marker = f'name = "{first}"'
    assert marker in text
    path = tmp_path / "traced.toml"
    path.write_text(text.replace(marker, f'{marker}\nlink_trace = "a.csv"', 1))
    res = run_protocol(
        FleetReportConfig(
            fleet=str(path), agents=["online-forecast"], seeds=3, draws=10, in_process_agents=True
        )
    )
    assert res["fleet"]["link_traces"] == {first: str(tmp_path / "a.csv")}
    assert res["fleet"]["link_trace_tiles"] == 2  # 1300 s of trace, about 600 s per episode
    # seed 2 replays seed 0's links: the first seed of each tile enters the test
    assert res["verdict_seeds"] == [0, 1] and res["independent_units"] == 2
    assert set(res["summary"]["units"]) == {2}
    assert res["fleet"]["sync_window_slowest_s"] > res["fleet"]["sync_window_s"]
    write_fleet_report(res, tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "Links follow measured traces at site(s)" in md
    assert "tile k mod 2 of them, so episodes 2 seeds apart share their links" in md
    assert "only the first seed of each tile enters the test" in md
    rows = res["rows"]  # the scorer's exact sync-excess is the env's own replay
    scored = rows["sync_excess_pct"] * rows["requests"] / 100.0
    np.testing.assert_allclose(scored, rows["excess_requests"], rtol=1e-9)


@pytest.mark.parametrize("name", ["fleet-links", "fleet-link-traces"])
def test_with_changing_links_the_certified_bound_is_below_every_scored_schedule(name):
    """With changing links a site's syncs differ in window by decision; each decision's
    credits are its own sync's, and the fleet's certified bound stays below the agent's,
    the oracle's and every matched-random schedule's exact sync-excess."""
    env = DiLoCoFleetEnv(fleet=str(EXAMPLE.with_name(f"{name}.toml")))
    p = env.params
    for seed in (0, 1):
        ep = env.build_episode(seed)
        sc = FleetScorer(ep, p, env.setup.sidecars)
        res = run_episode(env, fleet_agent(PressureGate()), seed, episode=ep)
        m = len(res["merge_decisions"])
        rng = np.random.default_rng(seed)
        out = protocol.score_episode(sc, res["merge_decisions"], 30, rng)
        assert out["oracle_schedule"].startswith("upper bound")
        lower = out["oracle_lower_bound_pct"]
        rows = sample_uniform(ep.n_decisions, p.h_min, p.h_max, m, 300, rng)
        control = sc.score(rows).exact_pct
        scored = min(control.min(), out["sync_excess_pct"], out["oracle_same_budget_pct"])
        assert 0.0 < lower <= scored + 1e-12, (name, seed)


def test_a_mixed_scorers_credits_are_each_decisions_own_parts():
    """scorer_credits of a scorer with one kind of merge is pair_credits; a mixed scorer's
    row d is its decision's part's row d."""
    from diloco_gym.eval.lower_bound import pair_credits, scorer_credits
    from diloco_gym.eval.scorer import EpisodeScorer, MixedScorer

    env = DiLoCoFleetEnv(fleet=str(EXAMPLE.with_name("fleet-links.toml")))
    ep = env.build_episode(0)
    sc = FleetScorer(ep, env.params, env.setup.sidecars)
    mixed = [s for s in sc.sites if isinstance(s, MixedScorer) and len(s.parts) > 1]
    assert mixed, "the example's links change some site's sync window"
    site = mixed[0]
    got = scorer_credits(site)
    each = [pair_credits(q.episode, q.params, q.sidecar) for q in site.parts]
    for d in range(ep.n_decisions):
        own = each[site.kind[d]]  # (before, window, tail) of decision d's part
        for i in range(3):
            np.testing.assert_array_equal(got[i][d], own[i][d])
    assert len(set(site.kind.tolist())) > 1
    plain = EpisodeScorer(site.parts[0].episode, site.parts[0].params, site.parts[0].sidecar)
    for a, b in zip(scorer_credits(plain), each[0], strict=True):
        np.testing.assert_array_equal(a, b)
