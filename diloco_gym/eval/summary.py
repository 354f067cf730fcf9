"""The report's summary statistics: one row per regime x agent (means, the paired test
against matched random, the gap captured), the Holm correction and the gate's verdict.

The Holm family is the agents of one regime (one setting) by default; a report that compares
settings (several regimes, rate scales or window lengths) can correct across all of them at
once (:func:`apply_gate`, ``across_settings``), and always reports that correction as
``p_holm_all_settings``.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pandas as pd

from diloco_gym.eval import protocol
from diloco_gym.eval.quality_vs_random import quality_vs_random_stats

__all__ = [
    "summarise",
    "apply_gate",
    "holm",
    "holm_family",
    "scoring_summary",
    "HOLM_PER_SETTING",
    "HOLM_ACROSS_SETTINGS",
]


def _summary_row(
    regime: Any,
    agent: Any,
    g_all: pd.DataFrame,
    calib_verdicts: dict[str, str],
    alpha: float = protocol.ALPHA,
) -> dict[str, Any]:
    """One regime x agent's summary row, before the gate (:func:`summarise`)."""
    # Overlapping windows: the test, its p-value and every summary number below come
    # from the disjoint subset only; the other windows add descriptive means.
    g = g_all[g_all["verdict_unit"].astype(bool)] if "verdict_unit" in g_all else g_all
    diff = (g["sync_excess_pct"] - g["matched_random_mean"]).to_numpy()
    diff_all = (g_all["sync_excess_pct"] - g_all["matched_random_mean"]).to_numpy()
    test = protocol.paired_test(diff, np.random.default_rng(0))
    agent_m = g["sync_excess_pct"].mean()
    mr = g["matched_random_mean"].mean()
    orc = g["oracle_same_budget_pct"].mean()
    gap = mr - orc
    req_per_10min = (g["requests"] * 600.0 / g["duration_s"]).mean()
    row = {
        "regime": regime,
        "agent": agent,
        "episodes": len(g),
        "deployable": bool(g["deployable"].all()) if "deployable" in g else True,
        "unit": g["unit"].iloc[0] if "unit" in g else "seed",
        "units": len(g),
        "independent": bool(g["independent"].all()) if "independent" in g else True,
        "independent_units": (
            int(g["independent_units"].iloc[0]) if "independent_units" in g else len(g)
        ),
        "nonzero_units": test["nonzero"],
        "units_all": len(g_all),
        "diff_pp_all_units": float(diff_all.mean()),
        "merges": g["merges"].mean(),
        "merges_per_hour": g["merges_per_hour"].mean(),
        "sync_excess_pct": agent_m,
        "excess_per_merge_pp": float((g["sync_excess_pct"] / g["merges"].clip(lower=1)).mean()),
        "matched_random_pct": mr,
        "matched_random_p05": g["matched_random_p05"].mean(),
        "matched_random_p95": g["matched_random_p95"].mean(),
        "oracle_same_budget_pct": orc,
        "oracle_lower_bound_pct": (
            g["oracle_lower_bound_pct"].mean() if "oracle_lower_bound_pct" in g else np.nan
        ),
        "diff_pp": test["mean"],
        "diff_ci_low": test["ci_low"],
        "diff_ci_high": test["ci_high"],
        "p_value": test["p_value"],
        "min_p": test["min_p"],
        "diff_requests_per_10min": test["mean"] / 100.0 * req_per_10min,
        "gap_captured": float((mr - agent_m) / gap) if gap > 1e-9 else float("nan"),
        "no_sync_violation_pct": g["no_sync_violation_pct"].mean(),
        "p95_ms": g["p95_ms"].mean(),
        "additive_exact_gap_pp": g["additive_exact_gap_pp"].max(),
        "scoring": _scoring_label(g),
        "oracle_schedule": _oracle_label(g),
        "calibration": calib_verdicts[cast(str, regime)],  # groupby keys are Hashable
    }
    if "quality_cost" in g:  # a learner calibration was given
        row["pred_loss"] = g["pred_loss"].mean()
        row["quality_cost"] = g["quality_cost"].mean()
    if "quality_vs_random" in g:  # ... and the rows priced their matched-random control
        row.update(quality_vs_random_stats(g, alpha))
    return row


