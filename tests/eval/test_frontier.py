"""The frontier leaderboard (diloco_gym.eval.frontier), the budget-aware heuristics and the CLI."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import diloco_gym
from diloco_gym.agents.heuristics import BudgetPace, FixedBudget, OnlineForecastBudget
from diloco_gym.agents.registry import BUDGETED, is_budget_aware, make_agent
from diloco_gym.cli import main
from diloco_gym.eval import frontier as fr
from diloco_gym.eval import protocol
from diloco_gym.eval.output_dir import MARKER
from diloco_gym.eval.rollout import attach_agent, run_episode
from diloco_gym.eval.summary import holm as fr_holm
from diloco_gym.sim import schedules


# ----------------------------------------------------------------- the frontier's rows
@pytest.fixture(scope="module")
def small():
    cfg = fr.FrontierConfig(
        regimes=["bursty"],
        budgets_per_hour=[72.0],
        seeds=2,
        seed0=3,
        draws=40,
        budget_agents=["online-forecast-budget", "wa-diloco"],
        free_agents=["fixed-512"],
    )
    return fr.run_frontier(cfg, progress=False)


def test_rows_equal_independent_computations(small):
    """Agent, matched random and oracle of each row, recomputed without the scorer: the
    slow whole-episode replay (protocol.replay_full), the sampler and the DP directly."""
    rows = small["rows"]
    assert len(rows) == 2 * (1 + 2)  # seeds x (free agent + budget agents at one budget)
    for r in rows.itertuples():
        budget = None if r.mode == "free" else int(r.budget)
        env = diloco_gym.DiLoCoSyncEnv(regime="bursty", merge_budget=budget)
        res = run_episode(env, make_agent(r.agent), r.seed)
        ep, p = env.episode, env.params
        m = len(res["merge_decisions"])
        assert m == r.merges and (budget is None or m == budget == 12)
        # Two replays can disagree by a request whose latency is within rounding of the
        # SLO (protocol.EpisodeScorer's docstring): one request's share is the tolerance.
        tol = ep.pct_per_request + 1e-9
        agent = protocol.replay_full(ep, np.array([res["merge_decisions"]]), p, env.sidecar)
        assert r.sync_excess_pct == pytest.approx(agent[0], abs=tol)
        draws = schedules.sample_uniform(
            ep.n_decisions, p.h_min, p.h_max, m, 40, np.random.default_rng([r.seed, m, 7])
        )
        assert np.all(np.diff(draws, axis=1) >= p.h_min)
        control = protocol.replay_full(ep, draws, p, env.sidecar)
        assert r.matched_random_mean == pytest.approx(control.mean(), abs=tol)
        sched, total = schedules.optimal_schedule(ep.merge_cost, p.h_min, p.h_max, m)
        assert r.oracle_additive_pct == pytest.approx(total * ep.pct_per_request, rel=1e-12)
        oracle = protocol.replay_full(ep, sched[None, :], p, env.sidecar)
        assert r.oracle_same_budget_pct == pytest.approx(oracle[0], abs=tol)
        assert r.oracle_same_budget_pct <= r.matched_random_mean
        # The curve at the row's budget is the same envelope and the same oracle.
        cv = small["curves"]
        c = cv[(cv["seed"] == r.seed) & (cv["budget"] == m)]
        assert len(c) == 1
        assert c["matched_random_mean"].iloc[0] == r.matched_random_mean
        assert c["oracle_pct"].iloc[0] == r.oracle_same_budget_pct


def test_held_column_and_curves_cover_every_feasible_budget(small):
    rows = small["rows"]
    held = dict(zip(rows["agent"] + "/" + rows["mode"], rows["held"], strict=True))
    assert held == {
        "fixed-512/free": "free",
        "online-forecast-budget/budget": "budget-aware",
        "wa-diloco/budget": "mask",
    }
    lo, hi = schedules.budget_range(517, 16, 64)
    assert sorted(small["curves"]["budget"].unique()) == list(range(lo, hi + 1))
    # Oracle never above random placement at any budget (means over seeds).
    c = small["curves"].groupby("budget")[["matched_random_mean", "oracle_pct"]].mean()
    assert (c["oracle_pct"] <= c["matched_random_mean"]).all()


def test_frontier_is_deterministic(small):
    cfg = fr.FrontierConfig(**{k: v for k, v in small["config"].items()})
    again = fr.run_frontier(cfg, progress=False)
    pd.testing.assert_frame_equal(again["rows"], small["rows"])
    pd.testing.assert_frame_equal(again["budgets"], small["budgets"])


def test_config_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown regime"):
        fr.FrontierConfig(regimes=["burst"])
    with pytest.raises(ValueError, match="seeds must be >= 2"):
        fr.FrontierConfig(seeds=1)
    with pytest.raises(ValueError, match="positive numbers of merges per hour"):
        fr.FrontierConfig(budgets_per_hour=[60.0, -1.0])
    with pytest.raises(ValueError, match="each agent once"):
        fr.FrontierConfig(budget_agents=["fixed-budget", "fixed-budget"])
    with pytest.raises(ValueError, match="budgets given more than once: 60 merges/h"):
        fr.FrontierConfig(budgets_per_hour=[60.0, 72.0, 60])
    cfg = fr.FrontierConfig(
        regimes=["bursty"],
        budgets_per_hour=[200.0],
        seeds=2,
        draws=5,
        budget_agents=["fixed-budget"],
        free_agents=["fixed-512"],
    )
    with pytest.raises(ValueError, match=r"200 merges/h is 33 merges .* feasible 8\.\.32"):
        fr.run_frontier(cfg, progress=False)
    cfg = fr.FrontierConfig(
        regimes=["bursty"],
        budgets_per_hour=[60.0, 61.0],
        seeds=2,
        draws=5,
        budget_agents=["fixed-budget"],
        free_agents=["fixed-512"],
    )
    with pytest.raises(ValueError, match="round to the same merges per episode"):
        fr.run_frontier(cfg, progress=False)
    cfg = fr.FrontierConfig(
        regimes=["bursty"], seeds=2, draws=5, free_agents=["online-forecast-budget"]
    )
    with pytest.raises(ValueError, match="budget-aware agent.*need a merge budget"):
        fr.run_frontier(cfg, progress=False)


# ----------------------------------------------------------------- budget-aware agents
@pytest.mark.parametrize("name", list(BUDGETED))
def test_budget_aware_agents_read_their_budget_exactly(name):
    """What BudgetPace infers from each observation (episode length, decision, gap, merges
    left) equals the env's own state at every decision of an episode."""
    env = diloco_gym.DiLoCoSyncEnv(regime="bursty", merge_budget=12)
    agent = make_agent(name)
    assert is_budget_aware(agent)
    obs, _ = env.reset(seed=4)
    attach_agent(env, agent, 4)
    pace = BudgetPace(env.params)
    n = env.episode.n_decisions
    seen = 0
    while True:
        s = pace.read(obs[None])
        assert s["n"][0] == n
        assert s["d"][0] == env.decision
        assert s["merges"][0] == len(env.merges)
        assert s["m_left"][0] == 12 - len(env.merges)
        assert s["last"][0] == (env.merges[-1] if env.merges else 0)
        seen += 1
        obs, _, _, trunc, _ = env.step(int(agent.predict(obs)[0]))
        if trunc:
            break
    assert seen > 100


