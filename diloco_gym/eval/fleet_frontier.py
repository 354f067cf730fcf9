"""The budget frontier on a fleet: the fleet report at each merge budget.

For each budget (merges per episode, the env's ``merge_budget``; every episode then has
exactly that many syncs) every agent runs on the same fleet episodes as in
:func:`~diloco_gym.eval.report.run_protocol`: its sync-excess, matched random at the same
number of syncs (the exact sampler under the fleet corridor), the oracle at the same budget,
the worst site's excess. The statistics are the single-host frontier's, over the episodes
that are independent units, with the fleet as one setting (:func:`fleet_stats`): per budget
each agent against matched random (paired test, Holm over the agents of the budget, the
gate's verdict, the gap captured with its bootstrap interval), and the agents against each
other (:func:`agents_compared`): every pair at every budget, and dominance across budgets.
Deployable agents run sealed as in the fleet report.

**Free-budget points** (``free_agents``), as on a single host: each agent runs as it is,
with no merge budget, on the same episodes, and is one point at its own syncs per hour
with matched random and the oracle at its own number of syncs: the fleet report's rows
and the single-host frontier's free-point statistics (:func:`free_points`), drawn over the
budget curves.

On a fleet with per-site timing (``timing = "rounds"``) a sync is a round: the budget counts
rounds (a round's opening is the fleet env's merge, under the same corridor and budget),
each budget is scored as the report scores rounds (:mod:`diloco_gym.eval.fleet_rounds`:
matched random keeps each round's contributing sites, the oracle is the additive optimum,
an upper bound with no certified lower bound, and is labelled so), and the frontier adds
the rounds' columns (:data:`~diloco_gym.eval.fleet_rounds.ROUNDS_SUMMARY_COLUMNS`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from diloco_gym.eval import fleet_rounds
from diloco_gym.eval.fleet import FleetReportConfig, with_env
from diloco_gym.eval.fleet_render import (
    FleetFiles,
    fleet_summary_table,
    oracle_label,
    oracle_note,
    write_fleet_dir,
)

_COLUMNS = [
    "budget",
    "agent",
    "deployable",
    "syncs_per_hour",
    "sync_excess_pct",
    "matched_random_mean",
    "oracle_same_budget_pct",
    "gap_captured",
    "gap_ci_low",
    "gap_ci_high",
    "worst_site_sync_excess_pct",
    "diff_pp",
    "units",
    "nonzero_units",
    "p_holm",
    "verdict",
]


@dataclass
class FleetFrontierConfig:
    """A fleet frontier: the fleet report's settings (its ``agents`` run at every budget),
    the merge budgets (per episode) and the agents run at their own rate
    (``free_agents``; none by default)."""

    report: FleetReportConfig
    budgets: list[int]
    free_agents: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        from diloco_gym.agents.registry import is_budget_aware_spec

        aware = [a for a in self.free_agents if is_budget_aware_spec(a)]
        if aware:
            raise ValueError(
                f"budget-aware agent(s) {aware} need a merge budget: give them as budget "
                f"agents (run at every budget), not free ones"
            )
        if not self.budgets:
            raise ValueError("a fleet frontier needs at least one budget")
        bad = [b for b in self.budgets if not isinstance(b, int) or b < 1]
        if bad:
            raise ValueError(f"budgets must be integers >= 1 (merges per episode), got {bad}")
        if len(set(self.budgets)) != len(self.budgets):
            raise ValueError(f"budgets must be distinct, got {self.budgets}")


#: The single-host frontier table's names of the columns a fleet names after its syncs.
_SYNC_NAMES = {
    "merges": "syncs",
    "merges_per_hour": "syncs_per_hour",
    "matched_random_pct": "matched_random_mean",
    "oracle_pct": "oracle_same_budget_pct",
}


def frontier_stats_rows(rows: Any, verdict_seeds: list[int], held: str) -> Any:
    """A fleet frontier's rows as the single-host frontier's statistics read them
    (:mod:`~diloco_gym.eval.frontier_stats`): the episodes that are independent units, the
    fleet as one setting (``regime``), syncs under the single host's names, the budget's
    syncs per hour and how the agents held it (``held``: ``mask`` or ``free``)."""
    from diloco_gym.eval.fleet import FLEET_SETTING

    units = rows[rows["seed"].isin(set(verdict_seeds))].copy()
    units["regime"] = FLEET_SETTING
    units["held"] = held
    units["merges"] = units["syncs"]
    units["merges_per_hour"] = units["syncs_per_hour"]
    if "budget" in units:  # every agent of a budget runs exactly that many syncs
        units["budget_per_hour"] = units.groupby("budget")["syncs_per_hour"].transform("mean")
    return units


def fleet_stats(units: Any, keys: list[str], verdict: str, alpha: float) -> Any:
    """The single-host frontier's table of ``units`` (:func:`frontier_stats_rows`): per
    budget (``keys`` has ``budget``) or per free agent, each agent against matched random
    with the paired test, Holm across the agents of the budget, the gate's verdict with the
    fleet's calibration verdict ``verdict`` and the gap captured with its bootstrap
    interval; then the fleet's own means (worst site, rounds) and its names of the columns
    in syncs."""
    import pandas as pd

    from diloco_gym.eval.frontier_stats import budget_stats, free_stats

    calib = {units["regime"].iloc[0]: verdict}
    table = (budget_stats if "budget" in keys else free_stats)(units, calib, alpha)
    extra = []
    for _, g in units.groupby(keys, sort=False):
        extra.append(
            {
                "worst_site_sync_excess_pct": float(g["worst_site_sync_excess_pct"].mean()),
                **fleet_rounds.rounds_summary(g),
            }
        )
    table = pd.concat([table, pd.DataFrame(extra)], axis=1)
    return table.rename(columns=_SYNC_NAMES)


def run_fleet_frontier(
    config: FleetFrontierConfig, progress: bool = False, **backend: Any
) -> dict[str, Any]:
    """Deprecated: :func:`diloco_gym.eval.frontier.run_frontier` runs a fleet frontier (give
    it this ``config``) and returns the same result. Kept for one release, after a
    ``FutureWarning``; it runs the frontier's own steps."""
    import time
    import warnings

    from diloco_gym.eval.cells import run_report_cells
    from diloco_gym.eval.fleet import fleet_cell

    warnings.warn(
        "diloco_gym.eval.fleet_frontier.run_fleet_frontier is deprecated and will be removed "
        "in the next release; call diloco_gym.eval.frontier.run_frontier(config), which runs "
        "a fleet frontier for a FleetFrontierConfig",
        FutureWarning,
        stacklevel=2,
    )
    started = time.perf_counter()
    reports, cells = frontier_cells(config)
    result = frontier_result(
        config, reports, run_report_cells(fleet_cell, cells, progress, **backend)
    )
    result["elapsed_s"] = time.perf_counter() - started
    return result


