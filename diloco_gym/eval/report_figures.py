"""The report's figures (:func:`write_figures`): per regime the agents against their
matched-random envelope and sync-excess against merge rate, and one episode's timeline.

Drawn on Figures of their own Agg canvas, without pyplot."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["write_figures", "figure_name"]


def _new_figure(figsize: tuple[float, float]) -> Figure:
    """A matplotlib Figure on its own Agg canvas.

    Built directly rather than through pyplot, so that writing a report neither switches
    the calling process's backend (``matplotlib.use``) nor registers figures with pyplot.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig


def write_figures(result: dict[str, Any], out: Path, sync: str = "merge") -> list[str]:
    """Save every figure of ``result`` to ``out``: one per regime, then one timeline per
    regime that recorded one; returns the file names in that order. ``sync``: what the
    rate axis counts (a fleet's report says ``sync``)."""
    names: list[str] = []
    for regime, g in result["summary"].groupby("regime", sort=False):
        _save(_regime_figure(str(regime), g, sync), out, figure_name(regime), names)
    for regime, tl in result.get("timelines", {}).items():
        _save(_timeline_figure(regime, tl), out, f"timeline_{_slug(regime)}.png", names)
    return names


def _slug(regime: Any) -> str:
    """A regime's name as it appears in a file name (``replay:x`` -> ``replay_x``)."""
    return str(regime).replace(":", "_")


def figure_name(regime: Any) -> str:
    """The file name of a regime's figure (``fig_<regime>.png``)."""
    return f"fig_{_slug(regime)}.png"


def _regime_figure(regime: str, g: pd.DataFrame, sync: str = "merge") -> Figure:
    """One regime's two panels: the agents against their matched-random envelope, and
    sync-excess against merge rate (or, where the regime makes no claim, why not)."""
    g = g.sort_values("sync_excess_pct")
    fig = _new_figure((12, 4.2))
    ax, ax2 = fig.subplots(1, 2)
    why = _no_claim_reason(g)
    if why is not None:
        _no_claim_panels(ax, ax2, regime, why)
        return fig
    _envelope_panel(ax, g, regime)
    _rate_panel(fig, ax2, g, sync)
    fig.tight_layout()
    return fig


def _no_claim_panels(ax: Axes, ax2: Axes, regime: str, why: str) -> None:
    """Panels that say there is no claim, and why.

    A bar chart of zeros on an auto-scaled +-0.04 axis reads like a result; the honest
    content of such a panel is the absence of a claim.
    """
    for a, title, note in (
        (ax, f"{regime}: agent vs its matched-random envelope", why),
        (ax2, "sync-excess vs merge rate", ""),
    ):
        a.set_axis_off()
        a.set_title(title)
        a.text(
            0.5,
            0.6,
            "no claim: no SLO effect",
            ha="center",
            va="center",
            fontsize=16,
            transform=a.transAxes,
        )
        a.text(
            0.5,
            0.42,
            textwrap.fill(note, 60),
            ha="center",
            va="center",
            fontsize=9,
            transform=a.transAxes,
        )