def _forced(agent_name: str, m: int, seeds) -> tuple[list[int], list[int]]:
    """Merges per episode, and the merges the env made although the agent asked to defer
    (with skip_forced=False the env asks at every decision and reports overrides): the
    corridor's forced merges at H_max and the budget mask's."""
    env = diloco_gym.DiLoCoSyncEnv(regime="bursty", merge_budget=m, skip_forced=False)
    agent = make_agent(agent_name)
    merges, forced = [], []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        ctx = attach_agent(env, agent, seed)
        n_forced = 0
        while True:
            a = int(agent.predict(obs)[0])
            obs, _, _, trunc, info = env.step(a)
            n_forced += int(info["action_overridden"] and info["merged"])
            if trunc:
                break
            ctx._set_mask(env.action_masks())
        merges.append(info["merges"])
        forced.append(n_forced)
    return merges, forced


@pytest.mark.parametrize("m", [8, 12, 16, 24])
def test_budget_aware_agents_spend_exactly_their_budget(m):
    seeds = range(1000, 1003)
    for name in BUDGETED:
        merges, forced = _forced(name, m, seeds)
        assert merges == [m] * len(seeds)
        if m >= 12:
            # Their own choices spend the budget: at most a couple of merges per episode
            # are forced on them (fixed-budget's last merge falls at the end, by its
            # definition H = n / M).
            assert max(forced) <= 2, (name, forced)
    if m == 24:
        # ... where the forecaster that ignores the budget is overridden again and again.
        _, plain = _forced("online-forecast", m, seeds)
        assert min(plain) >= 5


