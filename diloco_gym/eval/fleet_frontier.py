"""The budget frontier on a fleet: the fleet report at each merge budget.

For each budget (merges per episode, the env's ``merge_budget``; every episode then has
exactly that many syncs) every agent runs on the same fleet episodes as in
:func:`~diloco_gym.eval.fleet.run_fleet_report`: its sync-excess, matched random at the same
number of syncs (the exact sampler under the fleet corridor), the oracle at the same budget,
the gap captured, the worst site's excess, and the report's gate (non-zero units, Holm over
the deployable agents, per budget). Deployable agents run sealed as in the fleet report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from diloco_gym.eval.fleet import FleetReportConfig, run_fleet_report, with_env

_COLUMNS = [
    "budget",
    "agent",
    "deployable",
    "syncs_per_hour",
    "sync_excess_pct",
    "matched_random_mean",
    "oracle_same_budget_pct",
    "gap_captured",
    "worst_site_sync_excess_pct",
    "diff_pp",
    "p_holm",
    "verdict",
]


@dataclass
class FleetFrontierConfig:
    """A fleet frontier: the fleet report's settings and the merge budgets (per episode)."""

    report: FleetReportConfig
    budgets: list[int]

    def __post_init__(self) -> None:
        if not self.budgets:
            raise ValueError("a fleet frontier needs at least one budget")
        bad = [b for b in self.budgets if not isinstance(b, int) or b < 1]
        if bad:
            raise ValueError(f"budgets must be integers >= 1 (merges per episode), got {bad}")
        if len(set(self.budgets)) != len(self.budgets):
            raise ValueError(f"budgets must be distinct, got {self.budgets}")


def gap_captured(agent: float, random: float, oracle: float) -> float:
    """The share of matched random's excess over the oracle that the agent removes (NaN
    when random and the oracle are equal)."""
    span = random - oracle
    return float((random - agent) / span) if abs(span) > 1e-12 else float("nan")


def run_fleet_frontier(config: FleetFrontierConfig, progress: bool = False) -> dict[str, Any]:
    """Run the fleet report at every budget; returns ``{"frontier", "rows", "fleet",
    "calibration_verdict", "config"}`` (``frontier``: one row per budget and agent)."""
    import pandas as pd

    parts, rows = [], []
    first: dict[str, Any] | None = None
    for b in sorted(config.budgets):
        res = run_fleet_report(with_env(config.report, merge_budget=b), progress=progress)
        first = first or res
        s = res["summary"].copy()
        s.insert(0, "budget", b)
        s["gap_captured"] = [
            gap_captured(r.sync_excess_pct, r.matched_random_mean, r.oracle_same_budget_pct)
            for r in s.itertuples()
        ]
        parts.append(s[_COLUMNS])
        r = res["rows"].copy()
        r.insert(0, "budget", b)
        rows.append(r)
    assert first is not None
    return {
        "frontier": pd.concat(parts, ignore_index=True),
        "rows": pd.concat(rows, ignore_index=True),
        "fleet": first["fleet"],
        "calibration_verdict": first["calibration_verdict"],
        "config": {**first["config"], "budgets": sorted(config.budgets)},
    }


def frontier_table(frontier) -> str:
    """The frontier as a Markdown table."""
    head = (
        "| budget | agent | syncs/h | agent pp | random pp | oracle pp | gap "
        "| worst site pp | verdict |"
    )
    lines = [head, "|" + "---|" * 9]
    for r in frontier.itertuples():
        lines.append(
            f"| {r.budget} | {r.agent} | {r.syncs_per_hour:.1f} | {r.sync_excess_pct:.3f} | "
            f"{r.matched_random_mean:.3f} | {r.oracle_same_budget_pct:.3f} | "
            f"{'' if np.isnan(r.gap_captured) else f'{r.gap_captured:.2f}'} | "
            f"{r.worst_site_sync_excess_pct:.3f} | {r.verdict} |"
        )
    return "\n".join(lines)


def write_fleet_frontier(
    result: dict[str, Any], out: str | Path, force: bool = False, command: str = ""
) -> Path:
    """Write frontier.csv, frontier.json and frontier.md to ``out`` atomically (the
    report's :func:`~diloco_gym.eval.report.write_output_dir`: same ``--force`` rules)."""
    from diloco_gym.eval.report import write_output_dir

    def fill(tmp: Path) -> None:
        result["frontier"].to_csv(tmp / "frontier.csv", index=False)
        payload = {
            "command": command,
            "fleet": result["fleet"],
            "config": result["config"],
            "calibration_verdict": result["calibration_verdict"],
            "frontier": result["frontier"].to_dict(orient="records"),
        }
        (tmp / "frontier.json").write_text(json.dumps(payload, indent=2, default=str))
        md = [
            "# Fleet budget frontier",
            "",
            f"Command: `{command}`" if command else "",
            "",
            f"Fleet `{result['fleet']['file']}`, budgets (merges per episode) "
            f"{result['config']['budgets']}, {result['config']['seeds']} episodes from seed "
            f"{result['config']['seed0']}; calibration verdict "
            f"**{result['calibration_verdict']}**.",
            "",
            frontier_table(result["frontier"]),
        ]
        (tmp / "frontier.md").write_text("\n".join(md) + "\n")

    return write_output_dir(out, force, fill)
