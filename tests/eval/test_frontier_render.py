"""frontier.md and the frontier figure (diloco_gym/eval/frontier_render.py) on a hand-made
result (one regime, two budget-held agents at two budgets, two free agents): the sections,
the leaderboard order and short verdicts, missing cells, p-value formatting, the reference
rows, dominance and the undominated agents, the free points, the header's units, and the
figure's curves. One slow test renders a real (tiny) ``run_frontier`` result."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from diloco_gym.eval.frontier_render import (
    _fmt_p,
    _units,
    frontier_figure,
    render_markdown,
    undominated,
)
from diloco_gym.eval.oracle import ORACLE_EXACT

INCONCLUSIVE = "inconclusive (too few episodes)"


def _budget_row(agent, per_hour, held, gap, verdict, p_holm, sync):
    return {
        "regime": "bursty",
        "budget_per_hour": per_hour,
        "budget": per_hour / 6,
        "agent": agent,
        "held": held,
        "gap_captured": gap,
        "gap_ci_low": gap - 0.1,
        "gap_ci_high": gap + 0.1,
        "verdict": verdict,
        "sync_excess_pct": sync,
        "matched_random_pct": 10.0 + per_hour / 100,
        "oracle_pct": 3.0,
        "rate_clairvoyant_pct": 5.0,
        "gap_captured_reachable": gap + 0.2,
        "reachable_ci_low": gap + 0.1,
        "reachable_ci_high": gap + 0.3,
        "diff_pp": sync - 10.0,
        "p_holm": p_holm,
    }


@pytest.fixture
def result():
    budgets = pd.DataFrame(
        [
            _budget_row("A", 48.0, "budget-aware", 0.8, "placement gain", 0.0004, 4.0),
            _budget_row("A", 96.0, "budget-aware", 0.6, "placement gain", 0.012, 5.0),
            _budget_row("B", 48.0, "mask", 0.3, "tied with matched random", 0.5, 8.0),
            _budget_row("B", 96.0, "mask", 0.2, INCONCLUSIVE, np.nan, 9.0),
        ]
    )
    free = pd.DataFrame(
        [
            {
                "regime": "bursty", "agent": name, "deployable": dep, "merges_per_hour": mph,
                "sync_excess_pct": se, "matched_random_pct": 9.0, "oracle_pct": 3.0,
                "gap_captured": 0.5, "gap_ci_low": 0.4, "gap_ci_high": 0.6, "p_holm": 0.03,
                "verdict": "placement gain",
            }
            for name, dep, mph, se in (("fixed-512", True, 48.0, 7.0), ("oracle", False, 54.0, 2.5))
        ]
    )  # fmt: skip
    dominance = pd.DataFrame(
        [{"regime": "bursty", "agent_a": "A", "agent_b": "B", "relation": "dominates"}]
    )
    curves = pd.DataFrame(
        [
            {
                "regime": "bursty", "budget_per_hour": b, "seed": s,
                "matched_random_mean": 10.0 + b / 100, "oracle_pct": 3.0,
                "rate_clairvoyant_pct": 5.0,
            }
            for b in (24.0, 48.0, 72.0, 96.0)
            for s in (0, 1)
        ]
    )  # fmt: skip
    rows = pd.DataFrame(
        {
            "regime": ["bursty"] * 3,
            "seed": [0, 1, 0],
            "oracle_schedule": [ORACLE_EXACT, ORACLE_EXACT, "upper bound"],
            "additive_exact_gap_pp": [0.0, 0.0123, 0.0],
        }
    )
    config = {"regimes": ["bursty"], "seeds": 2, "seed0": 3, "draws": 20, "alpha": 0.05}
    return {
        "rows": rows,
        "curves": curves,
        "budgets": budgets,
        "dominance": dominance,
        "free": free,
        "calibration": {"bursty": "calibrated"},
        "config": config,
        "elapsed_s": 1.25,
    }


def _table_after(md: str, heading: str) -> list[str]:
    lines = md.splitlines()
    i = lines.index(heading)
    out = []
    for ln in lines[i + 1 :]:
        if ln.startswith("|"):
            out.append(ln)
        elif out:
            break
    return out


@pytest.mark.parametrize(
    ("p", "shown"),
    [(0.5, "0.5"), (0.012345, "0.012"), (0.001, "0.001"), (0.0004, "4.0e-04"), (np.nan, "-")],
)
def test_p_values_have_two_significant_digits(p, shown):
    assert _fmt_p(p) == shown


def test_the_sections_and_the_header(result):
    md = render_markdown(result, {"bursty": "frontier_bursty.png"}, command="diloco-gym frontier")
    heads = [ln for ln in md.splitlines() if ln.startswith("#")]
    assert heads == [
        "# Frontier: sync-excess against merge rate",
        "## bursty",
        "### Leaderboard: gap captured [95 % CI] (verdict vs matched random)",
        "### Sync-excess % per budget (agent mean over units)",
        "### Dominance",
        "### Free-budget points (each agent at its own merges/h)",
    ]
    assert "Command: `diloco-gym frontier`" in md
    assert md.splitlines()[4].startswith(
        "2 seeds per regime (3..4), 20 matched-random draws per episode and budget, alpha "
        "0.05; wall time 1.2 s."
    )
    assert "Deployable agents: sealed, each in its own process" in md
    assert "![frontier bursty](frontier_bursty.png)" in md
    assert "Calibration: calibrated. Scoring: exact replay; the oracle is an upper bound " in md
    assert "in 1 of 3 agent-episodes; largest additive-exact gap 0.0123 pp." in md
    assert "![" not in render_markdown(result, {})


def test_the_leaderboard_is_best_first_with_short_verdicts(result):
    md = render_markdown(result, {})
    table = _table_after(md, "### Leaderboard: gap captured [95 % CI] (verdict vs matched random)")
    assert table == [
        "| agent | held | 48/h | 96/h |",
        "|---|---|---|---|",
        "| A | budget-aware | 0.80 [0.70, 0.90] (gain) | 0.60 [0.50, 0.70] (gain) |",
        "| B | mask | 0.30 [0.20, 0.40] (tie) | 0.20 [0.10, 0.30] (inconcl.) |",
    ]


def test_a_missing_budget_is_a_dash(result):
    result["budgets"] = result["budgets"].iloc[:3]  # B has no 96/h row
    md = render_markdown(result, {})
    board = _table_after(md, "### Leaderboard: gap captured [95 % CI] (verdict vs matched random)")
    assert board[-1] == "| B | mask | 0.30 [0.20, 0.40] (tie) | - |"


def test_sync_excess_reference_rows_and_the_diffs(result):
    md = render_markdown(result, {})
    table = _table_after(md, "### Sync-excess % per budget (agent mean over units)")
    assert table == [
        "| agent | 48/h | 96/h |",
        "|---|---|---|",
        "| A | 4.00 | 5.00 |",
        "| B | 8.00 | 9.00 |",
        "| *matched random* | 10.48 | 10.96 |",
        "| *oracle (non-deployable)* | 3.00 | 3.00 |",
        "| *rate-clairvoyant (knows the bursts)* | 5.00 | 5.00 |",
        "| *merges per episode* | 8 | 16 |",
    ]
    diffs = _table_after(md, "Diff vs matched random (pp) and Holm p per budget:")
    assert diffs[2:] == [
        "| A | -6.00 (p 4.0e-04) | -5.00 (p 0.012) |",
        "| B | -2.00 (p 0.5) | -1.00 (p -) |",
    ]
    assert "Gap captured relative to the rate-clairvoyant reference" in md


def test_without_a_clairvoyant_reference_there_is_no_reachable_table(result):
    result["budgets"] = result["budgets"].assign(rate_clairvoyant_pct=np.nan)
    md = render_markdown(result, {})
    assert "rate-clairvoyant" not in md and "| *merges per episode* | 8 | 16 |" in md


def test_dominance_and_the_undominated_agents(result):
    md = render_markdown(result, {})
    assert "* **A** dominates B" in md
    assert "Not dominated by any budget-held agent: A." in md
    d = pd.DataFrame(
        {
            "agent_a": ["A", "B", "A"],
            "agent_b": ["B", "C", "C"],
            "relation": [
                "is dominated by",
                "no dominance (no significant difference)",
                INCONCLUSIVE,
            ],
        }
    )
    assert undominated(d) == ["B", "C"]


def test_free_points_by_merge_rate_with_the_non_deployable_mark(result):
    md = render_markdown(result, {})
    table = _table_after(md, "### Free-budget points (each agent at its own merges/h)")
    assert table[2:] == [
        "| fixed-512 | 48.0 | 7.00 | 9.00 | 3.00 | 0.50 [0.40, 0.60] | 0.03 | placement gain |",
        "| oracle (non-deployable) | 54.0 | 2.50 | 9.00 | 3.00 | 0.50 [0.40, 0.60] | 0.03 | "
        "placement gain |",
    ]


def test_the_units_of_a_trace_and_of_a_load(result):
    cfg = {**result["config"], "trace": "t.csv", "window_s": 300.0, "rate_scale": 2.0}
    assert _units({**result, "config": cfg}) == (
        "2 disjoint windows of 300 s of t.csv (independent units; sync-heavy sidecar), "
        "offered load x2 (--rate-scale),"
    )
    cfg = {**result["config"], "target_utilization": 0.7}
    assert _units({**result, "config": cfg}).endswith(" at utilization 0.7 (--target-utilization),")


def test_the_figure_draws_the_references_the_held_agents_and_the_free_points(result):
    fig = frontier_figure(result, "bursty")
    (ax,) = fig.axes
    labels = [ln.get_label() for ln in ax.get_lines() if not ln.get_label().startswith("_")]
    assert labels == [
        "matched random (random placement)",
        "rate-clairvoyant (knows the bursts, not arrivals)",
        "oracle (best exact schedule, non-deployable)",
        "A @ budget (budget-aware)",
        "B @ budget (held by mask)",
    ]
    styles = {ln.get_label(): ln.get_linestyle() for ln in ax.get_lines()}
    assert (
        styles["A @ budget (budget-aware)"] == "-" and styles["B @ budget (held by mask)"] == "--"
    )
    assert [t.get_text() for t in ax.texts] == ["fixed-512", "oracle (non-dep.)"]
    assert ax.get_title() == "bursty: frontier of sync-excess against merge rate (2 seeds)"


@pytest.mark.slow
def test_a_real_frontier_renders_and_its_figure_saves_as_png(tmp_path):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from diloco_gym.eval import frontier as fr

    cfg = fr.FrontierConfig(
        regimes=["bursty"],
        budgets_per_hour=[72.0],
        seeds=2,
        draws=20,
        budget_agents=["fixed-budget"],
        free_agents=["fixed-512"],
        in_process_agents=True,
    )
    res = fr.run_frontier(cfg, progress=False)
    md = render_markdown(res, {"bursty": "frontier_bursty.png"})
    assert "| fixed-budget | budget-aware | " in md and "(inconcl.)" in md
    assert "| fixed-512 | 48.0 |" in md and INCONCLUSIVE in md
    assert "Deployable agents: in-process (--in-process-agents" in md
    fig = frontier_figure(res, "bursty")
    FigureCanvasAgg(fig)
    fig.savefig(tmp_path / "f.png", dpi=90)
    assert (tmp_path / "f.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
