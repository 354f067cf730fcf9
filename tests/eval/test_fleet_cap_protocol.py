"""The fleet report under a per-site serving cap (diloco_gym/eval/fleet_cap.py): matched
random respects the cap, the rejection bound is a one-line error, the report shows each
site's excess and the cap's counters, the oracle is labelled uncapped."""

from __future__ import annotations

import json

import numpy as np
import pytest

from diloco_gym.envs import fleet_cap as env_cap
from diloco_gym.envs.fleet import DiLoCoFleetEnv
from diloco_gym.eval import fleet_cap, protocol
from diloco_gym.eval.fleet import FleetReportConfig, FleetScorer, write_fleet_report
from diloco_gym.eval.report import run_protocol
from diloco_gym.sim.fleet import FleetParams, SiteConfig
from diloco_gym.sim.limits import LimitError

CAP = 12.0
FLEET_TOML = """[fleet]
site_cap_pp = {cap}

[[site]]
name = "calm"
regime = "ordinary"

[[site]]
name = "busy"
regime = "bursty"
"""


def _capped_env(cap: float = CAP) -> DiLoCoFleetEnv:
    sites = (SiteConfig(name="calm", regime="ordinary"), SiteConfig(name="busy", regime="bursty"))
    return DiLoCoFleetEnv(FleetParams(sites=sites, site_cap_pp=cap))


def _replay(env: DiLoCoFleetEnv, seed: int, schedule) -> dict:
    """Run ``schedule`` through the env: launch exactly at its decisions."""
    want = {int(d) for d in schedule}
    env.reset(seed=seed)
    while True:
        _, _, _, trunc, info = env.step(int(env.decision in want))
        if trunc:
            return info["episode_summary"]


def _always(env: DiLoCoFleetEnv, seed: int) -> dict:
    env.reset(seed=seed)
    while True:
        _, _, _, trunc, info = env.step(1)
        if trunc:
            return info["episode_summary"]


def test_matched_random_under_the_cap_never_breaks_it():
    """Every kept schedule respects the cap's rule, and the env launches it as drawn (the
    cap vetoes none of its syncs); the uncapped sampler would have broken the cap (the
    acceptance is below 1), so the rejection does work."""
    env = _capped_env()
    seed = 4
    s = _always(env, seed)
    m = int(s["merges"])
    ep = env.episode
    scorer = FleetScorer(ep, env.params, env.setup.sidecars)
    check = fleet_cap.cap_check(env)
    assert check is not None
    control, acceptance = fleet_cap.capped_control(
        scorer, m, 60, np.random.default_rng([seed, m, 7]), None, check
    )
    assert control.schedules.shape == (60, m)
    assert 0.0 < acceptance < 1.0
    ok, forced = env_cap.schedules_respect_cap(
        control.schedules, ep.site_costs, check.lags, check.caps, check.h_max
    )
    assert ok.all()
    for row, n_forced in zip(control.schedules[:4], forced[:4], strict=True):
        got = _replay(env, seed, row)
        assert got["merge_decisions"] == row.tolist()
        assert got["cap_vetoed_launches"] == 0
        assert got["cap_overridden_syncs"] == n_forced
    # the scores are the scorer's for those schedules
    assert np.array_equal(control.scores.exact_pct, scorer.score(control.schedules).exact_pct)
    out = protocol.score_episode(scorer, s["merge_decisions"], 60, None, None, control)
    assert out["matched_random_mean"] == pytest.approx(float(control.scores.exact_pct.mean()))


def test_the_rejection_bound_is_a_one_line_error(monkeypatch):
    env = _capped_env(8.0)
    s = _always(env, 1)
    scorer = FleetScorer(env.episode, env.params, env.setup.sidecars)
    check = fleet_cap.cap_check(env)
    assert check is not None
    monkeypatch.setenv("DILOCO_GYM_MAX_CAP_REJECTIONS", "1")
    with pytest.raises(LimitError) as exc:
        fleet_cap.capped_control(
            scorer, int(s["merges"]), 200, np.random.default_rng(0), None, check
        )
    msg = str(exc.value)
    assert "\n" not in msg
    assert "site_cap_pp = 8" in msg and "DILOCO_GYM_MAX_CAP_REJECTIONS" in msg
    assert f"seed {env.episode.seed}" in msg


def test_no_cap_no_check():
    assert fleet_cap.cap_check(DiLoCoFleetEnv()) is None


def test_capped_report_shows_each_site_and_the_cap(tmp_path):
    path = tmp_path / "capped.toml"
    path.write_text(FLEET_TOML.format(cap=CAP))
    cfg = FleetReportConfig(
        fleet=str(path),
        agents=["pressure-gate", "online-forecast"],
        seeds=2,
        draws=20,
        in_process_agents=True,
    )
    result = run_protocol(cfg)
    rows, summary = result["rows"], result["summary"]
    for col in (
        "cap_masked_decisions",
        "cap_overridden_syncs",
        "cap_vetoed_launches",
        "matched_random_cap_acceptance",
        "site_busy_cap_used_pp",
        "site_calm_cap_used_pp",
        "site_busy_sync_excess_pct",
    ):
        assert col in rows.columns, col
    assert (rows["matched_random_cap_acceptance"] > 0).all()
    for col in ("site_busy_sync_excess_pct", "site_calm_sync_excess_pct", "episodes_over_cap"):
        assert col in summary.columns, col
    busy = rows[rows["agent"] == "pressure-gate"]["site_busy_sync_excess_pct"].mean()
    assert summary.set_index("agent").loc["pressure-gate", "site_busy_sync_excess_pct"] == (
        pytest.approx(busy)
    )
    out = write_fleet_report(result, tmp_path / "out", command="test")
    md = (out / "report.md").read_text()
    assert "oracle (uncapped) pp" in md and "site_cap_pp = 12" in md
    assert "## Sync-excess per site" in md and "forced syncs over cap" in md
    doc = json.loads((out / "report.json").read_text())
    assert doc["fleet"]["site_cap_pp"] == CAP
    assert "site_busy_sync_excess_pct" in doc["summary"][0]