def _envelope_panel(ax: Axes, g: pd.DataFrame, regime: str) -> None:
    """Each agent's sync-excess (bars, the CI of its difference as error bars) beside its
    matched random (mean, 5-95 %) and the oracle at the same budget."""
    x = np.arange(len(g))
    yerr = np.vstack(
        [
            g["sync_excess_pct"] - (g["matched_random_pct"] + g["diff_ci_low"]),
            (g["matched_random_pct"] + g["diff_ci_high"]) - g["sync_excess_pct"],
        ]
    )
    ax.bar(
        x,
        g["sync_excess_pct"],
        color="tab:blue",
        alpha=0.8,
        label="agent",
        yerr=np.clip(yerr, 0, None),
        capsize=3,
    )
    ax.errorbar(
        x + 0.3,
        g["matched_random_pct"],
        yerr=[
            g["matched_random_pct"] - g["matched_random_p05"],
            g["matched_random_p95"] - g["matched_random_pct"],
        ],
        fmt="o",
        color="tab:orange",
        label="matched random (mean, 5-95 %)",
    )
    ax.plot(x, g["oracle_same_budget_pct"], "k_", markersize=14, label="oracle @ same budget")
    ax.set_xticks(x, g["agent"], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("sync-excess SLO violations (pp)")
    ax.set_title(f"{regime}: agent vs its matched-random envelope")
    ax.legend(fontsize=7)


def _rate_panel(fig: Figure, ax2: Axes, g: pd.DataFrame, sync: str = "merge") -> None:
    """Sync-excess against merge rate.

    The frontier as the report samples it: matched random's and the oracle's sync-excess
    at each agent's own merge rate (exact, from the same replays), so a point below the
    orange line gains by placement, not by merging less. The full curves on a budget grid,
    with budget-held agents: ``diloco-gym frontier``.
    """
    by_rate = g.sort_values("merges_per_hour")
    ax2.plot(
        by_rate["merges_per_hour"],
        by_rate["matched_random_pct"],
        "o--",
        color="tab:orange",
        markersize=4,
        label="matched random at the agent's rate",
    )
    ax2.plot(
        by_rate["merges_per_hour"],
        by_rate["oracle_same_budget_pct"],
        "s:",
        color="black",
        markersize=4,
        label="oracle at the agent's rate",
    )
    ax2.scatter(g["merges_per_hour"], g["sync_excess_pct"], color="tab:blue")
    _annotate_points(
        fig,
        ax2,
        g["merges_per_hour"].to_numpy(),
        g["sync_excess_pct"].to_numpy(),
        list(g["agent"]),
    )
    ax2.set_xlabel(f"{sync}s per hour (budget)")
    ax2.set_ylabel("sync-excess (pp)")
    ax2.set_title(f"sync-excess vs {sync} rate (below orange: placement gain)")
    ax2.legend(fontsize=7)


def _timeline_figure(regime: str, tl: dict[str, Any]) -> Figure:
    """One episode of ``regime``: the request rate, each agent's merge windows and the
    requests that miss their SLO only because of a merge."""
    from diloco_gym.envs.render import plot_timeline_panels

    fig = _new_figure((12, 3 + 0.4 * len(tl["schedules"])))
    plot_timeline_panels(fig, tl["episode"], tl["schedules"], tl["params"], tl["sidecar"])
    fig.suptitle(
        f"{regime}, seed {tl['seed']}: request rate (top); each agent's merge "
        f"windows (bars) and the requests that miss their SLO only because of "
        f"a merge (black ticks)",
        fontsize=10,
    )
    fig.subplots_adjust(left=0.12, right=0.88, top=0.88, bottom=0.08)
    return fig


def _save(fig, out: Path, name: str, names: list[str]) -> None:
    fig.savefig(out / name, dpi=90)
    names.append(name)


def _no_claim_reason(g: pd.DataFrame) -> str | None:
    """Why a regime's panels carry no chart (``None``: draw it).

    Args:
        g: the regime's summary rows.
    """
    if g["verdict"].astype(str).str.startswith("no claim (no SLO effect)").all():
        return (
            "the real sidecar showed no measurable merge effect in this regime, so no "
            "agent's SLO numbers are a claim"
        )
    values = g[
        ["sync_excess_pct", "matched_random_pct", "matched_random_p95", "oracle_same_budget_pct"]
    ].to_numpy(dtype=float)
    if np.all(np.abs(values[np.isfinite(values)]) < 1e-9):
        return (
            "merges cause no extra SLO violations here: every agent, matched random and "
            "the oracle are at 0.00 pp"
        )
    return None


def _annotate_points(
    fig, ax, x: np.ndarray, y: np.ndarray, labels: list[str], fontsize: float = 7.0
) -> None:
    """Label scatter points without overprinting.

    Points within a few points of each other on the page share one label (their names
    joined); a label that would overlap one already placed moves down line by line, with
    a thin leader line to its point.
    """
    fig.tight_layout()
    ax.set_xlim(ax.get_xlim())  # freeze the limits: the labels must not move them
    ax.set_ylim(ax.get_ylim())
    pos = ax.get_position()
    w_pt = pos.width * fig.get_figwidth() * 72.0
    h_pt = pos.height * fig.get_figheight() * 72.0
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    px = (np.asarray(x, float) - x0) / (x1 - x0) * w_pt
    py = (np.asarray(y, float) - y0) / (y1 - y0) * h_pt
    line_pt = fontsize * 1.3
    char_pt = fontsize * 0.6
    groups: list[list[int]] = []
    for i in sorted(range(len(labels)), key=lambda k: (-py[k], px[k])):
        for grp in groups:
            j = grp[0]
            if abs(px[i] - px[j]) < 6.0 and abs(py[i] - py[j]) < 6.0:
                grp.append(i)
                break
        else:
            groups.append([i])
    placed: list[tuple[float, float, float]] = []  # (x start, x end, y) of labels, in points

    # the points themselves are obstacles too: a label must not sit on another point
    dots = list(zip(px, py, strict=True))

    def free(x_lo: float, x_hi: float, yy: float) -> bool:
        return (
            x_lo >= 0.0
            and x_hi <= w_pt
            and 0.0 <= yy <= h_pt
            and not any(x_lo < b1 and a0 < x_hi and abs(yy - y2) < line_pt for a0, b1, y2 in placed)
            and not any(
                x_lo - 3.0 < dx < x_hi + 3.0 and abs(yy - dy) < line_pt * 0.8 for dx, dy in dots
            )
        )

    # right of the point, a line below or above it, left of it, then further down
    candidates = [
        (1, 3.0),
        (1, 3.0 - line_pt),
        (1, 3.0 + line_pt),
        (-1, 3.0),
        (-1, 3.0 - line_pt),
    ] + [(side, 3.0 - k * line_pt) for k in range(2, 40) for side in (1, -1)]
    for grp in groups:
        j = grp[0]
        text = ", ".join(labels[k] for k in grp)
        width = char_pt * len(text)
        side, dy, x_lo = 1, 3.0, px[j] + 5.0
        for cand_side, cand_dy in candidates:
            lo = px[j] + 5.0 if cand_side > 0 else px[j] - 5.0 - width
            if free(lo, lo + width, py[j] + cand_dy):
                side, dy, x_lo = cand_side, cand_dy, lo
                break
        placed.append((x_lo, x_lo + width, py[j] + dy))
        ax.annotate(
            text,
            (x[j], y[j]),
            xytext=(5.0 * side, dy),
            textcoords="offset points",
            fontsize=fontsize,
            va="center",
            ha="left" if side > 0 else "right",
            arrowprops={"arrowstyle": "-", "lw": 0.6, "color": "0.35"}
            if abs(dy - 3.0) > line_pt / 2
            else None,
        )