def frontier_cells(config: FleetFrontierConfig) -> tuple[list[FleetReportConfig], list[Any]]:
    """A fleet frontier's reports and their cells: the fleet report at each budget of
    ``config`` in increasing order, then, with free agents, theirs without a budget; and
    every report's cells (:func:`~diloco_gym.eval.fleet.fleet_cells`: a pool's workers take
    the episodes of all budgets), with the fleet's calibration once (it does not read the
    merge budget: the same sites, sidecars and sync window at every budget). The agents
    are checked here, before any cell runs."""
    from diloco_gym.eval.fleet import agent_names, fleet_cells

    reports = [with_env(config.report, merge_budget=b) for b in sorted(config.budgets)]
    if config.free_agents:
        free = with_env(config.report, merge_budget=None)
        reports.append(replace(free, agents=list(config.free_agents)))
    agent_names(reports[0])  # the budget agents (the same at every budget)
    if config.free_agents:
        agent_names(reports[-1])
    cells: list[Any] = []
    for i, report in enumerate(reports):
        cells += fleet_cells(report)[0 if i == 0 else 1 :]
    return reports, cells


def frontier_result(
    config: FleetFrontierConfig, reports: list[FleetReportConfig], done: list[dict[str, Any]]
) -> dict[str, Any]:
    """A fleet frontier's result from its cells' results ``done`` (in the order of
    :func:`frontier_cells`): ``{"frontier", "free", "free_rows", "rows", "pairwise",
    "dominance", "fleet", "calibration_verdict", "config"}`` (``frontier``: one row per
    budget and agent; ``free``: :func:`free_points`; ``pairwise`` and ``dominance``:
    :func:`agents_compared`)."""
    import pandas as pd

    from diloco_gym.eval.fleet import fleet_result

    calibration, episodes = done[0], done[1:]
    n = config.report.seeds
    results = [
        fleet_result(report, [calibration, *episodes[i * n : (i + 1) * n]])
        for i, report in enumerate(reports)
    ]
    budgets = sorted(config.budgets)
    rows = []
    for b, res in zip(budgets, results, strict=False):
        r = res["rows"].copy()
        r.insert(0, "budget", b)
        rows.append(r)
    first = results[0]
    all_rows = pd.concat(rows, ignore_index=True)
    alpha = config.report.alpha
    units = frontier_stats_rows(all_rows, first["verdict_seeds"], "mask")
    table = fleet_stats(units, ["regime", "budget_per_hour", "budget", "agent"],
                        first["calibration_verdict"], alpha)  # fmt: skip
    pairwise, dom = agents_compared(units, alpha)
    free, free_rows = free_points(config, results[len(budgets)] if config.free_agents else None)
    return {
        "frontier": table[
            _COLUMNS + [c for c in fleet_rounds.ROUNDS_SUMMARY_COLUMNS if c in table]
        ],
        "free": free,
        "free_rows": free_rows,
        "rows": all_rows,
        "pairwise": pairwise,
        "dominance": dom,
        "fleet": first["fleet"],
        "calibration_verdict": first["calibration_verdict"],
        "config": {
            **first["config"],
            "env": dict(config.report.env),  # without the first budget's merge_budget
            "budgets": budgets,
        },
    }