def test_uncapped_report_has_the_per_site_table_and_no_cap_columns(tmp_path):
    path = tmp_path / "free.toml"
    path.write_text(FLEET_TOML.replace("site_cap_pp = {cap}\n", ""))
    cfg = FleetReportConfig(
        fleet=str(path), agents=["pressure-gate"], seeds=2, draws=10, in_process_agents=True
    )
    result = run_protocol(cfg)
    assert not any(c.startswith("cap_") for c in result["rows"].columns)
    assert "episodes_over_cap" not in result["summary"].columns
    md = (write_fleet_report(result, tmp_path / "out") / "report.md").read_text()
    assert "## Sync-excess per site" in md and "| oracle pp |" in md
    assert "oracle (uncapped)" not in md and "site_cap_pp" not in md


def test_the_cap_with_changing_links_replays_as_the_env_launched():
    """With changing links each sync settles after its own link state's window: the
    protocol's replay of the cap (each decision's settle lags) judges the env's schedules
    as the env did, and the capped control's schedules launch in the env as drawn."""
    sites = (SiteConfig(name="calm", regime="ordinary"), SiteConfig(name="busy", regime="bursty"))
    env = DiLoCoFleetEnv(
        FleetParams(sites=sites, site_cap_pp=CAP, link_levels=(1.0, 0.4), link_dwell_s=20.0)
    )
    check = fleet_cap.cap_check(env)
    assert check is not None
    for seed in (0, 3):
        s = _always(env, seed)
        ep = env.episode
        lags = check.lags_for(ep)
        assert lags.shape == (2, ep.n_decisions) and len(np.unique(lags[1])) > 1
        sched = np.array([s["merge_decisions"]])
        ok, forced = env_cap.schedules_respect_cap(
            sched, ep.site_costs, lags, check.caps, check.h_max
        )
        assert ok[0] and forced[0] == s["cap_overridden_syncs"]
        assert s["cap_masked_decisions"] > 0  # the cap binds
    scorer = FleetScorer(ep, env.params, env.setup.sidecars)
    m = int(s["merges"])
    control, acceptance = fleet_cap.capped_control(
        scorer, m, 20, np.random.default_rng([3, m, 7]), None, check
    )
    assert 0.0 < acceptance <= 1.0
    _, forced = env_cap.schedules_respect_cap(
        control.schedules, ep.site_costs, lags, check.caps, check.h_max
    )
    for row, n_forced in zip(control.schedules[:3], forced[:3], strict=True):
        got = _replay(env, 3, row)
        assert got["merge_decisions"] == row.tolist()
        assert got["cap_vetoed_launches"] == 0
        assert got["cap_overridden_syncs"] == n_forced


def test_the_rejection_stops_early_only_when_the_draws_left_cannot_do():
    from diloco_gym.eval.fleet_cap import rejection_hopeless

    # nothing drawn yet, or every draw kept so far: never hopeless before the limit
    assert not rejection_hopeless(0, 0, 200, 2_000_000)
    assert not rejection_hopeless(200, 200, 200, 200)
    assert not rejection_hopeless(10, 10, 200, 200)  # all kept: the rest may be too
    assert rejection_hopeless(9, 10, 200, 200)  # one rejected, none to spare
    assert rejection_hopeless(150, 1_000, 200, 1_000)  # the limit, short of the draws
    # the case docs/fleet.md reports: 33 kept of 2,000,000 at 200 draws and 10,000 per
    # kept one; at that acceptance a fifth of the draws rules it out, a tenth does not
    assert rejection_hopeless(7, 400_000, 200, 2_000_000)
    assert not rejection_hopeless(3, 200_000, 200, 2_000_000)
    # an acceptance of 0.2 reaches 200 kept in 2,000 draws: never stopped on the way
    rng = np.random.default_rng(0)
    kept = drawn = 0
    while kept < 200:
        assert not rejection_hopeless(kept, drawn, 200, 2_000)
        batch = rng.random(200) < 0.2
        kept, drawn = kept + int(batch.sum()), drawn + 200


def test_the_rejection_error_says_which_limit_would_do(monkeypatch):
    from diloco_gym.eval.fleet_cap import rejection_error

    msg = rejection_error("schedules of 9 syncs", 6.0, 33, 2_000_000, 200, 12)
    assert "\n" not in msg and "seed 12" in msg and "acceptance 1.7e-05" in msg
    assert (
        "about 12,121,212 draws" in msg
        and "set DILOCO_GYM_MAX_CAP_REJECTIONS to at least 60,607" in msg
    )
    assert "far more" in rejection_error("schedules of 9 syncs", 6.0, 0, 1_000, 200, 1)