def summarise(
    df: pd.DataFrame,
    calib_verdicts: dict[str, str],
    alpha: float,
    saturation_pct: float = protocol.SATURATION_PCT,
    across_settings: bool = False,
) -> pd.DataFrame:
    """One row per regime x agent: means, CI, paired test, gap share, verdict.

    ``units`` is the number of independent paired units (episodes: seeds, or disjoint
    trace windows) behind the test and every summary number; ``independent`` is False for
    overlapping windows, whose test then runs on the disjoint subset picked greedily
    from the first window (``independent_units`` of them; ``units_all`` counts every
    window, and ``diff_pp_all_units`` is their mean difference, descriptive only: never a
    p-value or a verdict). ``nonzero_units`` counts the units whose difference is not
    zero (only they can carry evidence in a sign-flip test), ``best_p_holm`` is the
    smallest Holm-adjusted p they could give across the Holm family (the regime's agents,
    or every row with ``across_settings``: :func:`apply_gate`), ``units_needed``
    the fewest non-zero units for which it is below ``alpha``, and
    ``saturated`` whether the regime's mean no-merge violation rate is above
    ``saturation_pct``. The verdict follows :func:`diloco_gym.eval.protocol.gate_verdict`.
    """
    out = [
        _summary_row(regime, agent, g_all, calib_verdicts, alpha)
        for (regime, agent), g_all in df.groupby(["regime", "agent"], sort=False)
    ]
    return apply_gate(pd.DataFrame(out), calib_verdicts, alpha, saturation_pct, across_settings)


#: report.json ``holm_family``: what one Holm correction covers.
HOLM_PER_SETTING = "the agents of one regime (setting)"


HOLM_ACROSS_SETTINGS = "every agent of every regime (setting) of the report"


def apply_gate(
    df_out: pd.DataFrame,
    calib_verdicts: dict[str, str],
    alpha: float,
    saturation_pct: float = protocol.SATURATION_PCT,
    across_settings: bool = False,
) -> pd.DataFrame:
    """Holm-adjust the summary rows' p-values and give each its verdict.

    The Holm family (``holm_family`` agents) is the agents of one regime by default; with
    ``across_settings`` it is every row of the summary (every agent of every regime, e.g.
    several rate scales or window lengths compared in one report), and the verdicts use that
    stricter correction. ``p_holm_all_settings`` is always the correction across every row,
    so a reader comparing settings can see it even when the verdicts use the per-regime one.
    """
    # Holm-Bonferroni: a report tests many agents at once, and an uncorrected 5 % gate
    # would hand some tied agent a 'verdict' by chance.
    df_out["p_holm"] = np.nan
    df_out["holm_family"] = 0
    df_out["best_p_holm"] = np.nan
    df_out["units_needed"] = 0
    df_out["saturated"] = False
    df_out["p_holm_all_settings"] = holm(df_out["p_value"].to_numpy())
    for _regime, idx in df_out.groupby("regime", sort=False).groups.items():
        # Every agent of a regime replays the same units: one no-merge rate per regime.
        no_sync = df_out.loc[idx, "no_sync_violation_pct"].mean()
        df_out.loc[idx, "saturated"] = bool(no_sync > saturation_pct)
        df_out.loc[idx, "no_sync_violation_pct_regime"] = no_sync
    families = (
        [df_out.index]
        if across_settings
        else list(df_out.groupby("regime", sort=False).groups.values())
    )
    for idx in families:
        family = len(idx)
        df_out.loc[idx, "p_holm"] = holm(df_out.loc[idx, "p_value"].to_numpy())
        df_out.loc[idx, "holm_family"] = family
        # Only the units with a non-zero difference can carry evidence (protocol.nonzero_units).
        n_ev = df_out.loc[idx, "nonzero_units"]
        df_out.loc[idx, "best_p_holm"] = np.minimum(
            1.0, family * np.array([protocol.min_achievable_p(int(n)) for n in n_ev])
        )
        df_out.loc[idx, "units_needed"] = protocol.units_needed(alpha, family)
    df_out["verdict"] = [
        protocol.gate_verdict(
            calib_verdicts[r["regime"]],
            r["diff_pp"],
            r["p_holm"],
            alpha,
            n_units=int(r["units"]),
            n_nonzero=int(r["nonzero_units"]),
            n_tests=int(r["holm_family"]),
            no_sync_violation_pct=r["no_sync_violation_pct_regime"],
            saturation_pct=saturation_pct,
        )
        for _, r in df_out.iterrows()
    ]
    return df_out.drop(columns="no_sync_violation_pct_regime")


