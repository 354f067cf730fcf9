"""The frontier's statistics: per budget, each agent against matched random (paired
sign-flip test, Holm, verdict, gap captured with a bootstrap CI), every pair of agents, and
the dominance relation between agents across budgets.

The Holm family of the budget table is the agents at one regime x budget by default, or
every regime x budget x agent of the frontier with ``across_settings``;
``p_holm_all_settings`` always gives the latter.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pandas as pd

from diloco_gym.eval import protocol
from diloco_gym.eval.quality_vs_random import quality_vs_random_stats

__all__ = [
    "DOMINANCE_VERDICTS",
    "N_BOOT",
    "gap_captured",
    "holm_scope",
    "budget_stats",
    "free_stats",
    "pairwise_stats",
    "dominance",
]

#: The relations :func:`dominance` gives a pair of agents.
DOMINANCE_VERDICTS = (
    "dominates",
    "is dominated by",
    "no dominance (order changes across budgets)",
    "no dominance (no significant difference)",
    "inconclusive (too few episodes)",
)
#: Bootstrap resamples of the gap-captured CI.
N_BOOT = 5000


def gap_captured(
    agent: np.ndarray,
    random: np.ndarray,
    oracle: np.ndarray,
    rng: np.random.Generator,
    n_boot: int = N_BOOT,
) -> dict[str, float]:
    """Share of the random-to-oracle gap an agent captures, with a bootstrap CI over units.

    ``gap = (mean(random) - mean(agent)) / (mean(random) - mean(oracle))``: 0 is random
    placement, 1 the oracle. The CI resamples the paired units (rows) with replacement and
    takes the 2.5th and 97.5th percentiles of the resampled ratio; resamples whose oracle is
    no better than random are left out. Undefined (NaN) when the oracle is no better than
    random on the units given.
    """
    a, r, o = (np.asarray(x, dtype=np.float64) for x in (agent, random, oracle))
    if not (a.shape == r.shape == o.shape) or a.ndim != 1 or a.size == 0:
        raise ValueError(
            f"gap_captured needs three equal-length 1-D arrays, got shapes "
            f"{a.shape}, {r.shape}, {o.shape}"
        )
    den = r.mean() - o.mean()
    if not den > 1e-9:
        return {"gap": float("nan"), "ci_low": float("nan"), "ci_high": float("nan")}
    idx = rng.integers(0, a.size, size=(n_boot, a.size))
    num_b = r[idx].mean(axis=1) - a[idx].mean(axis=1)
    den_b = r[idx].mean(axis=1) - o[idx].mean(axis=1)
    ok = den_b > 1e-9
    ratio = num_b[ok] / den_b[ok]
    lo, hi = np.percentile(ratio, [2.5, 97.5]) if ratio.size else (np.nan, np.nan)
    return {"gap": float((r.mean() - a.mean()) / den), "ci_low": float(lo), "ci_high": float(hi)}


def _holm(p: np.ndarray) -> np.ndarray:
    from diloco_gym.eval.summary import holm

    return holm(p) if np.size(p) else np.asarray(p, dtype=np.float64)


def holm_scope(config: dict[str, Any]) -> str:
    """What one Holm correction of the budget table covers (frontier.md, frontier.json)."""
    if config.get("holm_across_settings"):
        return "every regime x budget x agent of this frontier"
    return "the agents at that budget (`p_holm_all_settings` in frontier.json: across all)"


def _reachable(g: pd.DataFrame) -> dict[str, float]:
    """The rate-clairvoyant reference of a group of rows (:mod:`diloco_gym.eval.clairvoyant`)
    and the share of the random-to-reference gap the agent captures, with its bootstrap CI
    (NaN where the reference is undefined: a replayed trace)."""
    nan = float("nan")
    if "rate_clairvoyant_pct" not in g or not np.isfinite(g["rate_clairvoyant_pct"]).all():
        return {k: nan for k in _REACHABLE}
    reach = gap_captured(
        g["sync_excess_pct"].to_numpy(),
        g["matched_random_mean"].to_numpy(),
        g["rate_clairvoyant_pct"].to_numpy(),
        np.random.default_rng(3),
    )
    return {
        "rate_clairvoyant_pct": float(g["rate_clairvoyant_pct"].mean()),
        "gap_captured_reachable": reach["gap"],
        "reachable_ci_low": reach["ci_low"],
        "reachable_ci_high": reach["ci_high"],
    }


_REACHABLE = (
    "rate_clairvoyant_pct",
    "gap_captured_reachable",
    "reachable_ci_low",
    "reachable_ci_high",
)


def _agent_table(
    df: pd.DataFrame,
    keys: list[str],
    calib_verdicts: dict[str, str],
    alpha: float,
    across_settings: bool = False,
) -> pd.DataFrame:
    """Per ``keys`` group of agents: means, paired test vs matched random, gap captured;
    Holm across the agents of each group (``keys`` minus ``agent``), or with
    ``across_settings`` across every row of the table (``p_holm_all_settings``, always
    given, is that correction)."""
    out = []
    for key, g in df.groupby(keys, sort=False):
        g = g.sort_values("seed")
        diff = (g["sync_excess_pct"] - g["matched_random_mean"]).to_numpy()
        test = protocol.paired_test(diff, np.random.default_rng(0))
        gap = gap_captured(
            g["sync_excess_pct"].to_numpy(),
            g["matched_random_mean"].to_numpy(),
            g["oracle_same_budget_pct"].to_numpy(),
            np.random.default_rng(1),
        )
        out.append(
            {
                **dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True)),
                "held": g["held"].iloc[0],
                "deployable": bool(g["deployable"].all()),
                "units": len(g),
                "merges": g["merges"].mean(),
                "merges_per_hour": g["merges_per_hour"].mean(),
                "sync_excess_pct": g["sync_excess_pct"].mean(),
                "matched_random_pct": g["matched_random_mean"].mean(),
                "oracle_pct": g["oracle_same_budget_pct"].mean(),
                "diff_pp": test["mean"],
                "diff_ci_low": test["ci_low"],
                "diff_ci_high": test["ci_high"],
                "p_value": test["p_value"],
                "nonzero_units": test["nonzero"],
                "gap_captured": gap["gap"],
                "gap_ci_low": gap["ci_low"],
                "gap_ci_high": gap["ci_high"],
                **_reachable(g),
                "no_sync_violation_pct": g["no_sync_violation_pct"].mean(),
            }
        )
        if "quality_cost" in g:  # a learner calibration was given
            out[-1]["pred_loss"] = g["pred_loss"].mean()
            out[-1]["quality_cost"] = g["quality_cost"].mean()
        if "quality_vs_random" in g:  # ... and the rows priced their matched-random control
            out[-1].update(quality_vs_random_stats(g, alpha))
    res = pd.DataFrame(out)
    if res.empty:
        return res
    family_keys = [k for k in keys if k != "agent"]
    res["p_holm"] = np.nan
    res["holm_family"] = 0
    res["verdict"] = ""
    res["p_holm_all_settings"] = _holm(res["p_value"].to_numpy())
    groups = res.groupby(family_keys if len(family_keys) > 1 else family_keys[0], sort=False)
    for idx in [res.index] if across_settings else list(groups.groups.values()):
        k = len(idx)
        res.loc[idx, "p_holm"] = _holm(res.loc[idx, "p_value"].to_numpy())
        res.loc[idx, "holm_family"] = k
    # Every agent of a group replays the same units: one no-merge rate per group.
    no_sync_of = groups["no_sync_violation_pct"].transform("mean")
    for i in res.index:
        r = res.loc[i]
        res.loc[i, "verdict"] = protocol.gate_verdict(
            calib_verdicts[r["regime"]],
            r["diff_pp"],
            r["p_holm"],
            alpha,
            n_units=int(r["units"]),
            n_nonzero=int(r["nonzero_units"]),
            n_tests=int(r["holm_family"]),
            no_sync_violation_pct=no_sync_of.loc[i],
        )
    return res


def budget_stats(
    rows: pd.DataFrame,
    calib_verdicts: dict[str, str],
    alpha: float = protocol.ALPHA,
    across_settings: bool = False,
) -> pd.DataFrame:
    """One row per regime x budget x budget-held agent: sync-excess, matched random, oracle,
    the paired test against matched random (Holm across the agents at that budget), the
    verdict and the gap captured with its bootstrap CI. With ``across_settings`` the Holm
    family is every regime x budget x agent row instead."""
    if rows.empty:
        return pd.DataFrame()
    return _agent_table(
        rows,
        ["regime", "budget_per_hour", "budget", "agent"],
        calib_verdicts,
        alpha,
        across_settings,
    )


def free_stats(
    rows: pd.DataFrame,
    calib_verdicts: dict[str, str],
    alpha: float = protocol.ALPHA,
    across_settings: bool = False,
) -> pd.DataFrame:
    """The free-budget points: one row per regime x agent at its own merges per hour
    (Holm across the free agents of a regime, or with ``across_settings`` across every
    regime's), as the report computes them."""
    if rows.empty:
        return pd.DataFrame()
    return _agent_table(rows, ["regime", "agent"], calib_verdicts, alpha, across_settings)


def pairwise_stats(rows: pd.DataFrame, alpha: float = protocol.ALPHA) -> pd.DataFrame:
    """Every pair of budget-held agents at every regime x budget: paired test of
    ``A - B`` sync-excess over the seeds both ran, Holm across the pairs at that budget.

    ``best_p_holm`` is the smallest Holm-adjusted p the units could give (the family size
    times :func:`~diloco_gym.eval.protocol.min_achievable_p`); when it is not below ``alpha``
    no difference at that budget can be significant.
    """
    out = []
    if rows.empty:
        return pd.DataFrame()
    for (regime, per_hour, m), g in rows.groupby(
        ["regime", "budget_per_hour", "budget"], sort=False
    ):
        wide = g.pivot_table(index="seed", columns="agent", values="sync_excess_pct", sort=False)
        names = list(dict.fromkeys(g["agent"]))
        block = []
        for a, b in itertools.combinations(names, 2):
            both = wide[[a, b]].dropna()
            diff = (both[a] - both[b]).to_numpy()
            test = protocol.paired_test(diff, np.random.default_rng(2))
            block.append(
                {
                    "regime": regime,
                    "budget_per_hour": per_hour,
                    "budget": m,
                    "agent_a": a,
                    "agent_b": b,
                    "units": len(diff),
                    "mean_a": float(both[a].mean()),
                    "mean_b": float(both[b].mean()),
                    "diff_pp": test["mean"],
                    "diff_ci_low": test["ci_low"],
                    "diff_ci_high": test["ci_high"],
                    "p_value": test["p_value"],
                    "min_p": test["min_p"],
                }
            )
        if block:
            p_holm = _holm(np.array([r["p_value"] for r in block]))
            for r, ph in zip(block, p_holm, strict=True):
                r["p_holm"] = float(ph)
                r["holm_family"] = len(block)
                r["best_p_holm"] = min(1.0, len(block) * r["min_p"])
                r["significant"] = bool(np.isfinite(ph) and ph < alpha)
            out.extend(block)
    return pd.DataFrame(out)


def dominance(
    budgets: pd.DataFrame, pairwise: pd.DataFrame, alpha: float = protocol.ALPHA
) -> pd.DataFrame:
    """The dominance relation between budget-held agents, per regime.

    A dominates B when at every budget both ran A's mean sync-excess is no higher than B's
    and at least one of those differences is significant (pairwise Holm-adjusted
    p < ``alpha``). Otherwise: ``no dominance (order changes across budgets)`` when some
    difference is significant but the other agent is lower at another budget,
    ``no dominance (no significant difference)`` when no difference at any budget is
    significant (enough units to find one), and ``inconclusive (too few episodes)`` when no
    pairwise test at any budget could reach ``alpha`` with the units given (then a missing
    significance says nothing, and it is never called a tie).

    Args:
        budgets: :func:`budget_stats` (unused beyond the agents' order; kept for callers
            that pass both tables).
        pairwise: :func:`pairwise_stats`.

    Returns:
        One row per regime x ordered pair ``(agent_a, agent_b)`` (each unordered pair once,
        in the order of the input): ``relation`` (one of :data:`DOMINANCE_VERDICTS`, read
        "agent_a RELATION agent_b"), ``budgets`` compared, ``significant_budgets`` (where
        the pairwise difference is significant) and ``a_lower_at`` / ``b_lower_at``.
    """
    out = []
    if pairwise.empty:
        return pd.DataFrame(
            columns=[
                "regime",
                "agent_a",
                "agent_b",
                "relation",
                "budgets",
                "significant_budgets",
                "a_lower_at",
                "b_lower_at",
            ]
        )
    for (regime, a, b), g in pairwise.groupby(["regime", "agent_a", "agent_b"], sort=False):
        d = g["mean_a"].to_numpy() - g["mean_b"].to_numpy()
        sig = g["significant"].to_numpy(bool)
        bud = g["budget_per_hour"].to_numpy()
        reachable = bool((g["best_p_holm"] < alpha).any())
        a_le = bool(np.all(d <= 0))
        b_le = bool(np.all(d >= 0))
        if a_le and (sig & (d < 0)).any():
            rel = "dominates"
        elif b_le and (sig & (d > 0)).any():
            rel = "is dominated by"
        elif not reachable:
            rel = "inconclusive (too few episodes)"
        elif sig.any():
            rel = "no dominance (order changes across budgets)"
        else:
            rel = "no dominance (no significant difference)"
        out.append(
            {
                "regime": regime,
                "agent_a": a,
                "agent_b": b,
                "relation": rel,
                "budgets": len(g),
                "significant_budgets": [float(x) for x in bud[sig]],
                "a_lower_at": [float(x) for x in bud[d < 0]],
                "b_lower_at": [float(x) for x in bud[d > 0]],
            }
        )
    return pd.DataFrame(out)
