"""The calibration protocol, the matched-random wrapper and the report."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from protocol_helpers import high_load_regime
from scipy import stats

import diloco_gym
from diloco_gym.cli import main
from diloco_gym.envs.params import EnvParams
from diloco_gym.envs.schedule import schedule_summary
from diloco_gym.eval import protocol
from diloco_gym.eval.report import ReportConfig, run_protocol, write_report
from diloco_gym.eval.summary import holm
from diloco_gym.sim import schedules
from diloco_gym.sim.traces import Trace


def _small_env(**kw):
    """A tiny episode: 2 s merges, corridor [2, 4] decisions, 14 decisions."""
    gen = diloco_gym.get_regime("bursty")
    full = gen(np.random.default_rng(0))
    keep = full.arrival_s < 30.0
    tr = Trace(
        full.arrival_s[keep],
        full.prompt_tokens[keep],
        full.output_tokens[keep],
        30.0,
        network=full.network[:30],
        checkpoint=full.checkpoint[:30],
    )
    params = EnvParams(h_min_steps=16, h_max_steps=32, merge_seconds=2.0, **kw)
    return diloco_gym.DiLoCoSyncEnv(regime=tr, params=params)


@pytest.mark.slow
def test_matched_random_wrapper_is_uniform_and_feasible():
    env = _small_env()
    env.reset(seed=0)
    n = env.episode.n_decisions
    p = env.params
    m = 4
    support = schedules.brute_force_schedules(n, p.h_min, p.h_max, m)
    assert len(support) > 5
    wrapped = protocol.MatchedRandomDeferral(env, merges=m, draw_seed=1)
    counts = Counter()
    draws = 60 * len(support)
    for i in range(draws):
        wrapped.reset(seed=i)  # a fixed trace: every seed gives the same episode, a new draw
        while True:
            _, _, term, trunc, info = wrapped.step(1)  # the agent's action is ignored
            if term or trunc:
                break
        sched = tuple(info["episode_summary"]["merge_decisions"])
        assert len(sched) == m
        assert schedules.is_feasible(sched, n, p.h_min, p.h_max)
        counts[sched] += 1
    assert set(counts) <= set(support)
    obs = np.array([counts[s] for s in support])
    assert stats.chisquare(obs).pvalue > 0.001


def test_matched_random_wrapper_per_seed_budget():
    env = diloco_gym.DiLoCoSyncEnv(regime="bursty")
    wrapped = protocol.MatchedRandomDeferral(env, merges={4: 9, 5: 11})
    for seed, m in ((4, 9), (5, 11)):
        wrapped.reset(seed=seed)
        while True:
            *_, trunc, info = wrapped.step(0)
            if trunc:
                break
        assert info["episode_summary"]["merges"] == m
    with pytest.raises(KeyError, match="episode seed 6"):
        wrapped.reset(seed=6)


def test_envelope_draws_have_exact_budget_and_match_exact_replay():
    env = diloco_gym.DiLoCoSyncEnv(regime="bursty")
    env.reset(seed=2)
    ep, p, sc = env.episode, env.params, env.sidecar
    rng = np.random.default_rng(0)
    sch = schedules.sample_uniform(ep.n_decisions, p.h_min, p.h_max, 9, 50, rng)
    assert sch.shape == (50, 9)
    assert all(schedules.is_feasible(s, ep.n_decisions, p.h_min, p.h_max) for s in sch)
    exact = protocol.replay_many(ep, sch, p, sc)
    for i in range(5):
        ref = schedule_summary(ep, sch[i].tolist(), p, sc)["sync_excess_pct"]
        assert exact[i] == pytest.approx(ref, abs=1e-9)
    additive = ep.merge_cost[sch].sum(axis=1) * ep.pct_per_request
    assert np.abs(additive - exact).max() < 0.05  # measured: 0 on this episode
    env_a = protocol.envelope(ep, 9, 200, np.random.default_rng(1), p, sc)
    env_b = protocol.envelope(ep, 9, 200, np.random.default_rng(1), p, sc)
    assert np.array_equal(env_a, env_b) and env_a.shape == (200,)


def test_paired_test_exact_and_bootstrap():
    rng = np.random.default_rng(0)
    r = protocol.paired_test(np.array([1.0, 2.0, 3.0, 4.0, 5.0]), rng)
    assert r["p_value"] == pytest.approx(2 / 32)  # only all-plus and all-minus are as extreme
    assert r["ci_low"] <= 3.0 <= r["ci_high"]
    r = protocol.paired_test(np.array([1.0, -1.0, 1.0, -1.0]), rng)
    assert r["p_value"] == pytest.approx(1.0)
    big = protocol.paired_test(np.random.default_rng(3).normal(0.8, 1.0, 40), rng, n_flip=20000)
    assert 0 < big["p_value"] < 0.05


def _brute_force_sign_flip_p(diff: np.ndarray) -> float:
    """The definition: every one of the 2**n sign patterns, enumerated."""
    n = diff.size
    signs = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1) * 2 - 1
    return float(np.mean(np.abs(signs @ diff) / n >= abs(diff.mean()) - 1e-12))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 16, pytest.param(20, marks=pytest.mark.slow)])
def test_exact_sign_flip_p_equals_enumerating_every_pattern(n):
    rng = np.random.default_rng(n)
    cases = [
        rng.normal(0.3, 1.0, n),  # continuous
        rng.integers(-3, 4, n).astype(float),  # many ties at the observed statistic
        np.zeros(n),
        np.full(n, 0.7),
        rng.normal(0, 1, n) * 1e-9,
    ]
    for diff in cases:
        assert protocol._exact_sign_flip_p(diff, abs(diff.mean())) == _brute_force_sign_flip_p(
            diff
        ), diff


def test_gate_and_holm():
    assert protocol.gate_verdict("calibrated", -1.0, 0.01) == "placement gain"
    assert protocol.gate_verdict("calibrated", 1.0, 0.01) == "worse than matched random"
    assert protocol.gate_verdict("calibrated", -1.0, 0.2) == "tied with matched random"
    assert protocol.gate_verdict("uncalibrated", -1.0, 0.0) == "no claim (uncalibrated)"
    assert (
        protocol.gate_verdict("no measurable SLO effect", -1.0, 0.0) == "no claim (no SLO effect)"
    )
    assert np.allclose(holm(np.array([0.01, 0.04, 0.03])), [0.03, 0.06, 0.06])


@pytest.fixture(scope="module")
def reduced_report():
    config = ReportConfig(
        regimes=["ordinary", "pressure-heavy", "sync-heavy", "bursty"],
        agents=[
            "fixed-256",
            "fixed-512",
            "pressure-gate",
            "wa-diloco",
            "online-forecast",
            "offline-oracle",
        ],
        seeds=20,
        draws=200,
    )
    return run_protocol(config, progress=False)


@pytest.mark.slow
def test_report_reaches_the_papers_conclusions(reduced_report):
    s = reduced_report["summary"].set_index(["regime", "agent"])
    # ordinary and pressure-heavy: merges have no measurable real effect -> no SLO claim
    for regime in ("ordinary", "pressure-heavy"):
        assert (s.loc[regime]["verdict"] == "no claim (no SLO effect)").all()
    cal = reduced_report["calibration"].set_index("regime")
    assert abs(cal.loc["ordinary", "sim_p95_sync_ratio"] - 1.0) <= 0.05
    assert abs(cal.loc["ordinary", "sim_p95_high_low"] - 1.0) <= 0.05
    # pressure-heavy: no agent dominates (every agent's excess within 0.5 pp of the others)
    ph = s.loc["pressure-heavy"]["sync_excess_pct"]
    assert ph.max() - ph.min() < 0.5
    # steady sync-heavy: every deployable agent ties its matched random ...
    sh = s.loc["sync-heavy"]
    for agent in ("fixed-256", "fixed-512", "pressure-gate", "wa-diloco", "online-forecast"):
        assert sh.loc[agent, "verdict"] == "tied with matched random", agent
        assert sh.loc[agent, "p_holm"] > 0.05
    # ... while differences between agents follow their budgets
    assert sh.loc["wa-diloco", "sync_excess_pct"] < sh.loc["fixed-256", "sync_excess_pct"]
    assert sh.loc["wa-diloco", "sync_excess_pct"] < sh.loc["pressure-gate", "sync_excess_pct"]
    assert sh.loc["wa-diloco", "merges_per_hour"] < sh.loc["fixed-256", "merges_per_hour"]
    assert sh.loc["wa-diloco", "merges_per_hour"] < sh.loc["pressure-gate", "merges_per_hour"]
    # bursty: the oracle beats matched random and WA-DiLoCo; the online forecaster beats
    # its matched random at p < 0.05
    b = s.loc["bursty"]
    assert b.loc["offline-oracle", "verdict"] == "placement gain"
    assert b.loc["offline-oracle", "sync_excess_pct"] < b.loc["wa-diloco", "sync_excess_pct"]
    assert b.loc["online-forecast", "verdict"] == "placement gain"
    assert b.loc["online-forecast", "p_value"] < 0.05


@pytest.mark.slow
def test_report_files_and_overwrite_protection(reduced_report, tmp_path):
    out = tmp_path / "rep"
    write_report(reduced_report, out)
    for name in (
        "report.md",
        "results.csv",
        "report.json",
        "fig_bursty.png",
        "timeline_bursty.png",
    ):
        assert (out / name).stat().st_size > 0, name
    data = json.loads((out / "report.json").read_text())
    assert {r["verdict"] for r in data["summary"]} <= set(protocol.VERDICTS)
    assert "placement gain" in (out / "report.md").read_text()
    with pytest.raises(FileExistsError, match="--force"):
        write_report(reduced_report, out)
    write_report(reduced_report, out, force=True)


@pytest.mark.slow
def test_interrupted_report_leaves_no_files(reduced_report, tmp_path, monkeypatch):
    import diloco_gym.eval.report as rep

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(rep, "write_figures", boom)
    out = tmp_path / "rep"
    with pytest.raises(KeyboardInterrupt):
        write_report(reduced_report, out)
    assert list(tmp_path.iterdir()) == []


def test_cli_report_end_to_end(tmp_path, capsys):
    out = tmp_path / "r"
    argv = [
        "report",
        "--out",
        str(out),
        "--seeds",
        "2",
        "--regimes",
        "bursty",
        "--agents",
        "fixed-512",
        "--draws",
        "50",
        "--no-progress",
    ]
    assert main(argv) == 0
    assert (out / "report.md").exists() and (out / "results.csv").exists()
    assert "report written" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="already exists"):
        main(argv)
    with pytest.raises(SystemExit, match="valid regimes"):
        main(["report", "--out", str(tmp_path / "x"), "--regimes", "bursted"])
    with pytest.raises(SystemExit, match="valid agents"):
        main(["report", "--out", str(tmp_path / "x"), "--agents", "wa"])
    assert not (tmp_path / "x").exists()


def test_user_calibration_file_drives_the_report(tmp_path):
    """A live-style calibration file overrides the reference and its fitted sidecar is used."""
    from diloco_gym.eval.calibration import load_calibration

    path = tmp_path / "cal.json"
    path.write_text(
        json.dumps(
            {
                "source": "unit-test sidecar",
                "complete": False,
                "regimes": {"sync-heavy": {"p95_high_low": 1.0, "p95_sync_ratio": 2.5}},
                "fitted_sidecar": {"sync_slowdown": 1.5, "slots": 16.0},
            }
        )
    )
    cal = load_calibration(path)
    assert cal.measured("ordinary")["p95_sync_ratio"] == pytest.approx(1.0)  # reference kept
    assert cal.measured("bursty")["p95_sync_ratio"] == pytest.approx(2.5)  # follows sync-heavy
    assert cal.sidecar_for("bursty").sync_slowdown == 1.5
    assert cal.sidecar_for("ordinary") is None
    res = run_protocol(
        ReportConfig(
            regimes=["sync-heavy"], agents=["fixed-512"], seeds=2, draws=20, calibration=str(path)
        ),
        progress=False,
    )
    row = res["calibration"].iloc[0]
    assert row["sidecar"].startswith("fitted")
    assert row["sim_p95_sync_ratio"] > 2.0  # the fitted slowdown 1.5 was simulated
    out = write_report(res, tmp_path / "rep")
    assert "marked incomplete" in (out / "report.md").read_text()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"source": "x", "regimes": {}, "fitted_sidecar": {"slotz": 1}}))
    with pytest.raises(ValueError, match="bad.json: fitted_sidecar has unknown field"):
        load_calibration(bad)


def test_report_is_deterministic_and_independent_of_agent_order():
    a = run_protocol(
        ReportConfig(regimes=["bursty"], agents=["fixed-512", "wa-diloco"], seeds=3, draws=100),
        progress=False,
    )["rows"]
    b = run_protocol(
        ReportConfig(regimes=["bursty"], agents=["wa-diloco", "fixed-512"], seeds=3, draws=100),
        progress=False,
    )["rows"]
    key = ["agent", "seed"]
    a = a.sort_values(key).reset_index(drop=True)
    b = b.sort_values(key).reset_index(drop=True)
    import pandas as pd

    pd.testing.assert_frame_equal(a, b)


def test_report_on_a_trace_file(tmp_path):
    """--trace runs the same protocol on a replayed file, with its own timeline."""
    from diloco_gym.sim.loaders import save_native

    tr = diloco_gym.get_regime("bursty")(np.random.default_rng(5))
    path = tmp_path / "mytrace.csv"
    save_native(Trace(tr.arrival_s, tr.prompt_tokens, tr.output_tokens, tr.duration_s), path)
    res = run_protocol(
        ReportConfig(
            agents=["fixed-512", "online-forecast"],
            seeds=3,
            draws=50,
            trace=str(path),
            trace_format="native",
        ),
        progress=False,
    )
    assert set(res["summary"]["regime"]) == {"replay:mytrace"}
    assert res["calibration"].iloc[0]["measured_on"] == "sync-heavy"
    out = write_report(res, tmp_path / "rep")
    assert (out / "timeline_replay_mytrace.png").exists()
    assert (out / "fig_replay_mytrace.png").exists()


# ----------------------------------------------------------------- honest n and saturation
def test_min_achievable_p_and_units_needed():
    assert protocol.min_achievable_p(5) == pytest.approx(2 / 32)
    assert protocol.min_achievable_p(1) == 1.0
    assert protocol.min_achievable_p(30, n_flip=1000) == pytest.approx(1 / 1001)
    assert protocol.units_needed(0.05, 1) == 6  # 2/32 = 0.0625 is not below 0.05
    assert protocol.units_needed(0.05, 8) == 9  # 8 * 2/256 = 0.0625, 8 * 2/512 = 0.031
    # The bound is attained: all-negative differences on n units give exactly 2 / 2**n.
    for n in (3, 5, 9):
        r = protocol.paired_test(-np.arange(1.0, n + 1), np.random.default_rng(0))
        assert r["p_value"] == pytest.approx(r["min_p"]) == pytest.approx(2 / 2**n)
    with pytest.raises(ValueError, match="alpha"):
        protocol.units_needed(0.0)


def test_zero_differences_carry_no_evidence():
    """5 non-zero differences among 11 units: the exact p is at least 2/2**5 = 0.0625
    whatever their size, so the gate says inconclusive (counting the 11 units it would
    have said 'tied': 2/2**11 is far below 0.05)."""
    diff = np.array([-3.0, -2.0, -1.5, -1.0, -0.5] + [0.0] * 6)
    r = protocol.paired_test(diff, np.random.default_rng(0))
    assert r["n"] == 11 and r["nonzero"] == 5
    assert r["p_value"] == pytest.approx(2 / 32) == pytest.approx(r["min_p"])
    assert protocol.nonzero_units(np.array([0.0, 1e-13, -1e-13, 2e-12, -0.1])) == 2
    assert protocol.gate_verdict("calibrated", -1.6, r["p_value"], n_units=11) == (
        "tied with matched random"  # what counting every unit concluded
    )
    assert (
        protocol.gate_verdict("calibrated", -1.6, r["p_value"], n_units=11, n_nonzero=5)
        == "inconclusive (too few episodes)"
    )
    # Holm over 8 agents: 6 non-zero units give at best 8 * 2/64 = 0.25: inconclusive,
    # 9 give 8 * 2/512 = 0.031: the gate can decide.
    kw = {"n_units": 11, "n_tests": 8}
    assert protocol.gate_verdict("calibrated", -0.2, 0.25, n_nonzero=6, **kw).startswith("inc")
    assert protocol.gate_verdict("calibrated", -0.2, 0.25, n_nonzero=9, **kw).startswith("tied")


def test_gate_is_inconclusive_when_n_cannot_reach_alpha():
    # The oracle's -6.97 pp on 5 seeds: p = 0.0625 at best, so no verdict is possible.
    assert (
        protocol.gate_verdict("calibrated", -6.97, 0.0625, n_units=5)
        == "inconclusive (too few episodes)"
    )
    assert (
        protocol.gate_verdict("calibrated", 0.1, 0.8, n_units=5)
        == "inconclusive (too few episodes)"
    )
    # Holm over 8 agents: 8 units give at best 8 * 2/256 = 0.0625 -> still inconclusive.
    assert (
        protocol.gate_verdict("calibrated", 0.1, 0.9, n_units=8, n_tests=8)
        == "inconclusive (too few episodes)"
    )
    assert (
        protocol.gate_verdict("calibrated", 0.1, 0.9, n_units=9, n_tests=8)
        == "tied with matched random"
    )
    assert protocol.gate_verdict("calibrated", -1.0, 0.03, n_units=9, n_tests=8) == "placement gain"
    assert "inconclusive (too few episodes)" in protocol.VERDICTS


def test_gate_saturation():
    sat = protocol.SATURATION_PCT
    assert sat == 50.0
    assert (
        protocol.gate_verdict("calibrated", -5.0, 1e-6, n_units=20, no_sync_violation_pct=sat + 0.1)
        == "no claim (saturated)"
    )
    # At the threshold and below (pressure-heavy's 39.6 %) the test decides.
    assert (
        protocol.gate_verdict("calibrated", -5.0, 1e-6, n_units=20, no_sync_violation_pct=39.6)
        == "placement gain"
    )
    assert (
        protocol.gate_verdict("calibrated", -5.0, 1e-6, n_units=20, no_sync_violation_pct=sat)
        == "placement gain"
    )
    # The real sidecar's 'no effect' comes first; saturation explains an 'uncalibrated'.
    assert (
        protocol.gate_verdict("no measurable SLO effect", -5.0, 1e-6, no_sync_violation_pct=99.0)
        == "no claim (no SLO effect)"
    )
    assert (
        protocol.gate_verdict("uncalibrated", -5.0, 1e-6, no_sync_violation_pct=99.0)
        == "no claim (saturated)"
    )
    assert (
        protocol.gate_verdict(
            "calibrated", -5.0, 1e-6, no_sync_violation_pct=60.0, saturation_pct=70.0
        )
        == "placement gain"
    )
    assert "no claim (saturated)" in protocol.VERDICTS


def test_gate_inconclusive_overrides_a_pseudo_replicated_p():
    # 21 overlapping windows can give a tiny p, but only 3 of them are independent.
    assert (
        protocol.gate_verdict("calibrated", -3.0, 1e-4, n_units=3)
        == "inconclusive (too few episodes)"
    )


# --------------------------------------------------------------------------- exact scoring


def test_high_load_report_diff_equals_the_all_exact_computation(tmp_path):
    """With bursts well above capacity, the report's agent, matched-random and oracle
    columns (hence agent minus control) equal an independent all-exact recomputation:
    the env's own replay for the agent, whole-episode replays for every draw and the
    oracle's schedule."""
    from diloco_gym.agents.registry import make_agent
    from diloco_gym.eval.rollout import run_episode
    from diloco_gym.eval.units import trace_units
    from diloco_gym.sim.loaders import save_native
    from diloco_gym.sim.regimes import REGIMES

    tr = high_load_regime(24.0)(np.random.default_rng(11))
    path = tmp_path / "hot.csv"
    save_native(Trace(tr.arrival_s, tr.prompt_tokens, tr.output_tokens, tr.duration_s), path)
    config = ReportConfig(
        agents=["fixed-256", "wa-diloco", "pressure-gate"],
        seeds=2,
        draws=120,
        trace=str(path),
        trace_format="native",
    )
    res = run_protocol(config, progress=False)
    rows = res["rows"]
    assert rows["additive_exact_gap_pp"].max() > 0.5  # additive scoring would be biased
    assert (rows["scoring"] == protocol.SCORING_EXACT).all()
    assert (rows["oracle_schedule"] == protocol.ORACLE_BOUND).all()
    units, _ = trace_units(config, REGIMES[config.trace_sidecar].sidecar)
    envs = {u.seed: u.env for u in units}  # one episode per window
    improved: list[float] = []
    for _, r in rows.iterrows():
        env = envs[int(r["seed"])]
        p, sc = env.params, env.sidecar
        out = run_episode(env, make_agent(r["agent"]), int(r["seed"]))
        ep = env.episode
        m = int(out["merges"])
        assert m == r["merges"]
        draws = schedules.sample_uniform(
            ep.n_decisions,
            p.h_min,
            p.h_max,
            m,
            config.draws,
            np.random.default_rng([int(r["seed"]), m, 7]),
        )
        control = protocol.replay_full(ep, draws, p, sc)
        orc, _ = schedules.optimal_schedule(ep.merge_cost, p.h_min, p.h_max, m)
        additive_opt = protocol.replay_full(ep, orc[None, :], p, sc)[0]
        # The oracle column is the best exact schedule found (local search from the
        # additive optimum): at most the additive optimum's replay, and its own schedule's
        # whole-episode replay.
        best = protocol.oracle_score(ep, m, p, sc)
        oracle = protocol.replay_full(ep, best["schedule"][None, :], p, sc)[0]
        assert oracle <= additive_opt + 1e-9
        improved.append(additive_opt - oracle)
        assert r["sync_excess_pct"] == pytest.approx(out["sync_excess_pct"], abs=1e-9)
        assert r["matched_random_mean"] == pytest.approx(control.mean(), abs=1e-9)
        assert r["matched_random_p95"] == pytest.approx(np.percentile(control, 95), abs=1e-9)
        assert r["oracle_same_budget_pct"] == pytest.approx(oracle, abs=1e-9)
        assert (r["sync_excess_pct"] - r["matched_random_mean"]) == pytest.approx(
            out["sync_excess_pct"] - control.mean(), abs=1e-9
        )
    assert max(improved) > 0.0  # the search found better exact schedules here
    s = res["summary"]
    assert (s["additive_exact_gap_pp"] > 0).all()
    md = __import__("diloco_gym.eval.report", fromlist=["render_markdown"]).render_markdown(res, [])
    assert "Largest additive-exact gap over all scored schedules" in md
    assert "upper bound" in md


