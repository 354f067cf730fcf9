"""The budget frontier on a fleet (diloco_gym/eval/fleet_frontier.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from diloco_gym.eval.fleet import FleetReportConfig
from diloco_gym.eval.fleet_frontier import (
    FleetFrontierConfig,
    fleet_frontier_figure,
    fleet_stats,
    frontier_stats_rows,
    frontier_table,
    run_fleet_frontier,
    write_fleet_frontier,
)
from diloco_gym.eval.frontier import run_frontier, write_frontier

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "fleet.toml"


def _config() -> FleetFrontierConfig:
    report = FleetReportConfig(
        fleet=str(EXAMPLE), agents=["pressure-gate"], seeds=2, draws=20, in_process_agents=True
    )
    return FleetFrontierConfig(report=report, budgets=[60, 40])


def test_fleet_frontier_outputs_matched_syncs_and_determinism(tmp_path):
    a = run_frontier(_config())
    f = a["frontier"]
    assert list(f["budget"]) == [40, 60]
    # every episode has exactly the budget's syncs; matched random is drawn at that count
    assert (a["rows"]["syncs"] == a["rows"]["budget"]).all()
    assert (f["oracle_same_budget_pct"] <= f["matched_random_mean"] + 1e-9).all()
    write_frontier(a, tmp_path / "one")  # the single host's writer writes a fleet's too
    write_fleet_frontier(run_frontier(_config()), tmp_path / "two")
    for name in ("frontier.csv", "frontier.json", "frontier.md", "frontier.png"):
        assert (tmp_path / "one" / name).is_file()
    png = (tmp_path / "one" / "frontier.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    # two panels side by side: 11 x 4.8 inches at 90 dpi
    assert (int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")) == (990, 432)
    assert "![fleet frontier](frontier.png)" in (tmp_path / "one" / "frontier.md").read_text()
    # the configuration records the report's env, not the first budget's merge_budget
    saved = json.loads((tmp_path / "one" / "frontier.json").read_text())
    assert saved["config"]["env"] == {} and saved["config"]["budgets"] == [40, 60]
    one = (tmp_path / "one" / "frontier.csv").read_bytes()
    assert one == (tmp_path / "two" / "frontier.csv").read_bytes()
    with pytest.raises(FileExistsError):
        write_fleet_frontier(a, tmp_path / "one")


def test_fleet_frontier_config_errors():
    report = _config().report
    with pytest.raises(ValueError, match="at least one budget"):
        FleetFrontierConfig(report=report, budgets=[])
    with pytest.raises(ValueError, match="integers >= 1"):
        FleetFrontierConfig(report=report, budgets=[0, 4])
    with pytest.raises(ValueError, match="distinct"):
        FleetFrontierConfig(report=report, budgets=[4, 4])


def test_the_budget_table_is_the_single_host_frontiers_over_the_independent_episodes():
    """The fleet frontier's table is the single-host frontier's budget table of the
    independent episodes (the gap captured with its bootstrap interval, the test, Holm over
    the agents of a budget, the verdict), with the fleet's names of the columns in syncs
    and the worst site's mean; undefined gaps stay NaN."""
    import numpy as np
    import pandas as pd

    from diloco_gym.eval.frontier_stats import budget_stats

    n = 4
    rows = pd.DataFrame(
        {
            "budget": [7] * 2 * n,
            "agent": ["a"] * n + ["b"] * n,
            "deployable": [True] * 2 * n,
            "seed": list(range(n)) * 2,
            "syncs": [7] * 2 * n,
            "syncs_per_hour": [42.0] * 2 * n,
            "sync_excess_pct": [1.0, 1.5, 0.5, 9.0, 2.0, 2.0, 2.0, 2.0],
            "matched_random_mean": [2.0, 2.5, 2.0, 9.0, 2.0, 2.0, 2.0, 2.0],
            "oracle_same_budget_pct": [0.0, 0.5, 0.2, 1.0, 2.0, 2.0, 2.0, 2.0],
            "no_sync_violation_pct": [1.0] * 2 * n,
            "worst_site_sync_excess_pct": [3.0, 3.0, 3.0, 99.0, 4.0, 4.0, 4.0, 4.0],
        }
    )
    units = frontier_stats_rows(rows, [0, 1, 2], "mask")
    keys = ["regime", "budget_per_hour", "budget", "agent"]
    got = fleet_stats(units, keys, "calibrated", 0.05)
    want = budget_stats(units, {"fleet": "calibrated"}, 0.05)
    for col in ("gap_captured", "gap_ci_low", "gap_ci_high", "diff_pp", "p_holm", "verdict"):
        assert got[col].tolist() == pytest.approx(want[col].tolist(), nan_ok=True), col
    assert got.iloc[0]["gap_captured"] == pytest.approx(
        (2.1667 - 1.0) / (2.1667 - 0.2333), abs=1e-3
    )  # seed 3 is not an independent unit
    assert math.isnan(got.iloc[1]["gap_captured"])  # the oracle is no better than random
    assert got["worst_site_sync_excess_pct"].tolist() == [3.0, 4.0]
    assert got["syncs_per_hour"].tolist() == [42.0, 42.0] and "merges_per_hour" not in got
    assert got["matched_random_mean"].tolist() == pytest.approx([6.5 / 3, 2.0])
    assert list(got["holm_family"]) == [2, 2]
    np.testing.assert_allclose(got["p_holm"], [min(1.0, 2 * p) for p in got["p_value"]])


