"""The model-quality cost of a schedule against matched random at the same budget.

With a learner calibration (:mod:`diloco_gym.sim.learner_calibration`) every agent-episode
of a report or a frontier is priced by the surrogate's predicted validation loss after its
merges (``pred_loss``). This module prices the episode's **matched-random control** the same
way: ``control_pred_loss`` is the mean predicted loss over the very schedules the protocol
drew for that episode and budget (:func:`diloco_gym.eval.protocol.episode_control`, the
placements behind ``matched_random_mean``), each merge at its decision's start time
(``decision * decision_seconds``, as the env gives an agent's ``merge_times_s``), and
``quality_vs_random = pred_loss - control_pred_loss`` (nats per byte; below zero the agent's
placement leaves a better model than random placement with as many merges).

Summary rows (a report's regime x agent, a frontier's regime x budget x agent and its free
points) carry its mean over the independent units with a 95 % bootstrap interval and the
protocol's paired sign-flip test (:func:`diloco_gym.eval.protocol.paired_test`, the test of
sync-excess against matched random), raw (not Holm-adjusted) and its verdict
(:data:`QUALITY_VERDICTS`): with too few non-zero units to reach alpha it is
``inconclusive (too few episodes)``, never a tie.

:func:`quality_figure` draws both costs against matched random on one figure per regime, from
a frontier's result, its ``frontier.json`` or its ``frontier.csv`` (:func:`write_quality_figures`
redraws them into a folder).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diloco_gym.eval import protocol
from diloco_gym.text import fmt_p, md_text

__all__ = [
    "QUALITY_VERDICTS",
    "control_pred_loss",
    "control_quality_columns",
    "quality_verdict",
    "quality_vs_random_stats",
    "quality_points",
    "quality_figure",
    "quality_figure_name",
    "write_quality_figures",
    "report_quality_lines",
    "frontier_quality_lines",
]

#: The verdicts of an agent's quality cost against matched random (raw paired test).
QUALITY_VERDICTS = (
    "lower loss than matched random",
    "higher loss than matched random",
    "no significant difference",
    "inconclusive (too few episodes)",
)
#: The generator seed of the quality test's bootstrap (the sync-excess test's is 0).
QUALITY_RNG = 4
#: The per-unit columns (frontier.csv) the figure's points are recomputed from.
ROW_COLUMNS = (
    "regime",
    "mode",
    "budget_per_hour",
    "agent",
    "seed",
    "merges_per_hour",
    "sync_excess_pct",
    "matched_random_mean",
    "pred_loss",
    "control_pred_loss",
    "quality_vs_random",
)


def control_pred_loss(schedules: np.ndarray, decision_seconds: float, learner_calibration) -> float:
    """The mean predicted validation loss of a matched-random control's schedules.

    Args:
        schedules: int ``(K, M)`` decision indices, one drawn schedule per row
            (:class:`diloco_gym.eval.protocol.Control`'s ``schedules``).
        decision_seconds: the env's seconds per decision (a merge at decision ``d`` starts
            at ``d * decision_seconds``, as in an agent's ``merge_times_s``).
        learner_calibration: a :class:`~diloco_gym.sim.learner_calibration.LearnerCalibration`.
    """
    from diloco_gym.sim.learner_calibration import env_schedule_losses

    sch = np.asarray(schedules)
    if sch.ndim != 2 or sch.shape[0] == 0:
        raise ValueError(f"control schedules must be a non-empty (K, M) array, got {sch.shape}")
    times = sch.astype(np.float64) * float(decision_seconds)
    return float(env_schedule_losses(times, learner_calibration).mean())


def control_quality_columns(
    learner_calibration, pred_loss: float, control: protocol.Control, decision_seconds: float
) -> dict[str, float]:
    """``control_pred_loss`` and ``quality_vs_random`` of one agent-episode whose predicted
    loss is ``pred_loss``, against the episode's matched-random ``control``."""
    ctrl = control_pred_loss(control.schedules, decision_seconds, learner_calibration)
    return {"control_pred_loss": ctrl, "quality_vs_random": float(pred_loss) - ctrl}


def quality_verdict(test: Mapping[str, Any], alpha: float = protocol.ALPHA) -> str:
    """The verdict of a :func:`~diloco_gym.eval.protocol.paired_test` of ``quality_vs_random``
    (one of :data:`QUALITY_VERDICTS`): inconclusive when even the smallest p its non-zero
    units could give is not below ``alpha``."""
    if not test["min_p"] < alpha:
        return "inconclusive (too few episodes)"
    p = test["p_value"]
    if np.isfinite(p) and p < alpha:
        return (
            "lower loss than matched random"
            if test["mean"] < 0
            else "higher loss than matched random"
        )
    return "no significant difference"


def _mean_interval(values: pd.Series, seed: int, n_boot: int = 5000) -> tuple[float, float]:
    """A 95 % percentile bootstrap interval of the mean over units, drawn as
    :func:`~diloco_gym.eval.protocol.paired_test` draws its interval (no test: a level, not a
    difference); NaN for no unit."""
    v = values.to_numpy(dtype=np.float64)
    if v.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    lo, hi = np.percentile(
        v[rng.integers(0, v.size, size=(n_boot, v.size))].mean(axis=1), [2.5, 97.5]
    )
    return float(lo), float(hi)


def quality_vs_random_stats(g: pd.DataFrame, alpha: float = protocol.ALPHA) -> dict[str, Any]:
    """A summary row's quality cost against matched random over its units (the rows of
    ``g``, in the order given): the mean control loss, the mean ``quality_vs_random`` with its
    95 % bootstrap interval, the paired sign-flip test's p and verdict, and 95 % bootstrap
    intervals of the mean predicted loss and the mean sync-excess (the absolute trade-off's
    error bars)."""
    test = protocol.paired_test(
        g["quality_vs_random"].to_numpy(dtype=np.float64), np.random.default_rng(QUALITY_RNG)
    )
    loss = _mean_interval(g["pred_loss"], QUALITY_RNG + 1)
    serve = _mean_interval(g["sync_excess_pct"], QUALITY_RNG + 2)
    return {
        "pred_loss_ci_low": loss[0],
        "pred_loss_ci_high": loss[1],
        "sync_excess_ci_low": serve[0],
        "sync_excess_ci_high": serve[1],
        "control_pred_loss": float(g["control_pred_loss"].mean()),
        "quality_vs_random": test["mean"],
        "quality_vs_random_ci_low": test["ci_low"],
        "quality_vs_random_ci_high": test["ci_high"],
        "quality_vs_random_p": test["p_value"],
        "quality_vs_random_min_p": test["min_p"],
        "quality_vs_random_nonzero": test["nonzero"],
        "quality_vs_random_verdict": quality_verdict(test, alpha),
    }


# ----------------------------------------------------------------------------- tables
#: The interval columns of the two costs (the serving cost's as the frontier names them).
_CI = {
    "diff_pp": ("diff_ci_low", "diff_ci_high"),
    "quality_vs_random": ("quality_vs_random_ci_low", "quality_vs_random_ci_high"),
    "sync_excess_pct": ("sync_excess_ci_low", "sync_excess_ci_high"),
    "pred_loss": ("pred_loss_ci_low", "pred_loss_ci_high"),
}


def _interval(r: Mapping[Any, Any], col: str, spec: str) -> str:
    lo, hi = _CI[col]
    return f"{format(r[col], spec)} [{format(r[lo], spec)}, {format(r[hi], spec)}]"


_QUALITY_NOTE = (
    "Quality cost against matched random: the agent's predicted loss (nats/byte) minus the "
    "mean predicted loss of the episode's matched-random schedules (the same draws as the "
    "sync-excess control: same merges, random placement), mean over units with a 95 % "
    "bootstrap interval; p: paired sign-flip test over units (not Holm-adjusted); "
    "'inconclusive' when the units could not reach alpha."
)


def report_quality_lines(g: pd.DataFrame) -> list[str]:
    """report.md's table of a regime's agents (summary rows ``g``): quality cost against
    matched random with its interval, the test's p and verdict."""
    lines = [
        "",
        _QUALITY_NOTE,
        "",
        "| agent | merges/h | predicted loss | matched random predicted loss | "
        "quality vs random [95 % CI] | n (non-zero) | p | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for _, r in g.sort_values("sync_excess_pct").iterrows():
        lines.append(
            f"| {md_text(r['agent'])} | {r['merges_per_hour']:.1f} | {r['pred_loss']:.4f} | "
            f"{r['control_pred_loss']:.4f} | {_interval(r, 'quality_vs_random', '+.2e')} | "
            f"{int(r['units'])} ({int(r['quality_vs_random_nonzero'])}) | "
            f"{fmt_p(r['quality_vs_random_p'])} | {r['quality_vs_random_verdict']} |"
        )
    return lines


def frontier_quality_lines(
    budgets: pd.DataFrame, free: pd.DataFrame, regime: str, figure: str | None = None
) -> list[str]:
    """frontier.md's table of a regime (its budget and free summary rows): per agent and
    budget, the serving cost (sync-excess minus matched random) and the quality cost
    against matched random, each with its interval, and the quality test's p and verdict;
    ``figure`` (the two-axis figure's file) is shown above it."""
    pts = _stats_points(_stats_frame(budgets, free))
    pts = pts[pts["regime"] == regime] if not pts.empty else pts
    if pts.empty:
        return []
    lines = ["", "### Serving cost and model quality against matched random", ""]
    if figure:
        lines += [f"![serving and quality cost {md_text(regime)}]({figure})", ""]
    lines += [
        _QUALITY_NOTE,
        "",
        "| agent | budget merges/h | sync-excess vs random pp [95 % CI] | "
        "quality vs random [95 % CI] | n (non-zero) | p | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in pts.to_dict(orient="records"):
        lines.append(
            f"| {md_text(r['agent'])} | {r['budget_label']} | {_interval(r, 'diff_pp', '+.2f')} | "
            f"{_interval(r, 'quality_vs_random', '+.2e')} | {int(r['units'])} "
            f"({int(r['quality_vs_random_nonzero'])}) | {fmt_p(r['quality_vs_random_p'])} | "
            f"{r['quality_vs_random_verdict']} |"
        )
    return lines


# ----------------------------------------------------------------------------- points
def _stats_frame(budgets: Any, free: Any) -> pd.DataFrame:
    """A frontier's budget and free summary rows in one frame (``budget_per_hour`` NaN for
    the free points)."""
    frames = [pd.DataFrame(x) for x in (budgets, free) if x is not None and len(x)]
    frames = [f for f in frames if "quality_vs_random" in f]
    if not frames:
        return pd.DataFrame()
    out = pd.concat(frames, ignore_index=True)
    if "budget_per_hour" not in out:
        out["budget_per_hour"] = np.nan
    return out


def _stats_points(s: pd.DataFrame) -> pd.DataFrame:
    """Summary rows with a ``budget_label`` (``72/h`` or ``free``), ordered by regime,
    agent (the budget-held agents first, in their order, then the free ones) and budget
    (free last)."""
    if s.empty:
        return s
    s = s.copy()
    bph = pd.to_numeric(s["budget_per_hour"], errors="coerce")
    s["budget_label"] = [f"{x:g}/h" if np.isfinite(x) else "free" for x in bph]
    s["_order"] = bph.fillna(np.inf)
    free = bph.isna().to_numpy()
    agents = list(dict.fromkeys([*s["agent"][~free], *s["agent"][free]]))
    s["_agent"] = [agents.index(a) for a in s["agent"]]
    s = s.sort_values(["regime", "_agent", "_order"], kind="stable")
    return s.drop(columns=["_order", "_agent"]).reset_index(drop=True)


def _rows_to_stats(rows: pd.DataFrame, alpha: float) -> pd.DataFrame:
    """Per-unit frontier rows (frontier.csv) to one summary row per regime x mode x budget
    x agent, with the same tests (and bootstrap seeds) as the frontier's tables."""
    out = []
    keys = ["regime", "mode", "budget_per_hour", "agent"]
    for key, g in rows.groupby(keys, sort=False, dropna=False):
        g = g.sort_values("seed")
        serve = protocol.paired_test(
            (g["sync_excess_pct"] - g["matched_random_mean"]).to_numpy(dtype=np.float64),
            np.random.default_rng(0),
        )
        out.append(
            {
                **dict(zip(keys, key, strict=True)),
                "units": len(g),
                "merges_per_hour": float(g["merges_per_hour"].mean()),
                "sync_excess_pct": float(g["sync_excess_pct"].mean()),
                "diff_pp": serve["mean"],
                "diff_ci_low": serve["ci_low"],
                "diff_ci_high": serve["ci_high"],
                "pred_loss": float(g["pred_loss"].mean()),
                **quality_vs_random_stats(g, alpha),
            }
        )
    res = pd.DataFrame(out)
    res.loc[res["mode"] == "free", "budget_per_hour"] = np.nan
    return res


def _load(source: Any) -> tuple[Any, str]:
    """A frontier.json (parsed) or frontier.csv (a frame) from a path; other sources as
    they are. Returns the source and its name for errors."""
    if not isinstance(source, str | Path):
        return source, "frontier result"
    path = Path(source)
    try:
        if path.suffix.lower() == ".json":
            return json.loads(path.read_text(encoding="utf-8")), str(path)
        return pd.read_csv(path), str(path)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read a frontier's rows: {exc}") from None


_NEEDED = ("regime", "agent", "units", *_CI, *(c for pair in _CI.values() for c in pair))


def quality_points(source: Any, alpha: float = protocol.ALPHA) -> pd.DataFrame:
    """The two-axis figure's points: one summary row per regime x agent x budget (and free
    point), with the serving cost ``diff_pp`` (sync-excess minus matched random, pp) and
    the quality cost ``quality_vs_random`` (nats/byte), each with ``_ci_low`` /
    ``_ci_high``, and a ``budget_label``.

    Args:
        source: a :func:`~diloco_gym.eval.frontier.run_frontier` result or a parsed
            frontier.json (their ``budgets`` and ``free`` tables), a frame of per-unit rows
            (frontier.csv: the tables are recomputed with the frontier's tests and seeds)
            or of summary rows, or a path to a frontier.json or frontier.csv.

    Raises:
        ValueError: one line naming the file and the missing field (a frontier run
            without ``--learner-calibration`` has no ``quality_vs_random``).
    """
    src, where = _load(source)
    if isinstance(src, Mapping):
        if "budgets" not in src and "free" not in src:
            raise ValueError(f"{where}: field 'budgets': not a frontier result")
        stats = _stats_frame(src.get("budgets"), src.get("free"))
        if stats.empty:
            raise ValueError(
                f"{where}: field 'quality_vs_random': absent (run the frontier with "
                "--learner-calibration)"
            )
    elif isinstance(src, pd.DataFrame):
        if "quality_vs_random" not in src:
            raise ValueError(
                f"{where}: field 'quality_vs_random': absent (run the frontier with "
                "--learner-calibration)"
            )
        if "seed" in src:  # per-unit rows
            missing = [c for c in ROW_COLUMNS if c not in src]
            if missing:
                raise ValueError(f"{where}: field {missing[0]!r}: absent")
        stats = _rows_to_stats(src, alpha) if "seed" in src else src
    else:
        raise ValueError(f"{where}: a frontier result, frame or file path is needed")
    missing = [c for c in _NEEDED if c not in stats]
    if missing:
        raise ValueError(f"{where}: field {missing[0]!r}: absent")
    return _stats_points(stats)


# ----------------------------------------------------------------------------- figure
#: The agents' colours, in order: the frontier figure's, then one more.
AGENT_COLORS = (
    "tab:blue",
    "tab:green",
    "tab:red",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:olive",
    "tab:cyan",
    "tab:gray",
    "tab:orange",
)


def _errors(pts: pd.DataFrame, col: str) -> np.ndarray:
    """``(2, n)`` error-bar lengths of ``col`` from its interval (0 where undefined)."""
    v = pts[col].to_numpy(dtype=np.float64)
    lo = v - pts[_CI[col][0]].to_numpy(dtype=np.float64)
    hi = pts[_CI[col][1]].to_numpy(dtype=np.float64) - v
    return np.nan_to_num(np.clip(np.vstack([lo, hi]), 0.0, None))


def _draw_points(ax: Any, pts: pd.DataFrame, x: str, y: str) -> None:
    """One marker per agent and budget of ``pts`` at ``(x, y)`` (circle: a budget of the
    grid, diamond: the agent's free point), with both columns' 95 % intervals as bars."""
    for i, (agent, g) in enumerate(pts.groupby("agent", sort=False)):
        color = AGENT_COLORS[i % len(AGENT_COLORS)]
        for free, h in g.groupby(g["budget_label"] == "free", sort=True):
            ax.errorbar(
                h[x],
                h[y],
                xerr=_errors(h, x),
                yerr=_errors(h, y),
                fmt="D" if free else "o",
                ms=5,
                color=color,
                elinewidth=0.9,
                capsize=2,
                label=f"{agent}{' (free)' if free else ''}",
                zorder=3,
            )
        for r in g.itertuples():
            ax.annotate(
                r.budget_label,
                (getattr(r, x), getattr(r, y)),
                xytext=(4, 4),
                textcoords="offset points",
                fontsize=6,
                color=color,
            )


def quality_figure(source: Any, regime: str, alpha: float = protocol.ALPHA):
    """The serving-cost x model-quality trade-off of one regime (a matplotlib ``Figure``,
    drawn without pyplot), in two panels with one marker per agent and budget (circle: a
    budget of the grid, diamond: the agent's free point) and 95 % interval error bars on
    both axes (over units).

    Left, the trade-off itself: x the sync-excess (% of requests), y the predicted
    validation loss after the episode's merges (nats/byte; lower is a better model).
    Right, both against matched random at the same merges: x sync-excess minus matched
    random (pp), y predicted loss minus matched random's (nats/byte), with a zero line on
    each axis. ``source``: see :func:`quality_points`.
    """
    from matplotlib.figure import Figure

    every = quality_points(source, alpha)
    pts = every[every["regime"] == regime]
    if pts.empty:
        raise ValueError(
            f"field 'regime': no point of {regime!r} (regimes: {sorted(set(every['regime']))})"
        )
    fig = Figure(figsize=(13.0, 5.6))
    left, ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    _draw_points(left, pts, "sync_excess_pct", "pred_loss")
    left.set_xlabel("serving cost: sync-excess (% of requests)")
    left.set_ylabel("model quality: predicted validation loss (nats/byte; lower is better)")
    left.set_title(f"{regime}: the trade-off", fontsize=9)
    ax.axhline(0.0, color="0.4", lw=0.9, zorder=1)
    ax.axvline(0.0, color="0.4", lw=0.9, zorder=1)
    _draw_points(ax, pts, "diff_pp", "quality_vs_random")
    ax.set_xlabel("serving cost: sync-excess minus matched random (pp of requests)")
    ax.set_ylabel("quality cost: predicted loss minus matched random's (nats/byte)")
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    units = int(pts["units"].max()) if "units" in pts else 0
    ax.set_title(
        f"{regime}: both against matched random at the same merges "
        f"(95 % intervals over {units} units)",
        fontsize=9,
    )
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def quality_figure_name(regime: str) -> str:
    """The two-axis figure's file name of ``regime`` (``frontier_quality_<regime>.png``)."""
    return f"frontier_quality_{regime.replace(':', '_')}.png"


def write_quality_figures(
    source: Any, out: str | Path, alpha: float = protocol.ALPHA, dpi: int = 90
) -> dict[str, str]:
    """Draw :func:`quality_figure` for every regime of ``source`` into the folder ``out``
    (made if absent); returns ``{regime: file name}``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    pts = quality_points(source, alpha)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    names = {}
    for regime in dict.fromkeys(pts["regime"]):
        fig = quality_figure(pts, regime, alpha)
        FigureCanvasAgg(fig)
        fig.savefig(out / quality_figure_name(regime), dpi=dpi)
        names[regime] = quality_figure_name(regime)
    return names