def test_an_uncertain_calibration_makes_no_claim():
    """A live calibration whose interval straddles the transfer verdict supports no claim,
    whatever the data (it is not treated as calibrated)."""
    assert (
        protocol.gate_verdict("uncertain", -5.0, 1e-6, n_units=20)
        == "no claim (calibration uncertain)"
    )
    assert "no claim (calibration uncertain)" in protocol.VERDICTS
    from diloco_gym.eval import calibration as cal

    sim = {"p95_high_low": 1.0, "p95_sync_ratio": 1.55, "pressure_latency_corr": 0.0}
    measured = {"p95_high_low": 1.0, "p95_sync_ratio": 1.55, "p95_sync_ratio_ci": [0.9, 3.0]}
    interval = cal.measured_intervals(measured)
    assert cal.transfer_verdict(sim, measured, interval=interval) == "uncertain"
    assert cal.transfer_verdict(sim, measured) == "calibrated"


@pytest.mark.parametrize("n_flip", [1, 4095, 4096, 10_001])
def test_monte_carlo_blocks_draw_what_one_draw_gives(n_flip):
    """The Monte Carlo test's sign patterns drawn block by block: the same count as one
    ``(n_flip, n)`` draw, and the generator left in the same state (the bootstrap after it
    draws the same resamples)."""
    for n, seed in ((21, 0), (37, 1), (100, 2)):
        diff = np.random.default_rng(seed).normal(0.1, 1.0, n)
        obs = abs(diff.mean())
        one, blocks = np.random.default_rng([seed, 9]), np.random.default_rng([seed, 9])
        signs = one.choice([-1.0, 1.0], size=(n_flip, n))
        want = int(np.sum(np.abs(signs @ diff) / n >= obs - 1e-12))
        assert protocol._monte_carlo_hits(diff, obs, blocks, n_flip) == want
        assert one.bit_generator.state == blocks.bit_generator.state
    r = protocol.paired_test(diff, np.random.default_rng(4), n_flip=5000)
    signs = np.random.default_rng(4).choice([-1.0, 1.0], size=(5000, 100))
    hits = np.sum(np.abs(signs @ diff) / 100 >= abs(diff.mean()) - 1e-12)
    assert r["p_value"] == float((hits + 1) / 5001)