#: The rounds' columns a rounds fleet's tables add.
ROUNDS_COLUMNS = list(fleet_rounds.ROUNDS_SUMMARY_COLUMNS)
#: A free-budget point's columns (the budget table's but the budget).
FREE_COLUMNS = [c for c in _COLUMNS if c != "budget"]


def free_points(config: FleetFrontierConfig, res: dict[str, Any] | None) -> tuple[Any, Any]:
    """The free-budget points: ``(points, rows)`` of ``res``, the fleet report of
    ``free_agents`` with no merge budget on the frontier's episodes
    (:func:`frontier_result`): one row per agent at its own syncs per hour, with the gap
    captured and its interval (:func:`fleet_stats`), and the report's per-episode rows.
    Two empty tables without free agents (``res`` is ``None``)."""
    import pandas as pd

    if res is None:
        return pd.DataFrame(columns=FREE_COLUMNS), pd.DataFrame()
    units = frontier_stats_rows(res["rows"], res["verdict_seeds"], "free")
    s = fleet_stats(units, ["regime", "agent"], res["calibration_verdict"], config.report.alpha)
    extra = [c for c in ROUNDS_COLUMNS if c in s]
    return s[FREE_COLUMNS + extra].reset_index(drop=True), res["rows"]


def agents_compared(units: Any, alpha: float) -> tuple[Any, Any]:
    """The agents against each other, by the single-host frontier's statistics
    (:func:`~diloco_gym.eval.frontier_stats.pairwise_stats` and
    :func:`~diloco_gym.eval.frontier_stats.dominance`): at each budget every pair's paired
    test of sync-excess over the episodes that are independent units (``units``:
    :func:`frontier_stats_rows`, with trace sites the first seed of each tile), Holm across
    the pairs at that budget;
    then whether one agent dominates another across the budgets, or "inconclusive (too few
    episodes)" when no test could reach ``alpha``."""
    from diloco_gym.eval.frontier_stats import dominance, pairwise_stats

    pairwise = pairwise_stats(units, alpha)
    return pairwise, dominance(units, pairwise, alpha)


def comparison_lines(pairwise: Any, dom: Any) -> list[str]:
    """frontier.md's "Agents against each other": the dominance relation of every pair, and
    the significant pairwise differences (Holm within each budget)."""
    if pairwise is None or len(pairwise) == 0:
        return []
    lines = [
        "## Agents against each other",
        "",
        "Paired tests of sync-excess over the independent episodes, Holm across the pairs at "
        "each budget (the single-host frontier's statistics).",
        "",
        "| agent A | relation | agent B | budgets | significant at (syncs/h) |",
        "|---|---|---|---|---|",
    ]
    for r in dom.itertuples():
        sig = ", ".join(f"{x:g}" for x in r.significant_budgets) or "none"
        lines.append(f"| {r.agent_a} | {r.relation} | {r.agent_b} | {r.budgets} | {sig} |")
    return lines + [""]