ROUNDS = EXAMPLE.with_name("fleet-rounds.toml")


def _legend(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.get_legend().get_texts()]


def test_a_rounds_fleet_frontier_counts_rounds_and_calls_its_oracle_an_upper_bound(tmp_path):
    """On a per-site timing fleet each budget is that many rounds at both ends of the
    feasible range 8..16 (the rounds env keeps the fleet env's merge budget), a
    budget-aware agent and its ``+own`` form run at every budget, the frontier carries the
    rounds' columns, and its table, page and figure call the oracle (the additive
    optimum, bracketed below by its certified lower bound) an upper bound, never an exact
    DP."""
    from diloco_gym.eval.fleet_rounds import ORACLE_ROUNDS, ROUNDS_SUMMARY_COLUMNS

    agents = ["online-forecast-budget", "fixed-budget+own"]
    report = FleetReportConfig(
        fleet=str(ROUNDS), agents=agents, seeds=2, draws=20, in_process_agents=True
    )
    res = run_frontier(FleetFrontierConfig(report=report, budgets=[16, 8]))
    rows, f = res["rows"], res["frontier"]
    assert (rows["syncs"] == rows["budget"]).all() and set(rows["budget"]) == {8, 16}
    assert (rows["oracle_schedule"] == ORACLE_ROUNDS).all() and "local search" not in ORACLE_ROUNDS
    assert list(f["agent"]) == agents * 2
    assert set(ROUNDS_SUMMARY_COLUMNS) <= set(f)
    assert ((f["token_share_mean"] > 0) & (f["token_share_mean"] <= 1)).all()
    table = frontier_table(f)
    assert "| oracle (upper bound) pp |" in table and "| token share |" in table
    assert "exact DP" not in " ".join(_legend(fleet_frontier_figure(res)))
    assert any("upper bound" in t for t in _legend(fleet_frontier_figure(res)))
    write_fleet_frontier(res, tmp_path / "r")
    md = (tmp_path / "r" / "frontier.md").read_text()
    assert "budgets (rounds per episode) [8, 16]" in md and "certified lower bound" in md
    assert (rows["oracle_lower_bound_pct"] <= rows["oracle_same_budget_pct"] + 1e-12).all()
    assert (rows["oracle_lower_bound_pct"] > 0).all()
    saved = json.loads((tmp_path / "r" / "frontier.json").read_text())
    assert saved["fleet"]["timing"] == "rounds" and saved["fleet"]["quorum"] == 4
    assert {"dropped_contributions", "token_share_mean"} <= set(saved["frontier"][0])
    # a one-instant fleet's frontier keeps its exact DP oracle and has no rounds columns
    instant = run_frontier(_config())
    assert "| oracle pp |" in frontier_table(instant["frontier"])
    assert "token_share_mean" not in instant["frontier"]
    assert "oracle (exact DP, non-deployable)" in _legend(fleet_frontier_figure(instant))


