"""The ``summary.md`` of ``diloco-gym sweep`` (:mod:`diloco_gym.scale.sweep`): the summary
table of every point and agent, the failed cells and the points not complete yet."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from diloco_gym.scale import fleet_points

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["sweep_markdown"]

#: The summary's columns for a single-host sweep (after the point and its axes).
REPORT_COLUMNS = [
    "agent",
    "units",
    "nonzero_units",
    "sync_excess_pct",
    "matched_random_pct",
    "diff_pp",
    "p_holm",
    "p_holm_all_points",
    "verdict",
]
#: The rounds columns summary.md shows for a sweep with rounds points.
_ROUNDS_MD = ["dropped_contributions", "token_share_mean"]
_FLEET_NOTE = (
    " Fleet points: sync-excess in pp of all the fleet's requests, matched random and the "
    "oracle at the agent's syncs; worst_site_sync_excess_pct: the worst site's own "
    "sync-excess (pp of its requests)."
)
_ROUNDS_NOTE = (
    " Rounds points (per-site timing): a sync is a round, the oracle is the additive "
    "optimum, an upper bound with no certified lower bound; dropped_contributions (per "
    "episode) and token_share_mean are the rounds' means."
)


def sweep_markdown(
    name: str, file_name: str, n_points: int, axes: list[str], fleet: bool
) -> Callable[[pd.DataFrame, list[dict], list[str]], str]:
    """The renderer of the sweep ``name`` (its file's name, its number of points, its axes,
    whether its points are fleet points): ``render(summary, errors, notes)`` -> the text."""

    def render(summary: pd.DataFrame, errors: list[dict], notes: list[str]) -> str:
        from diloco_gym.eval.fleet_rounds import is_rounds

        lines = [
            f"# Sweep {name}",
            "",
            f"Sweep file: `{file_name}`; {n_points} point(s) over {', '.join(axes) or 'no axis'}.",
            "",
        ]
        if not summary.empty:
            agent_cols = fleet_points.MARKDOWN_COLUMNS if fleet else REPORT_COLUMNS
            rounds = fleet and is_rounds(summary)
            if rounds:  # before p_holm: the rounds' drops and token share
                at = agent_cols.index("p_holm")
                agent_cols = [*agent_cols[:at], *_ROUNDS_MD, *agent_cols[at:]]
            cols = ["point", *(f"grid.{k}" for k in axes), *agent_cols]
            lines += [
                "p_holm is Holm-adjusted across the agents of one point (the family the "
                "verdict uses); p_holm_all_points across every agent of every point of this "
                "sweep (use it when comparing settings). nonzero_units: units whose "
                "difference is not exactly zero (only they carry evidence)."
                + (_FLEET_NOTE if fleet else "")
                + (_ROUNDS_NOTE if rounds else ""),
                "",
            ]
            lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
            for _, r in summary.iterrows():
                cells = (f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c]) for c in cols)
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
        if errors:
            lines += [f"## Failed cells ({len(errors)})", ""]
            lines += [f"- point {e['point']}, {e['cell']}: {e['error']}" for e in errors] + [""]
        if notes:
            lines += ["## Incomplete", ""] + [f"- {n}" for n in notes] + [""]
        return "\n".join(lines)

    return render