def test_budget_aware_agents_need_a_budget():
    env = diloco_gym.DiLoCoSyncEnv(regime="bursty")
    for cls in (FixedBudget, OnlineForecastBudget):
        with pytest.raises(ValueError, match="needs the env's merge budget"):
            run_episode(env, cls(), seed=0)


def test_budget_agents_are_deterministic_and_feasible():
    for name in BUDGETED:
        a = run_episode(
            diloco_gym.DiLoCoSyncEnv(regime="non-periodic", merge_budget=16),
            make_agent(name),
            seed=5,
        )
        b = run_episode(
            diloco_gym.DiLoCoSyncEnv(regime="non-periodic", merge_budget=16),
            make_agent(name),
            seed=5,
        )
        assert a == b
        assert schedules.is_feasible(a["merge_decisions"], 517, 16, 64)


def test_fixed_budget_merges_at_the_budget_interval():
    env = diloco_gym.DiLoCoSyncEnv(regime="sync-heavy", merge_budget=16)
    res = run_episode(env, make_agent("fixed-budget"), seed=1)
    gaps = np.diff([0] + res["merge_decisions"])
    # H = 517 / 16 = 32.3 decisions -> every merge but the mask-placed last one at 33.
    assert list(gaps[:-1]) == [33] * 15


# ----------------------------------------------------------------- statistics, by hand
def _rows(
    values: dict[tuple[str, float], np.ndarray], random: float = 10.0, oracle: float = 2.0
) -> pd.DataFrame:
    out = []
    for (agent, per_hour), v in values.items():
        for seed, x in enumerate(v):
            out.append(
                {
                    "regime": "r",
                    "agent": agent,
                    "mode": "budget",
                    "held": "budget-aware",
                    "deployable": True,
                    "budget_per_hour": per_hour,
                    "budget": per_hour / 6,
                    "seed": seed,
                    "merges": per_hour / 6,
                    "merges_per_hour": per_hour,
                    "sync_excess_pct": float(x),
                    "matched_random_mean": random,
                    "oracle_same_budget_pct": oracle,
                    "no_sync_violation_pct": 5.0,
                }
            )
    return pd.DataFrame(out)


def test_gap_captured_by_hand():
    rng = np.random.default_rng(0)
    g = fr.gap_captured(np.full(10, 6.0), np.full(10, 10.0), np.full(10, 2.0), rng)
    assert g == {"gap": 0.5, "ci_low": 0.5, "ci_high": 0.5}
    a = np.array([4.0, 8.0, 6.0, 6.0])
    g = fr.gap_captured(a, np.full(4, 10.0), np.full(4, 2.0), rng)
    assert g["gap"] == pytest.approx(0.5)
    assert 0.25 <= g["ci_low"] < 0.5 < g["ci_high"] <= 0.75
    # The oracle no better than random: undefined, not 0 or infinite.
    g = fr.gap_captured(a, np.full(4, 2.0), np.full(4, 2.0), rng)
    assert np.isnan(g["gap"]) and np.isnan(g["ci_low"])
    with pytest.raises(ValueError, match="equal-length"):
        fr.gap_captured(a, a[:3], a, rng)