def _two_agents(seeds: int) -> FleetFrontierConfig:
    report = FleetReportConfig(
        fleet=str(EXAMPLE),
        agents=["online-forecast-budget", "fixed-budget"],
        seeds=seeds,
        draws=20,
        in_process_agents=True,
    )
    return FleetFrontierConfig(report=report, budgets=[48, 96])


def test_the_fleet_frontier_compares_agents_by_the_single_hosts_statistics(tmp_path):
    """Every pair of agents at every budget: the paired test of their sync-excess over the
    independent episodes (as the single-host frontier), and dominance across budgets,
    "inconclusive" when the episodes cannot reach alpha; written to frontier.md,
    frontier.json and pairwise.csv."""
    import numpy as np

    from diloco_gym.eval import protocol
    from diloco_gym.eval.fleet_frontier import agents_compared

    res = run_frontier(_two_agents(3))
    pw = res["pairwise"]
    assert list(pw["budget"]) == [48, 96] and set(pw["units"]) == {3}
    rows = res["rows"][res["rows"]["budget"] == 48].pivot(
        index="seed", columns="agent", values="sync_excess_pct"
    )
    diff = (rows["online-forecast-budget"] - rows["fixed-budget"]).to_numpy()
    want = protocol.paired_test(diff, np.random.default_rng(2))
    assert pw.iloc[0]["diff_pp"] == pytest.approx(want["mean"])
    assert pw.iloc[0]["p_value"] == pytest.approx(want["p_value"])
    (rel,) = res["dominance"]["relation"]
    assert rel == "inconclusive (too few episodes)"  # 3 episodes cannot reach 0.05
    # only the independent units enter: a subset of the seeds gives fewer units
    fewer, _ = agents_compared(frontier_stats_rows(res["rows"], [0, 1], "mask"), 0.05)
    assert set(fewer["units"]) == {2}
    write_fleet_frontier(res, tmp_path / "f")
    assert "## Agents against each other" in (tmp_path / "f" / "frontier.md").read_text()
    saved = json.loads((tmp_path / "f" / "frontier.json").read_text())
    assert saved["dominance"][0]["relation"] == rel and len(saved["pairwise"]) == 2
    assert (tmp_path / "f" / "pairwise.csv").read_text().count("\n") == 3


@pytest.mark.slow
def test_with_enough_episodes_the_forecaster_dominates_fixed_placement():
    res = run_frontier(_two_agents(12))
    (row,) = res["dominance"].to_dict(orient="records")
    assert row["agent_a"] == "online-forecast-budget"
    assert row["relation"] == "dominates" and row["b_lower_at"] == []


def test_free_agents_are_points_at_their_own_rate_as_the_fleet_report_scores_them(tmp_path):
    """Free-budget points: each free agent with no merge budget on the frontier's episodes,
    the fleet report's own rows and statistics with the gap captured; drawn over the
    curves and written to frontier.md, frontier.json and free.csv."""
    from dataclasses import replace

    import pandas as pd

    from diloco_gym.eval.report import run_protocol

    base = _config()
    config = replace(base, free_agents=["online-forecast", "fixed-256"])
    res = run_frontier(config)
    free = res["free"]
    assert list(free["agent"]) == ["online-forecast", "fixed-256"]
    report = run_protocol(replace(base.report, agents=["online-forecast", "fixed-256"]))
    want = report["summary"].set_index("agent")
    for r in free.itertuples():
        for col in ("syncs_per_hour", "sync_excess_pct", "matched_random_mean", "p_holm"):
            assert getattr(r, col) == want.loc[r.agent, col]
        gap = (r.matched_random_mean - r.sync_excess_pct) / (
            r.matched_random_mean - r.oracle_same_budget_pct
        )
        assert r.gap_captured == pytest.approx(gap)  # the ratio of the episodes' means
    # the free agents' own rates, not a budget's
    assert set(res["free_rows"]["syncs"]) - set(base.budgets)
    assert "online-forecast (own rate)" in _legend(fleet_frontier_figure(res))
    write_fleet_frontier(res, tmp_path / "out")
    md = (tmp_path / "out" / "frontier.md").read_text()
    assert "## Free-budget points" in md and "| fixed-256 |" in md
    saved = json.loads((tmp_path / "out" / "frontier.json").read_text())
    assert [p["agent"] for p in saved["free"]] == ["online-forecast", "fixed-256"]
    csv = pd.read_csv(tmp_path / "out" / "free.csv")
    assert list(csv["agent"]) == ["online-forecast", "fixed-256"]
    # without free agents: an empty table, and no section
    plain = run_frontier(base)
    assert plain["free"].empty