def free_lines(free: Any, fleet: dict[str, Any]) -> list[str]:
    """frontier.md's "Free-budget points": each free agent at its own syncs per hour, as
    the fleet report's table (none without free agents)."""
    if free is None or len(free) == 0:
        return []
    return [
        "## Free-budget points",
        "",
        "Each agent as it runs, with no merge budget, on the same episodes: matched random "
        "and the oracle at its own number of syncs (the fleet report's statistics).",
        "",
        fleet_summary_table(free, fleet["worst_site_weight"], fleet.get("site_cap_pp") is not None),
        "",
    ]


def frontier_table(frontier, worst_site_weight: float = 0.0) -> str:
    """The frontier as a Markdown table (the oracle column labelled by
    :func:`~diloco_gym.eval.fleet_render.oracle_label`; the gap is captured toward that oracle).
    A rounds fleet's frontier (:func:`~diloco_gym.eval.fleet_rounds.is_rounds`) labels the
    oracle an upper bound and adds the contributions dropped per episode and the mean
    token share merged."""
    rounds = fleet_rounds.is_rounds(frontier)
    head = (
        f"| budget | agent | syncs/h | agent pp | random pp | "
        f"{oracle_label(worst_site_weight, rounds=rounds)} | gap | worst site pp | "
        + ("dropped per episode | token share | " if rounds else "")
        + "verdict |"
    )
    lines = [head, "|" + "---|" * (11 if rounds else 9)]
    for r in frontier.itertuples():
        more = f"{r.dropped_contributions:.2f} | {r.token_share_mean:.3f} | " if rounds else ""
        lines.append(
            f"| {r.budget} | {r.agent} | {r.syncs_per_hour:.1f} | {r.sync_excess_pct:.3f} | "
            f"{r.matched_random_mean:.3f} | {r.oracle_same_budget_pct:.3f} | "
            f"{_gap(r.gap_captured, *_ci(r))} | "
            f"{r.worst_site_sync_excess_pct:.3f} | {more}{r.verdict} |"
        )
    return "\n".join(lines)


def _ci(r: Any) -> tuple[float, float]:
    """A frontier row's gap interval (NaN for a table written without one)."""
    return float(getattr(r, "gap_ci_low", np.nan)), float(getattr(r, "gap_ci_high", np.nan))


def _gap(gap: float, low: float, high: float) -> str:
    """``0.35 [0.30, 0.40]``; blank where the gap is undefined."""
    if np.isnan(gap):
        return ""
    return f"{gap:.2f}" + ("" if np.isnan(low) else f" [{low:.2f}, {high:.2f}]")


def _curve_labels(fleet: dict[str, Any]) -> tuple[str, str]:
    """The figure's labels of matched random and the oracle (a rounds fleet's oracle is
    the additive optimum, an upper bound: not an exact DP)."""
    if fleet.get("timing") == "rounds":
        return (
            "matched random (same rounds and sites)",
            "oracle (additive optimum, upper bound; non-deployable)",
        )
    oracle = oracle_label(fleet["worst_site_weight"])[: -len(" pp")]
    return "matched random (same syncs)", oracle + " (exact DP, non-deployable)"