def test_dominance_on_a_hand_made_table():
    rng = np.random.default_rng(5)
    base = {60.0: 8.0 + rng.normal(0, 0.3, 10), 96.0: 9.0 + rng.normal(0, 0.3, 10)}
    values = {}
    for b, v in base.items():
        values[("A", b)] = v - 1.0  # lower than B at both budgets, in every seed
        values[("B", b)] = v
        values[("C", b)] = v - 1.0 if b == 60.0 else v + 1.0  # crosses B
        values[("D", b)] = v + 1e-3 * (-1) ** np.arange(10)  # B up to noise
    rows = _rows(values)
    pair = fr.pairwise_stats(rows, 0.05)
    assert set(pair["holm_family"]) == {6}
    ab = pair[(pair["agent_a"] == "A") & (pair["agent_b"] == "B")]
    assert (ab["p_value"] == 2 / 2**10).all() and ab["significant"].all()
    dom = fr.dominance(pd.DataFrame(), pair, 0.05)
    rel = {(r.agent_a, r.agent_b): r.relation for r in dom.itertuples()}
    assert rel[("A", "B")] == "dominates"
    assert rel[("A", "D")] == "dominates"
    assert rel[("B", "C")] == "no dominance (order changes across budgets)"
    assert rel[("A", "C")] == "dominates"  # equal at 60 (no higher), lower at 96
    assert rel[("B", "D")] == "no dominance (no significant difference)"
    assert fr.undominated(dom) == ["A"]
    # The same table on 4 seeds: no test can reach 0.05 after Holm over 6 pairs.
    few = rows[rows["seed"] < 4]
    dom4 = fr.dominance(pd.DataFrame(), fr.pairwise_stats(few, 0.05), 0.05)
    assert set(dom4["relation"]) == {"inconclusive (too few episodes)"}
    # ... and 'inconclusive' is never reported as a tie.
    assert not dom4["relation"].str.contains("tie").any()


def test_budget_stats_by_hand():
    values = {
        ("A", 60.0): np.full(10, 6.0) + np.linspace(-0.1, 0.1, 10),
        ("B", 60.0): np.full(10, 10.0) + np.linspace(-0.1, 0.1, 10)[::-1] * 0,
    }
    b = fr.budget_stats(_rows(values), {"r": "calibrated"}, 0.05)
    a = b[b["agent"] == "A"].iloc[0]
    assert a["gap_captured"] == pytest.approx(0.5)
    assert a["verdict"] == "placement gain" and a["holm_family"] == 2
    assert a["p_holm"] == pytest.approx(2 * 2 / 2**10)
    bb = b[b["agent"] == "B"].iloc[0]
    assert bb["gap_captured"] == pytest.approx(0.0)
    # B equals matched random exactly on every seed: no unit carries evidence, so the
    # gate cannot tell anything (a tie needs units that could have shown a difference).
    assert bb["nonzero_units"] == 0
    assert bb["verdict"] == "inconclusive (too few episodes)"
    noisy = {**values, ("B", 60.0): np.full(10, 10.0) + np.array([0.05, -0.05] * 5)}
    bn = fr.budget_stats(_rows(noisy), {"r": "calibrated"}, 0.05)
    assert bn[bn["agent"] == "B"].iloc[0]["verdict"] == "tied with matched random"
    b4 = fr.budget_stats(_rows(values).query("seed < 5"), {"r": "calibrated"}, 0.05)
    assert set(b4["verdict"]) == {"inconclusive (too few episodes)"}


def test_budget_stats_holm_across_settings():
    """One Holm family per budget by default; --holm-across-settings makes it every
    regime x budget x agent row, and p_holm_all_settings is that correction either way."""
    rng = np.random.default_rng(5)
    values = {
        (agent, b): np.full(10, 9.0) + rng.normal(0.0, 0.6, 10)
        for agent in ("A", "B")
        for b in (48.0, 96.0)
    }
    per = fr.budget_stats(_rows(values), {"r": "calibrated"}, 0.05)
    allf = fr.budget_stats(_rows(values), {"r": "calibrated"}, 0.05, across_settings=True)
    assert set(per["holm_family"]) == {2} and set(allf["holm_family"]) == {4}
    expect_all = fr_holm(per["p_value"].to_numpy())
    assert per["p_holm_all_settings"].to_numpy() == pytest.approx(expect_all)
    assert allf["p_holm"].to_numpy() == pytest.approx(expect_all)
    for b in (48.0, 96.0):
        g = per[per["budget_per_hour"] == b]
        assert g["p_holm"].to_numpy() == pytest.approx(fr_holm(g["p_value"].to_numpy()))
    assert (allf["p_holm"] >= per["p_holm"] - 1e-12).all()
    assert (allf["p_holm"] > per["p_holm"] + 1e-9).any()
    assert fr.holm_scope({"holm_across_settings": True}).startswith("every regime x budget")