#: A local-search oracle (``ORACLE_BOUND``) within this many pp of its episode's certified
#: lower bound is proven optimal (the bound's and the scorer's arithmetic differ in rounding).
ORACLE_BOUND_MET_PP = 1e-9


def oracle_bound_met(rows: pd.DataFrame) -> int:
    """How many rows' oracle is a local search's (``ORACLE_BOUND``: not exact by
    construction) that the certified lower
    bound meets, which proves it optimal (0 where the rows carry no bound; a NaN bound,
    not computed, never meets)."""
    if "oracle_lower_bound_pct" not in rows or "oracle_same_budget_pct" not in rows:
        return 0
    exact = (protocol.ORACLE_EXACT, protocol.ORACLE_ENUMERATED)
    bound = rows[~rows["oracle_schedule"].isin(exact)]
    gap = bound["oracle_same_budget_pct"] - bound["oracle_lower_bound_pct"]
    return int((gap <= ORACLE_BOUND_MET_PP).sum())


def scoring_summary(rows: pd.DataFrame) -> dict[str, Any]:
    """How the report was scored, for report.md / report.json: the method, how many
    agent-episodes were proven additive, in how many the oracle comes from the local search
    (``oracle_upper_bound``), in how many of those the certified lower bound meets it and
    so proves it optimal (``oracle_bound_met``), the largest distance of an oracle to its
    certified lower bound, and the largest additive-exact gap over every scored schedule."""
    n = len(rows)
    known = bool(n) and "oracle_lower_bound_pct" in rows
    bracket = (
        float((rows["oracle_same_budget_pct"] - rows["oracle_lower_bound_pct"]).max())
        if known
        else 0.0
    )
    met = oracle_bound_met(rows) if n else 0
    return {
        "oracle_certified_gap_pp_max": bracket,
        "oracle_bound_met": met,
        "method": "exact replay for agent, matched-random draws and oracle alike",
        "agent_episodes": n,
        "proven_additive": int((rows["scoring"] == protocol.SCORING_PROVEN).sum()) if n else 0,
        "oracle_upper_bound": (
            int((rows["oracle_schedule"] == protocol.ORACLE_BOUND).sum()) if n else 0
        ),
        "largest_additive_exact_gap_pp": float(rows["additive_exact_gap_pp"].max()) if n else 0.0,
    }


def _scoring_label(g: pd.DataFrame) -> str:
    """How a summary row's episodes were scored (every number is the exact replay)."""
    proven = int((g["scoring"] == protocol.SCORING_PROVEN).sum())
    if proven == len(g):
        return protocol.SCORING_PROVEN
    if proven == 0:
        return protocol.SCORING_EXACT
    return f"{protocol.SCORING_EXACT} ({proven} of {len(g)} episodes proven additive)"


def _oracle_label(g: pd.DataFrame) -> str:
    """Whether a summary row's oracle is the exact optimum in every episode."""
    bound = int((g["oracle_schedule"] == protocol.ORACLE_BOUND).sum())
    if bound == 0:
        return protocol.ORACLE_EXACT
    return f"upper bound (best exact schedule found) in {bound} of {len(g)} episodes"


def holm(p: np.ndarray) -> np.ndarray:
    """Holm-Bonferroni adjusted p-values (family-wise error control)."""
    p = np.asarray(p, dtype=np.float64)
    order = np.argsort(p)
    m = p.size
    adj = np.empty(m)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adj[i] = running
    return adj


def holm_family(config: dict[str, Any]) -> str:
    """What one Holm correction covers, for a report's config (report.json ``holm_family``)."""
    return HOLM_ACROSS_SETTINGS if config.get("holm_across_settings") else HOLM_PER_SETTING