def test_score_episode_with_a_shared_control_is_the_same():
    """A control drawn once (matched_control) and passed to score_episode gives exactly
    what score_episode draws itself from the same generator; a control of another shape
    is refused."""
    env = diloco_gym.DiLoCoSyncEnv(regime="sync-heavy")
    env.reset(seed=5)
    ep, p = env.episode, env.params
    scorer = protocol.EpisodeScorer(ep, p, env.sidecar)
    counts = protocol.counts_for(ep.n_decisions, p, 40)
    agent = schedules.sample_uniform(
        ep.n_decisions, p.h_min, p.h_max, 11, 1, np.random.default_rng(8)
    )[0]
    alone = protocol.score_episode(scorer, agent, 60, np.random.default_rng([5, 11, 7]), counts)
    control = protocol.matched_control(scorer, 11, 60, np.random.default_rng([5, 11, 7]), counts)
    assert control.schedules.shape == (60, 11)
    unused = np.random.default_rng(0)
    shared = protocol.score_episode(scorer, agent, 60, unused, counts, control=control)
    assert shared == alone
    assert unused.bit_generator.state == np.random.default_rng(0).bit_generator.state
    with pytest.raises(ValueError, match="60 schedules of 10 merges"):
        protocol.score_episode(scorer, agent[:10], 60, unused, counts, control=control)


def test_counts_for_keeps_the_tables_it_built():
    """``counts_for`` gives the same table object for the same length, corridor and rows
    (every unit of a run reads one), equal to a freshly built one; another key, another."""
    p = EnvParams()
    a = protocol.counts_for(535, p, 40)
    assert protocol.counts_for(535, p, 40) is a
    assert protocol.counts_for(535, p, 41) is not a
    fresh = schedules.completion_table(535, p.h_min, p.h_max, 40)
    assert (a.n, a.h_min, a.h_max, a.m_max) == (fresh.n, fresh.h_min, fresh.h_max, fresh.m_max)
    np.testing.assert_array_equal(a.lo, fresh.lo)
    np.testing.assert_array_equal(a.hi, fresh.hi)
    for got, want in zip(a.rows, fresh.rows, strict=True):
        assert got.tobytes() == want.tobytes()