# ----------------------------------------------------------------- figure and CLI
def test_cli_end_to_end(tmp_path, capsys):
    out = tmp_path / "fr"
    argv = [
        "frontier",
        "--regimes",
        "bursty",
        "--seeds",
        "2",
        "--draws",
        "20",
        "--budgets",
        "60",
        "96",
        "--budget-agents",
        "online-forecast-budget",
        "fixed-budget",
        "--free-agents",
        "fixed-512",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(argv) == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        [
            MARKER,
            "curves.csv",
            "frontier.csv",
            "frontier.json",
            "frontier.md",
            "frontier_bursty.png",
        ]
    )
    rows = pd.read_csv(out / "frontier.csv")
    assert len(rows) == 2 * (1 + 2 * 2)
    assert set(rows.loc[rows["mode"] == "budget", "merges"]) == {10, 16}
    assert (out / "frontier_bursty.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "frontier.md").read_text()
    assert "Leaderboard" in md and "Dominance" in md and "inconclusive" in md
    assert "SPEC" not in md
    payload = json.loads((out / "frontier.json").read_text())
    assert payload["config"]["budgets_per_hour"] == [60.0, 96.0]
    assert {d["relation"] for d in payload["dominance"]} == {"inconclusive (too few episodes)"}
    # An existing frontier needs --force; --force replaces it.
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "--force" in capsys.readouterr().err
    assert payload["holm_family"] == fr.holm_scope({})
    assert {b["holm_family"] for b in payload["budgets"]} == {2}
    # --holm-across-settings: one family over both budgets' agents, named in both files
    assert main(argv + ["--force", "--holm-across-settings"]) == 0
    payload = json.loads((out / "frontier.json").read_text())
    assert payload["holm_family"] == fr.holm_scope({"holm_across_settings": True})
    assert {b["holm_family"] for b in payload["budgets"]} == {4}
    assert "Holm across every regime x budget x agent" in (out / "frontier.md").read_text()
    # A directory of other files is never replaced.
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    with pytest.raises(SystemExit) as exc:
        main(argv[:-3] + ["--out", str(other), "--force"])
    assert exc.value.code == 2 and (other / "notes.txt").read_text() == "keep"
    assert "refusing to replace" in capsys.readouterr().err
    # Bad budgets and agents: one line, usage error.
    for bad, msg in (
        (["--budgets", "30"], "outside the feasible 8..32"),
        (["--free-agents", "fixed-budget"], "need a merge budget"),
        (["--budget-agents", "nope"], "unknown agent"),
    ):
        with pytest.raises(SystemExit) as exc:
            main(
                [
                    "frontier",
                    "--regimes",
                    "bursty",
                    "--seeds",
                    "2",
                    "--draws",
                    "5",
                    "--out",
                    str(tmp_path / "x"),
                    "--no-progress",
                    *bad,
                ]
            )
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1


def test_cli_extra_agent_joins_both_default_lists(tmp_path):
    """--agent adds to the default free agents and budget agents, not instead of them."""
    pytest.importorskip("stable_baselines3")
    from diloco_gym.agents.registry import HEURISTICS

    out = tmp_path / "fr"
    assert (
        main(
            [
                "frontier",
                "--regimes",
                "sync-heavy",
                "--seeds",
                "2",
                "--draws",
                "5",
                "--budgets",
                "96",
                "--agent",
                "reference-ppo",
                "--agent",
                "wa-diloco",
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    rows = pd.read_csv(out / "frontier.csv")
    free = list(dict.fromkeys(rows.loc[rows["mode"] == "free", "agent"]))
    held = list(dict.fromkeys(rows.loc[rows["mode"] == "budget", "agent"]))
    assert free == [*HEURISTICS, "reference-ppo"]
    assert held == [*fr.DEFAULT_BUDGET_AGENTS, "reference-ppo"]


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory):
    """A 1,800 s bursty trace saved in the native format (6 windows of 300 s)."""
    from dataclasses import replace

    from diloco_gym.sim.loaders import save_native
    from diloco_gym.sim.regimes import REGIMES
    from diloco_gym.sim.traces import Trace

    tr = replace(REGIMES["bursty"], duration_s=1800.0)(np.random.default_rng(11))
    path = tmp_path_factory.mktemp("traces") / "long.csv"
    save_native(Trace(tr.arrival_s, tr.prompt_tokens, tr.output_tokens, tr.duration_s), path)
    return path


def test_cli_trace_windows_are_the_units(long_trace, tmp_path, capsys):
    out = tmp_path / "tr"
    base = [
        "frontier",
        "--trace",
        str(long_trace),
        "--format",
        "native",
        "--draws",
        "10",
        "--budgets",
        "48",
        "72",
        "--budget-agents",
        "online-forecast-budget",
        "--free-agents",
        "fixed-512",
        "--no-progress",
    ]
    assert main([*base, "--window-s", "300", "--out", str(out)]) == 0
    rows = pd.read_csv(out / "frontier.csv")
    assert set(rows["regime"]) == {"replay:long"} and set(rows["unit"]) == {"window"}
    starts = sorted(rows["window_start_replayed_s"].unique())
    assert starts == [0.0, 300.0, 600.0, 900.0, 1200.0, 1500.0]
    assert len(rows) == 6 * (1 + 2)
    # 300 s windows hold 250 decisions: 48 and 72 merges/h are 4 and 6 merges.
    assert set(rows.loc[rows["mode"] == "budget", "merges"]) == {4, 6}
    assert "6 disjoint windows of 300 s" in (out / "frontier.md").read_text()
    assert (out / "frontier_replay_long.png").is_file()
    # A replayed trace has no rate function apart from its arrivals: no rate-clairvoyant
    # reference (NaN), and frontier.md leaves its rows out.
    assert rows["rate_clairvoyant_pct"].isna().all()
    assert "rate-clairvoyant" not in (out / "frontier.md").read_text()
    # Overlapping windows are refused (not independent); one window is too few.
    with pytest.raises(SystemExit) as exc:
        main([*base, "--window-s", "300", "--stride-s", "150", "--out", str(tmp_path / "a")])
    assert exc.value.code == 2 and "disjoint windows only" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main([*base, "--window-s", "1000", "--out", str(tmp_path / "b")])
    assert exc.value.code == 1
    assert "1 window(s) of 1000 s" in capsys.readouterr().err


def test_budget_agents_are_one_object_per_budget(monkeypatch):
    """Each budget of the grid has its own budget agents (same names, distinct objects),
    so every run of a unit steps in one lockstep wave; sealed, the free agents share one
    worker and every budget's agents another. The rows are those of the in-process run."""
    from diloco_gym.eval import rollout
    from diloco_gym.eval.cells import release_cached
    from diloco_gym.eval.sealed import SealedAgent, worker_key

    kw = {
        "regimes": ["bursty"],
        "budgets_per_hour": [60.0, 96.0],
        "seeds": 2,
        "draws": 20,
        "budget_agents": ["online-forecast-budget", "wa-diloco"],
        "free_agents": ["fixed-512"],
    }
    inproc = fr.FrontierConfig(**kw, in_process_agents=True)
    free, per_budget = fr._frontier_agents(inproc)
    assert [a.name for a in free] == ["fixed-512"]
    assert [[a.name for a in agents] for agents in per_budget] == [
        ["online-forecast-budget", "wa-diloco"]
    ] * 2
    assert len({id(a) for agents in per_budget for a in agents}) == 4
    sealed_cfg = fr.FrontierConfig(**kw)
    free, per_budget = fr._frontier_agents(sealed_cfg)
    try:
        held = [a for agents in per_budget for a in agents]
        assert all(isinstance(a, SealedAgent) for a in [*free, *held])
        assert len({worker_key(a) for a in held}) == 1
        assert worker_key(free[0]) != worker_key(held[0])
    finally:
        for a in [*free, *held]:
            a.close()
    waves: list[int] = []
    lockstep = rollout._lockstep
    monkeypatch.setattr(
        rollout, "_lockstep", lambda runs: waves.append(len(runs)) or lockstep(runs)
    )
    try:
        sealed = fr.run_frontier(sealed_cfg, progress=False)
    finally:
        release_cached()
    assert waves == [1 + 2 * 2] * 2  # per unit: every run in one wave
    in_process = fr.run_frontier(inproc, progress=False)
    cols = [c for c in sealed["rows"].columns if c != "elapsed_s"]
    pd.testing.assert_frame_equal(sealed["rows"][cols], in_process["rows"][cols])
    pd.testing.assert_frame_equal(sealed["curves"], in_process["curves"])
