"""The protocol on a fleet (diloco_gym/eval/fleet.py) and the fleet agents (agents/fleet.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from diloco_gym.agents.fleet import FleetOracleView, FleetView, aggregate_obs, fleet_agent
from diloco_gym.agents.heuristics import OfflineCalibratedOracle, OnlineForecastWA, PressureGate
from diloco_gym.envs.fleet import DiLoCoFleetEnv
from diloco_gym.envs.observation import OBS_DIM, OBS_INDEX, squash_rate, unsquash_rate
from diloco_gym.eval import protocol
from diloco_gym.eval.fleet import FleetReportConfig, FleetScorer, run_fleet_report
from diloco_gym.eval.rollout import run_episode
from diloco_gym.sim.fleet import FleetParams, SiteConfig
from diloco_gym.sim.schedules import sample_uniform

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "fleet.toml"


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


def _obs(sites_exo, prefix=None):
    o = np.zeros(OBS_DIM + 7 * (len(sites_exo) - 1), dtype=np.float32)
    if prefix is not None:
        o[:OBS_DIM] = prefix
    o[OBS_INDEX["network"] : OBS_INDEX["rate_trend"] + 1] = sites_exo[0]
    for k, b in enumerate(sites_exo[1:]):
        o[OBS_DIM + 7 * k : OBS_DIM + 7 * (k + 1)] = b
    return o


def test_aggregations():
    norm = 8.0
    r = lambda x: squash_rate(x, norm)  # noqa: E731
    a = [0.2, 0.5, 0.1, r(4.0), r(5.0), r(2.0), 0.1]
    b = [0.7, 0.1, 0.3, r(8.0), r(6.0), r(6.0), 0.0]
    o = _obs([a, b])
    mx = aggregate_obs(o, 2, "max", norm)
    assert mx[OBS_INDEX["network"]] == pytest.approx(0.7)
    assert mx[OBS_INDEX["checkpoint"]] == pytest.approx(0.3)
    wt = aggregate_obs(o, 2, "weighted", norm)
    # weights: baselines 2 and 6 -> 0.25, 0.75
    assert wt[OBS_INDEX["network"]] == pytest.approx(0.25 * 0.2 + 0.75 * 0.7, rel=1e-5)
    assert unsquash_rate(wt[OBS_INDEX["rate_now"]], norm) == pytest.approx(7.0, rel=1e-4)
    sm = aggregate_obs(o, 2, "sum", norm)
    assert unsquash_rate(sm[OBS_INDEX["rate_forecast"]], norm) == pytest.approx(11.0, rel=1e-4)
    assert sm[OBS_INDEX["rate_trend"]] == pytest.approx((11.0 - 8.0) / 8.0, rel=1e-5)
    assert sm.shape == (OBS_DIM,)
    # one site: the observation itself
    assert np.array_equal(aggregate_obs(o[:OBS_DIM], 1, "sum", norm), o[:OBS_DIM])


def test_fleet_view_one_site_acts_as_the_agent():
    env = DiLoCoFleetEnv(fleet=FleetParams(sites=(SiteConfig(name="b"),), merge_seconds=8.0))
    a = run_episode(env, fleet_agent(OnlineForecastWA()), 4)
    from diloco_gym.envs.env import DiLoCoSyncEnv

    b = run_episode(DiLoCoSyncEnv(), OnlineForecastWA(), 4)
    assert a["merge_decisions"] == b["merge_decisions"]


def test_gate_is_the_busiest_site():
    gate = FleetView(PressureGate(0.6))
    env = DiLoCoFleetEnv()
    env.reset(seed=0)
    from diloco_gym.eval.rollout import attach_agent

    attach_agent(env, gate, 0)
    quiet = [0.1] * 3 + [0.3] * 4
    busy = [0.9] + [0.1] * 2 + [0.3] * 4
    assert gate.act(_obs([quiet, quiet, quiet, quiet])[None])[0] == 1
    assert gate.act(_obs([quiet, quiet, busy, quiet])[None])[0] == 0


def test_oracle_view_is_non_deployable_and_plans_on_summed_costs():
    v = fleet_agent(OfflineCalibratedOracle())
    assert isinstance(v, FleetOracleView) and not v.deployable
    env = DiLoCoFleetEnv()
    res = run_episode(env, v, 5)
    from diloco_gym.sim.schedules import optimal_schedule

    p = env.params
    best, _ = optimal_schedule(env.oracle_costs(), p.h_min, p.h_max, None)
    assert res["merge_decisions"] == list(best)


def test_deployable_view_refuses_an_oracle():
    with pytest.raises(ValueError, match="non-deployable"):
        FleetView(OfflineCalibratedOracle())


@pytest.mark.slow
def test_fleet_report_verdicts_and_determinism():
    cfg = FleetReportConfig(
        fleet=str(EXAMPLE), agents=["pressure-gate", "offline-oracle"], seeds=3, draws=50
    )
    a = run_fleet_report(cfg)
    b = run_fleet_report(cfg)
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
    sealed = run_fleet_report(FleetReportConfig(**kw))
    inproc = run_fleet_report(FleetReportConfig(**kw, in_process_agents=True))
    assert sealed["agent_sealing"].startswith("sealed")
    assert inproc["agent_sealing"].startswith("in-process")
    pd.testing.assert_frame_equal(sealed["rows"], inproc["rows"])
    assert "nonzero_units" in sealed["summary"].columns