def fleet_frontier_figure(result: dict[str, Any]):
    """The fleet frontier (a matplotlib ``Figure``, drawn without pyplot): left, the fleet's
    sync-excess against the budget in syncs per hour, one line per agent, matched random
    and the oracle at the same budget; right, each agent's worst-site sync-excess."""
    from matplotlib.figure import Figure

    f = result["frontier"]
    per_budget = f.groupby("budget")[
        ["syncs_per_hour", "matched_random_mean", "oracle_same_budget_pct"]
    ].mean()
    fig = Figure(figsize=(11.0, 4.8))
    ax, worst = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    x = per_budget["syncs_per_hour"]
    random_label, oracle_curve = _curve_labels(result["fleet"])
    for col, color, label in (
        ("matched_random_mean", "tab:orange", random_label),
        ("oracle_same_budget_pct", "black", oracle_curve),
    ):
        ax.plot(x, per_budget[col], "-s", ms=4, color=color, lw=2.5, alpha=0.7, label=label)
    colors = ["tab:blue", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink"]
    for i, (agent, g) in enumerate(f.groupby("agent", sort=False)):
        g = g.sort_values("budget")
        style: dict[str, Any] = {
            "marker": "o",
            "ms": 4,
            "lw": 1.6,
            "color": colors[i % len(colors)],
        }
        ax.plot(g["syncs_per_hour"], g["sync_excess_pct"], label=agent, **style)
        worst.plot(g["syncs_per_hour"], g["worst_site_sync_excess_pct"], label=agent, **style)
    free = result.get("free")
    for i, r in enumerate([] if free is None else list(free.itertuples())):
        style = {"marker": "D", "ms": 6, "ls": "none", "color": f"C{(i + 3) % 10}"}
        ax.plot([r.syncs_per_hour], [r.sync_excess_pct], label=f"{r.agent} (own rate)", **style)
        worst.plot([r.syncs_per_hour], [r.worst_site_sync_excess_pct], **style)
    n = result["config"]["seeds"]
    ax.set_title(f"fleet sync-excess ({n} episodes per budget)", fontsize=10)
    ax.set_ylabel("sync-excess (pp of the fleet's requests)")
    worst.set_title("worst site's own sync-excess", fontsize=10)
    worst.set_ylabel("sync-excess (pp of the site's requests)")
    for a in (ax, worst):
        a.set_xlabel("syncs per hour (the budget, or an agent's own rate)")
        a.legend(fontsize=7, loc="upper left")
        a.grid(color="0.9", lw=0.6)
    fig.suptitle(f"Fleet frontier: {result['fleet']['file']}", fontsize=11)
    fig.tight_layout()
    return fig


def _more_files(result: dict[str, Any], tmp: Path) -> None:
    """frontier.png, pairwise.csv (every pair of agents at every budget) and free.csv (the
    free-budget points, when there are any)."""
    _save_figure(fleet_frontier_figure(result), tmp / "frontier.png")
    free = result.get("free")
    if free is not None and len(free):
        free.to_csv(tmp / "free.csv", index=False)
    pairwise = result.get("pairwise")
    if pairwise is not None and len(pairwise):
        pairwise.to_csv(tmp / "pairwise.csv", index=False)


def _records(table: Any) -> list[dict[str, Any]]:
    return [] if table is None else table.to_dict(orient="records")


def _save_figure(fig, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=90)


def write_fleet_frontier(
    result: dict[str, Any], out: str | Path, force: bool = False, command: str = ""
) -> Path:
    """Write frontier.csv, frontier.json, frontier.md, frontier.png
    (:func:`fleet_frontier_figure`) and pairwise.csv (:func:`agents_compared`) to ``out``
    atomically
    (:func:`~diloco_gym.eval.fleet_render.write_fleet_dir`: the report's ``--force`` rules)."""
    fleet = result["fleet"]
    rounds = fleet.get("timing") == "rounds"
    body = [
        f"Fleet `{fleet['file']}`, budgets ({'rounds' if rounds else 'merges'} per episode) "
        f"{result['config']['budgets']}, {result['config']['seeds']} episodes from seed "
        f"{result['config']['seed0']}; calibration verdict "
        f"**{result['calibration_verdict']}**."
        + (" " + oracle_note(fleet["worst_site_weight"], rounds)).rstrip(),
        "",
        *([fleet_rounds.rounds_paragraph(fleet), ""] if rounds else []),
        frontier_table(result["frontier"], fleet["worst_site_weight"]),
        "",
        *comparison_lines(result.get("pairwise"), result.get("dominance")),
        *free_lines(result.get("free"), fleet),
        "![fleet frontier](frontier.png)",
    ]
    files = FleetFiles(
        "frontier.csv",
        result["frontier"],
        "frontier.json",
        {
            "frontier": result["frontier"].to_dict(orient="records"),
            "pairwise": _records(result.get("pairwise")),
            "dominance": _records(result.get("dominance")),
            "free": _records(result.get("free")),
        },
        "frontier.md",
        "Fleet budget frontier",
        body,
        more=lambda tmp: _more_files(result, tmp),
    )
    return write_fleet_dir(result, out, force, command, files)
