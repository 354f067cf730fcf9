"""The frontier's documents: frontier.md (:func:`render_markdown`) and the figure of each
regime (:func:`frontier_figure`), from a :func:`~diloco_gym.eval.frontier.run_frontier`
result."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from diloco_gym.eval import protocol
from diloco_gym.eval.frontier_stats import DOMINANCE_VERDICTS, holm_scope
from diloco_gym.eval.quality_vs_random import AGENT_COLORS, frontier_quality_lines
from diloco_gym.eval.report_render import sandbox_sentence
from diloco_gym.text import finite, fmt

__all__ = ["render_markdown", "frontier_figure", "undominated"]


def _fmt(x: float, nd: int = 2) -> str:
    return fmt(x, nd, missing="-")


def _fmt_p(p: float) -> str:
    """A p-value in frontier.md: two significant digits (the report's tables use three
    decimals, :func:`diloco_gym.text.fmt_p`)."""
    if not finite(p):
        return "-"
    return f"{p:.2g}" if p >= 1e-3 else f"{p:.1e}"


_SHORT = {
    "placement gain": "gain",
    "tied with matched random": "tie",
    "worse than matched random": "worse",
    "inconclusive (too few episodes)": "inconcl.",
    "no claim (saturated)": "no claim",
    "no claim (uncalibrated)": "no claim",
    "no claim (no SLO effect)": "no claim",
}


def render_markdown(
    result: dict[str, Any],
    figures: dict[str, str],
    command: str = "",
    quality_figures: dict[str, str] | None = None,
) -> str:
    """frontier.md: per regime the figure, the leaderboard (gap captured per budget with its
    CI and verdict), sync-excess per budget, the dominance relation and the free points;
    with a learner calibration the model-quality price, and the quality cost against
    matched random with its figure (``quality_figures``: regime -> file name)."""
    lines = ["# Frontier: sync-excess against merge rate", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += _header(result)
    for regime in result["config"]["regimes"]:
        lines += _regime_section(result, regime, figures, quality_figures or {})
    return "\n".join(lines)


def _units(result: dict[str, Any]) -> str:
    """What the units are (seeds or a trace's windows), and the load when one was set."""
    cfg = result["config"]
    if cfg.get("trace"):
        n_units = int(result["rows"]["seed"].nunique()) if len(result["rows"]) else 0
        units = (
            f"{n_units} disjoint windows of {cfg['window_s']:g} s of {cfg['trace']} "
            f"(independent units; {cfg.get('sidecar') or 'sync-heavy'} sidecar),"
        )
    else:
        units = (
            f"{cfg['seeds']} seeds per regime ({cfg['seed0']}..{cfg['seed0'] + cfg['seeds'] - 1}),"
        )
    if cfg.get("rate_scale") is not None:
        units += f" offered load x{cfg['rate_scale']:g} (--rate-scale),"
    elif cfg.get("target_utilization") is not None:
        units += f" at utilization {cfg['target_utilization']:g} (--target-utilization),"
    return units


def _header(result: dict[str, Any]) -> list[str]:
    """The units, draws and alpha; how deployable agents ran; what the numbers mean."""
    cfg = result["config"]
    lines = [
        f"{_units(result)} {cfg['draws']} matched-random draws per episode and budget, alpha "
        f"{cfg['alpha']}; wall time {result['elapsed_s']:.1f} s.",
        "",
        "Deployable agents: "
        + (
            "in-process (--in-process-agents: not sealed; an agent's code could reach the episode)."
            if cfg.get("in_process_agents")
            else "sealed, each in its own process with observations, action masks and "
            "public parameters only; the oracle runs in the evaluating process."
            + sandbox_sentence(result.get("agent_sandbox"))
        ),
        "",
        "Every number is the exact replay (`protocol.EpisodeScorer`) of the agent's, the "
        "matched-random draws' and the oracle's schedules. **Gap captured** = (matched random"
        " - agent) / (matched random - oracle) at the same budget (0 = random placement, 1 = "
        "the oracle), 95 % bootstrap CI over units (seeds or windows); the oracle is the "
        "best exact schedule known at that budget (the exact optimum where merges cannot "
        "interact or every schedule was scored, else an exact local search from the "
        "additive optimum: an upper bound). Verdict against "
        f"matched random: paired sign-flip test, Holm across {holm_scope(cfg)}. Held: "
        "`budget-aware` agents steer by `budget_left`; `mask` agents follow their own rule "
        "and the env's budget mask forces or forbids merges to keep exactly the budget. A "
        "dominates B: at every budget A's sync-excess is no higher, at least one difference "
        "significant (pairwise Holm across the pairs at a budget).",
        "",
    ]
    return lines


def _regime_section(
    result: dict[str, Any], regime: str, figures: dict[str, str], quality_figures: dict[str, str]
) -> list[str]:
    """One regime: calibration and scoring, the figure, the per-budget tables, dominance,
    the free points and the model-quality price (against fixed H, and against matched
    random with its figure)."""
    b, fr, dom = result["budgets"], result["free"], result["dominance"]
    lines = [
        f"## {regime}",
        "",
        f"Calibration: {result['calibration'].get(regime, '-')}. "
        + _scoring_sentence(result["rows"], regime),
        "",
    ]
    if regime in figures:
        lines += [f"![frontier {regime}]({figures[regime]})", ""]
    g = b[b["regime"] == regime] if not b.empty else b
    if not g.empty:
        lines += _budget_tables(g)
    d = dom[dom["regime"] == regime] if not dom.empty else dom
    if not d.empty:
        lines += _dominance_lines(d)
    f = fr[fr["regime"] == regime] if not fr.empty else fr
    if not f.empty:
        lines += _free_table(f)
    lines += _quality_lines(result["rows"], regime)
    lines += frontier_quality_lines(b, fr, regime, quality_figures.get(regime))
    lines.append("")
    return lines


def _budget_tables(g: pd.DataFrame) -> list[str]:
    """A regime's budget-held agents per budget: the leaderboard (gap captured), their
    sync-excess with the reference rows, and the difference from matched random."""
    per_hours = sorted(g["budget_per_hour"].unique())
    order = list(
        g.groupby("agent", sort=False)["gap_captured"].mean().sort_values(ascending=False).index
    )
    lines = _leaderboard(g, order, per_hours)
    lines += ["", "### Sync-excess % per budget (agent mean over units)", ""]
    lines += _per_budget_table(g, order, per_hours, lambda r: _fmt(r["sync_excess_pct"]))
    lines += _reference_rows(g, order, per_hours)
    lines += ["", "Diff vs matched random (pp) and Holm p per budget:", ""]
    lines += _per_budget_table(
        g, order, per_hours, lambda r: f"{r['diff_pp']:+.2f} (p {_fmt_p(r['p_holm'])})"
    )
    return lines


def _per_budget_table(
    g: pd.DataFrame, order: list, per_hours: list, cell: Callable[[pd.Series], str]
) -> list[str]:
    """One row per agent, one column per budget, each cell ``cell(row)`` (``-``: the agent
    has no row at that budget)."""
    lines = [
        "| agent | " + " | ".join(f"{x:g}/h" for x in per_hours) + " |",
        "|---|" + "---|" * len(per_hours),
    ]
    for agent in order:
        ga = g[g["agent"] == agent].set_index("budget_per_hour")
        lines.append(
            f"| {agent} | "
            + " | ".join(cell(ga.loc[x]) if x in ga.index else "-" for x in per_hours)
            + " |"
        )
    return lines


def _leaderboard(g: pd.DataFrame, order: list, per_hours: list) -> list[str]:
    """Gap captured per agent and budget, with its CI and the verdict against matched
    random, best agent first."""
    head = "| agent | held | " + " | ".join(f"{x:g}/h" for x in per_hours) + " |"
    lines = [
        "### Leaderboard: gap captured [95 % CI] (verdict vs matched random)",
        "",
        head,
        "|---|---|" + "---|" * len(per_hours),
    ]
    for agent in order:
        ga = g[g["agent"] == agent].set_index("budget_per_hour")
        cells = []
        for x in per_hours:
            if x not in ga.index:
                cells.append("-")
                continue
            r = ga.loc[x]
            short = _SHORT.get(r["verdict"], r["verdict"])
            cells.append(
                f"{_fmt(r['gap_captured'])} [{_fmt(r['gap_ci_low'])}, "
                f"{_fmt(r['gap_ci_high'])}] ({short})"
            )
        lines.append(f"| {agent} | {ga['held'].iloc[0]} | " + " | ".join(cells) + " |")
    return lines


def _dominance_lines(d: pd.DataFrame) -> list[str]:
    """A regime's dominance relation, relation by relation, and the undominated agents."""
    lines = ["", "### Dominance", ""]
    for rel in DOMINANCE_VERDICTS:
        dd = d[d["relation"] == rel]
        if dd.empty:
            continue
        if rel in ("dominates", "is dominated by"):
            pairs = [
                (r.agent_a, r.agent_b) if rel == "dominates" else (r.agent_b, r.agent_a)
                for r in dd.itertuples()
            ]
            lines += [f"* **{w}** dominates {lo_}" for w, lo_ in pairs]
        else:
            lines.append(
                f"* {rel}: " + "; ".join(f"{r.agent_a} vs {r.agent_b}" for r in dd.itertuples())
            )
    winners = undominated(d)
    lines += ["", f"Not dominated by any budget-held agent: {', '.join(winners)}."]
    return lines


def _free_table(f: pd.DataFrame) -> list[str]:
    """The free-budget points of a regime, by merge rate."""
    lines = [
        "",
        "### Free-budget points (each agent at its own merges/h)",
        "",
        "| agent | merges/h | sync-excess % | matched random % | oracle % | "
        "gap captured [CI] | Holm p | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in f.sort_values("merges_per_hour").itertuples():
        name = r.agent + ("" if r.deployable else " (non-deployable)")
        lines.append(
            f"| {name} | {r.merges_per_hour:.1f} | {_fmt(r.sync_excess_pct)} "
            f"| {_fmt(r.matched_random_pct)} | {_fmt(r.oracle_pct)} | "
            f"{_fmt(r.gap_captured)} [{_fmt(r.gap_ci_low)}, "
            f"{_fmt(r.gap_ci_high)}] | {_fmt_p(r.p_holm)} | {r.verdict} |"
        )
    return lines


def _reference_rows(g: pd.DataFrame, order: list, per_hours: list) -> list[str]:
    """The per-budget table's reference rows (matched random, the oracle, the
    rate-clairvoyant reference where defined, merges per episode), then each agent's share
    of the random-to-reference gap (absent on a replayed trace, where it is undefined)."""
    first = g.drop_duplicates("budget_per_hour").set_index("budget_per_hour")

    def row(label: str, col: str) -> str:
        return f"| {label} | " + " | ".join(_fmt(first.loc[x, col]) for x in per_hours) + " |"

    reach = "rate_clairvoyant_pct" in g and bool(np.isfinite(g["rate_clairvoyant_pct"]).all())
    lines = [
        row("*matched random*", "matched_random_pct"),
        row("*oracle (non-deployable)*", "oracle_pct"),
    ]
    if reach:
        lines.append(row("*rate-clairvoyant (knows the bursts)*", "rate_clairvoyant_pct"))
    lines.append(
        "| *merges per episode* | "
        + " | ".join(f"{int(first.loc[x, 'budget'])}" for x in per_hours)
        + " |"
    )
    if not reach:
        return lines
    lines += [
        "",
        "Gap captured relative to the rate-clairvoyant reference, (matched random - agent) / "
        "(matched random - rate-clairvoyant) [95 % CI]: how far an agent is from what knowing "
        "the load's shape reaches (above 1: beyond it):",
        "",
        "| agent | " + " | ".join(f"{x:g}/h" for x in per_hours) + " |",
        "|---|" + "---|" * len(per_hours),
    ]
    for agent in order:
        ga = g[g["agent"] == agent].set_index("budget_per_hour")
        cells = [
            f"{_fmt(ga.loc[x, 'gap_captured_reachable'])} [{_fmt(ga.loc[x, 'reachable_ci_low'])}"
            f", {_fmt(ga.loc[x, 'reachable_ci_high'])}]"
            if x in ga.index
            else "-"
            for x in per_hours
        ]
        lines.append(f"| {agent} | " + " | ".join(cells) + " |")
    return lines


def _quality_lines(rows: pd.DataFrame, regime: str) -> list[str]:
    """The two-sided trade-off per agent and budget (with a learner calibration): SLO
    damage (sync-excess) next to the model-quality price."""
    g = rows[rows["regime"] == regime] if "quality_cost" in rows else rows.iloc[:0]
    if g.empty:
        return []
    lines = [
        "",
        "### Model quality (learner calibration)",
        "",
        "Predicted validation loss (nats/byte) after each episode's merges, and the quality "
        "cost: its excess over fixed H with the same number of merges over the same span.",
        "",
        "| agent | budget merges/h | merges/h | sync-excess % | predicted loss | quality cost |",
        "|---|---|---|---|---|---|",
    ]
    keys = ["agent", "mode", "budget_per_hour"]
    for (agent, mode, per_hour), a in g.groupby(keys, sort=False, dropna=False):
        budget = "free" if mode == "free" else f"{per_hour:g}"
        lines.append(
            f"| {agent} | {budget} | {a['merges_per_hour'].mean():.1f} | "
            f"{_fmt(a['sync_excess_pct'].mean())} | {a['pred_loss'].mean():.4f} | "
            f"{a['quality_cost'].mean():+.2e} |"
        )
    return lines


def _scoring_sentence(rows: pd.DataFrame, regime: str) -> str:
    """How a regime's rows were scored: where the oracle is the exact optimum (by
    construction, or proven by its certified lower bound), where it is only an upper bound
    (the local search's best schedule) and how far from its bound, and the largest
    additive-exact gap (every number itself is the exact replay)."""
    from diloco_gym.eval.oracle import ORACLE_ENUMERATED
    from diloco_gym.eval.summary import oracle_bound_met

    g = rows[rows["regime"] == regime]
    if g.empty:
        return ""
    exact = g["oracle_schedule"].isin((protocol.ORACLE_EXACT, ORACLE_ENUMERATED))
    searched, met = int((~exact).sum()), oracle_bound_met(g)
    if searched == met:
        oracle = "the oracle is the exact optimum in every agent-episode"
        if searched:
            oracle += (
                f" (in {searched} the best schedule of an exact local search from the additive "
                "optimum, proven optimal by the certified lower bound)"
            )
    else:
        oracle = (
            "the oracle is an upper bound on the exact optimum (the best schedule of an exact "
            f"local search from the additive optimum) in {searched - met} of {len(g)} "
            "agent-episodes"
        )
        if "oracle_lower_bound_pct" in g and "oracle_same_budget_pct" in g:
            gap = (g["oracle_same_budget_pct"] - g["oracle_lower_bound_pct"]).max()
            oracle += f", at most {gap:.3g} pp above the certified lower bound"
    return (
        f"Scoring: exact replay; {oracle}; largest additive-exact gap "
        f"{g['additive_exact_gap_pp'].max():.3g} pp."
    )


def undominated(d: pd.DataFrame) -> list[str]:
    """Agents of one regime's dominance table that no other agent dominates."""
    agents = list(dict.fromkeys(list(d["agent_a"]) + list(d["agent_b"])))
    losers = set(d.loc[d["relation"] == "dominates", "agent_b"]) | set(
        d.loc[d["relation"] == "is dominated by", "agent_a"]
    )
    return [a for a in agents if a not in losers]


def _reference_curves(ax: Any, cv: pd.DataFrame) -> pd.DataFrame:
    """Draw matched random, the rate-clairvoyant reference (where defined) and the oracle
    over every feasible budget of one regime's curves; returns their means per budget."""
    cols = ["matched_random_mean", "oracle_pct"]
    if "rate_clairvoyant_pct" in cv and np.isfinite(cv["rate_clairvoyant_pct"]).all():
        cols.append("rate_clairvoyant_pct")
    c = cv.groupby("budget_per_hour")[cols].mean()
    styles = {
        "matched_random_mean": ("tab:orange", "-", "matched random (random placement)"),
        "rate_clairvoyant_pct": ("0.45", ":", "rate-clairvoyant (knows the bursts, not arrivals)"),
        "oracle_pct": ("black", "-", "oracle (best exact schedule, non-deployable)"),
    }
    for col in ("matched_random_mean", "rate_clairvoyant_pct", "oracle_pct"):
        if col in c:
            color, style, label = styles[col]
            ax.plot(c.index, c[col], style, color=color, lw=2.5, alpha=0.7, label=label)
    return c


def frontier_figure(result: dict[str, Any], regime: str):
    """The frontier of one regime (a matplotlib ``Figure``, drawn without pyplot):
    sync-excess against merges per hour; matched random's, the rate-clairvoyant reference's
    and the oracle's curves over every feasible budget, each budget-held agent's curve over
    the grid (solid:
    budget-aware, dashed: held by the mask), and every free agent's point."""
    from matplotlib.figure import Figure

    cv = result["curves"]
    fig = Figure(figsize=(9.5, 5.6))
    ax = fig.add_subplot(1, 1, 1)
    c = _reference_curves(ax, cv[cv["regime"] == regime])
    b = result["budgets"]
    if not b.empty:
        _budget_curves(ax, b[b["regime"] == regime])
    fr = result["free"]
    if not fr.empty:
        _free_points(ax, fr[fr["regime"] == regime], c)
    for x in sorted(set(b["budget_per_hour"])) if not b.empty else []:
        ax.axvline(x, color="0.85", lw=0.8, zorder=0)
    ax.set_xlabel("merges per hour (budget)")
    ax.set_ylabel("sync-excess (pp of requests)")
    n_units = int(cv.loc[cv["regime"] == regime, "seed"].nunique())
    kind = "windows" if result["config"].get("trace") else "seeds"
    ax.set_title(f"{regime}: frontier of sync-excess against merge rate ({n_units} {kind})")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


#: The budget-held agents' colours, in order (the quality figure's, without its last).
_COLORS = list(AGENT_COLORS[:-1])


def _budget_curves(ax: Any, b: pd.DataFrame) -> None:
    """Each budget-held agent's sync-excess over the grid (solid: budget-aware, dashed:
    held by the mask)."""
    colors = iter(_COLORS * 4)
    for agent, g in b.groupby("agent", sort=False):
        g = g.sort_values("budget_per_hour")
        aware = g["held"].iloc[0] == "budget-aware"
        ax.plot(
            g["budget_per_hour"],
            g["sync_excess_pct"],
            "-" if aware else "--",
            marker="o",
            ms=4,
            color=next(colors),
            lw=1.6,
            label=f"{agent} @ budget ({'budget-aware' if aware else 'held by mask'})",
        )


def _free_points(ax: Any, f: pd.DataFrame, c: pd.DataFrame) -> None:
    """The free agents' points, labelled in a column to the right of the curves (``c``:
    the reference curves' means per budget, which set the x range).

    Each label sits at its point's height where it can, pushed apart just enough not to
    overprint (in the points' order, so the leader lines do not cross each other much).
    """
    ax.scatter(
        f["merges_per_hour"],
        f["sync_excess_pct"],
        marker="D",
        s=30,
        color="0.2",
        zorder=5,
        label="free-budget agents (own merges/h)",
    )
    order = f.sort_values("sync_excess_pct", ascending=False)
    y_lo, y_hi = ax.get_ylim()
    step = (y_hi - y_lo) * 0.05
    ty = order["sync_excess_pct"].to_numpy(dtype=float).copy()
    for i in range(1, ty.size):
        ty[i] = min(ty[i], ty[i - 1] - step)
    if ty.size and ty[-1] < y_lo + step:
        ty += y_lo + step - ty[-1]
    x_hi = max(float(c.index.max()), float(f["merges_per_hour"].max()))
    for r, y_text in zip(order.itertuples(), ty, strict=True):
        name = r.agent + ("" if r.deployable else " (non-dep.)")
        ax.annotate(
            name,
            (r.merges_per_hour, r.sync_excess_pct),
            xytext=(x_hi * 1.04, y_text),
            textcoords="data",
            fontsize=7,
            va="center",
            arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.6"},
        )
    ax.set_ylim(y_lo, max(y_hi, float(ty.max()) + step) if ty.size else y_hi)
    x_lo = min(float(c.index.min()), float(f["merges_per_hour"].min()))
    ax.set_xlim(x_lo * 0.9, x_hi * 1.35)