def test_a_budget_aware_free_agent_is_refused():
    report = _config().report
    with pytest.raises(ValueError, match="need a merge budget"):
        FleetFrontierConfig(report=report, budgets=[40], free_agents=["online-forecast-budget"])


def test_the_old_fleet_runner_warns_and_gives_the_frontiers_result():
    """``run_fleet_frontier`` is kept for one release: a FutureWarning, then
    ``run_frontier``'s result."""
    import pandas as pd

    with pytest.warns(FutureWarning, match="run_frontier"):
        old = run_fleet_frontier(_config())
    new = run_frontier(_config(), progress=False)
    for key in ("frontier", "rows", "free"):
        pd.testing.assert_frame_equal(old[key], new[key])
    assert old["config"] == new["config"] and old["fleet"] == new["fleet"]


@pytest.mark.slow
def test_a_one_site_fleets_frontier_is_the_single_hosts(tmp_path):
    """One frontier for both: a one-site fleet (the paper's 8 s sync) at 10 and 12 syncs per
    episode gives the single-host frontier's rows at 60 and 72 merges per hour (the same
    merges per 600 s episode) in every column both write, for budget-held and free agents,
    and its table's statistics."""
    import pandas as pd

    from diloco_gym.eval.frontier import FrontierConfig

    one = tmp_path / "one.toml"
    one.write_text('[fleet]\nmerge_seconds = 8.0\n\n[[site]]\nname = "bursty"\nregime = "bursty"\n')
    agents, free = ["online-forecast-budget", "pressure-gate"], ["online-forecast"]
    kw = {"seeds": 4, "draws": 40, "in_process_agents": True}
    single = run_frontier(
        FrontierConfig(regimes=["bursty"], budgets_per_hour=[60.0, 72.0], budget_agents=agents,
                       free_agents=free, **kw),
        progress=False,
    )  # fmt: skip
    fleet = run_frontier(
        FleetFrontierConfig(FleetReportConfig(fleet=str(one), agents=agents, **kw), [10, 12], free),
        progress=False,
    )
    rows = single["rows"]
    pairs = [
        (rows[rows["mode"] == "budget"], fleet["rows"], ["budget", "seed", "agent"]),
        (rows[rows["mode"] == "free"], fleet["free_rows"], ["seed", "agent"]),
    ]
    for a, b, key in pairs:
        a, b = (t.sort_values(key).reset_index(drop=True) for t in (a, b))
        common = [c for c in a.columns if c in b.columns]
        assert {"sync_excess_pct", "matched_random_mean", "oracle_same_budget_pct"} <= set(common)
        assert len(a) == len(b) > 0
        for col in common:
            pd.testing.assert_series_equal(a[col], b[col], check_dtype=False, obj=col)
    names = {"merges_per_hour": "syncs_per_hour", "matched_random_pct": "matched_random_mean",
             "oracle_pct": "oracle_same_budget_pct"}  # fmt: skip
    a = single["budgets"].rename(columns=names).sort_values(["budget", "agent"])
    b = fleet["frontier"].sort_values(["budget", "agent"])
    stats = ["syncs_per_hour", "sync_excess_pct", "matched_random_mean", "oracle_same_budget_pct",
             "diff_pp", "units", "nonzero_units", "gap_captured", "gap_ci_low", "gap_ci_high",
             "p_holm", "verdict"]  # fmt: skip
    pd.testing.assert_frame_equal(
        a[stats].reset_index(drop=True), b[stats].reset_index(drop=True), check_dtype=False
    )
