"""diloco_gym/eval/frontier_stats.py on small synthetic tables: the gap captured and its
bootstrap CI, the budget and free tables (paired test against matched random, Holm family,
verdict), the pairwise tests (p-values checked against scipy's sign-flip permutation test,
Holm across the pairs at a budget) and the dominance relation, which is ``inconclusive``
whenever the units cannot reach alpha."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from diloco_gym.eval import frontier_stats as fs
from diloco_gym.eval import protocol


def _holm_reference(p) -> np.ndarray:
    """Holm's step-down adjustment, written out independently of the package."""
    p = np.asarray(p, dtype=float)
    order = np.argsort(p)
    m = p.size
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adjusted
    return out


# --------------------------------------------------------------------------- gap_captured
def test_gap_is_zero_at_random_and_one_at_the_oracle():
    rng = np.random.default_rng(0)
    random = rng.uniform(8.0, 12.0, 10)
    oracle = random - rng.uniform(2.0, 4.0, 10)
    assert fs.gap_captured(random, random, oracle, rng, n_boot=200)["gap"] == pytest.approx(0.0)
    assert fs.gap_captured(oracle, random, oracle, rng, n_boot=200)["gap"] == pytest.approx(1.0)
    half = fs.gap_captured((random + oracle) / 2, random, oracle, rng, n_boot=200)
    assert half["gap"] == pytest.approx(0.5)


def test_gap_ci_brackets_the_gap_and_is_seeded():
    rng = np.random.default_rng(4)
    random = rng.uniform(8.0, 12.0, 15)
    oracle = random - 3.0
    agent = random - rng.uniform(0.0, 3.0, 15)
    a = fs.gap_captured(agent, random, oracle, np.random.default_rng(1), n_boot=2000)
    b = fs.gap_captured(agent, random, oracle, np.random.default_rng(1), n_boot=2000)
    c = fs.gap_captured(agent, random, oracle, np.random.default_rng(2), n_boot=2000)
    assert a == b and a != c  # the CI depends only on the generator
    assert a["ci_low"] < a["gap"] < a["ci_high"]
    assert a["gap"] == pytest.approx((random.mean() - agent.mean()) / 3.0)


def test_gap_ci_matches_scipys_percentile_bootstrap():
    rng = np.random.default_rng(7)
    random = rng.uniform(8.0, 12.0, 30)
    oracle = random - rng.uniform(1.0, 3.0, 30)
    agent = random - rng.uniform(0.0, 2.0, 30)
    got = fs.gap_captured(agent, random, oracle, np.random.default_rng(0), n_boot=20000)

    def ratio(a, r, o, axis=-1):
        return (r.mean(axis) - a.mean(axis)) / (r.mean(axis) - o.mean(axis))

    ref = stats.bootstrap(
        (agent, random, oracle),
        ratio,
        paired=True,
        method="percentile",
        n_resamples=20000,
        random_state=np.random.default_rng(1),
    ).confidence_interval
    assert got["ci_low"] == pytest.approx(ref.low, abs=0.02)
    assert got["ci_high"] == pytest.approx(ref.high, abs=0.02)


def test_gap_is_undefined_when_the_oracle_is_no_better_than_random():
    x = np.array([5.0, 6.0, 7.0])
    out = fs.gap_captured(x - 1, x, x, np.random.default_rng(0))
    assert all(np.isnan(v) for v in out.values()) and set(out) == {"gap", "ci_low", "ci_high"}
    out = fs.gap_captured(x - 1, x, x + 1, np.random.default_rng(0))  # oracle worse
    assert np.isnan(out["gap"])


def test_one_unit_gives_a_degenerate_ci():
    out = fs.gap_captured(
        np.array([9.0]), np.array([10.0]), np.array([6.0]), np.random.default_rng(0)
    )
    assert out == {"gap": 0.25, "ci_low": 0.25, "ci_high": 0.25}


@pytest.mark.parametrize(
    ("a", "r", "o", "shapes"),
    [
        ([1.0, 2.0], [1.0], [1.0, 2.0], "(2,), (1,), (2,)"),
        ([], [], [], "(0,), (0,), (0,)"),
        ([[1.0]], [[1.0]], [[1.0]], "(1, 1), (1, 1), (1, 1)"),
    ],
)
def test_gap_needs_three_equal_1d_arrays(a, r, o, shapes):
    with pytest.raises(
        ValueError,
        match=rf"equal-length 1-D arrays, got shapes {shapes}$".replace("(", r"\(").replace(
            ")", r"\)"
        ),
    ):
        fs.gap_captured(np.array(a), np.array(r), np.array(o), np.random.default_rng(0))


# --------------------------------------------------------------------------- tables
def _rows(diffs: dict, seeds: int, regime: str = "bursty") -> pd.DataFrame:
    """Per (budget_per_hour, agent): ``seeds`` units whose agent-minus-random difference is
    ``diffs[...]`` (a scalar: the same on every unit, or an array)."""
    out = []
    for (per_hour, agent), d in diffs.items():
        d = np.broadcast_to(np.asarray(d, dtype=float), (seeds,))
        for s in range(seeds):
            random = 10.0 + 0.1 * s
            out.append(
                {
                    "regime": regime,
                    "budget_per_hour": per_hour,
                    "budget": int(per_hour // 2),
                    "agent": agent,
                    "seed": s,
                    "held": "budget",
                    "deployable": True,
                    "merges": per_hour // 2,
                    "merges_per_hour": per_hour,
                    "sync_excess_pct": random + d[s],
                    "matched_random_mean": random,
                    "oracle_same_budget_pct": random - 4.0,
                    "no_sync_violation_pct": 5.0,
                }
            )
    return pd.DataFrame(out)


def test_budget_stats_test_gap_and_holm_per_budget():
    rows = _rows({(10.0, "a"): -2.0, (10.0, "b"): 1.0, (20.0, "a"): -1.0}, seeds=8)
    res = fs.budget_stats(rows, {"bursty": "calibrated"})
    assert list(res["agent"]) == ["a", "b", "a"]
    assert list(res["units"]) == [8, 8, 8] and list(res["holm_family"]) == [2, 2, 1]
    np.testing.assert_allclose(res["diff_pp"], [-2.0, 1.0, -1.0])
    np.testing.assert_allclose(res["gap_captured"], [0.5, -0.25, 0.25])
    exact = 2.0 / 2**8  # one sign pattern and its mirror image of 256
    np.testing.assert_allclose(res["p_value"], exact)
    np.testing.assert_allclose(res["p_holm"], [2 * exact, 2 * exact, exact])
    np.testing.assert_allclose(res["p_holm_all_settings"], _holm_reference(res["p_value"]))
    assert list(res["verdict"]) == [
        "placement gain",
        "worse than matched random",
        "placement gain",
    ]
    assert res["rate_clairvoyant_pct"].isna().all()  # no clairvoyant column: undefined


def test_budget_stats_across_settings_is_one_family():
    rows = _rows({(10.0, "a"): -2.0, (10.0, "b"): 1.0, (20.0, "a"): -1.0}, seeds=8)
    res = fs.budget_stats(rows, {"bursty": "calibrated"}, across_settings=True)
    assert list(res["holm_family"]) == [3, 3, 3]
    np.testing.assert_allclose(res["p_holm"], res["p_holm_all_settings"])


def test_budget_stats_too_few_units_is_inconclusive_whatever_the_difference():
    rows = _rows({(10.0, "a"): -50.0, (10.0, "b"): -40.0}, seeds=5)  # 2/32 > 0.05
    res = fs.budget_stats(rows, {"bursty": "calibrated"})
    assert set(res["verdict"]) == {"inconclusive (too few episodes)"}


def test_budget_stats_follow_the_calibration_verdict():
    rows = _rows({(10.0, "a"): -2.0}, seeds=8)
    res = fs.budget_stats(rows, {"bursty": "no measurable SLO effect"})
    assert list(res["verdict"]) == ["no claim (no SLO effect)"]


def test_free_stats_group_by_regime_and_agent():
    noise = np.array([0.3, -0.2, 0.1, -0.4, 0.2, -0.1, 0.4, -0.3])
    diffs = {(10.0, "a"): -2.0, (12.0, "b"): noise, (14.0, "c"): 0.0}
    rows = pd.concat([_rows(diffs, seeds=8, regime=r) for r in ("x", "y")])
    res = fs.free_stats(rows, {"x": "calibrated", "y": "uncalibrated"})
    assert [(r, a) for r, a in zip(res["regime"], res["agent"], strict=True)] == [
        (r, a) for r in ("x", "y") for a in ("a", "b", "c")
    ]
    assert list(res["holm_family"]) == [3] * 6
    np.testing.assert_allclose(res["merges_per_hour"], [10.0, 12.0, 14.0] * 2)
    assert list(res["verdict"]) == [
        "placement gain",
        "tied with matched random",
        "inconclusive (too few episodes)",  # all-zero differences carry no evidence
        *["no claim (uncalibrated)"] * 3,
    ]


def test_empty_rows_give_empty_tables():
    empty = pd.DataFrame()
    assert fs.budget_stats(empty, {}).empty and fs.free_stats(empty, {}).empty
    assert fs.pairwise_stats(empty).empty


def test_holm_scope():
    assert fs.holm_scope({"holm_across_settings": True}).startswith("every regime x budget")
    assert fs.holm_scope({}).startswith("the agents at that budget")


# --------------------------------------------------------------------------- pairwise
def test_pairwise_p_values_match_scipys_sign_flip_test():
    rng = np.random.default_rng(3)
    n = 10
    diffs = {(10.0, "a"): rng.normal(-1.0, 1.0, n), (10.0, "b"): rng.normal(0, 1.0, n)}
    diffs[(10.0, "c")] = rng.normal(0.5, 1.0, n)
    rows = _rows(diffs, seeds=n)
    res = fs.pairwise_stats(rows)
    assert list(zip(res["agent_a"], res["agent_b"], strict=True)) == [
        ("a", "b"),
        ("a", "c"),
        ("b", "c"),
    ]
    wide = rows.pivot(index="seed", columns="agent", values="sync_excess_pct")
    for _, r in res.iterrows():
        d = (wide[r["agent_a"]] - wide[r["agent_b"]]).to_numpy()
        ref = stats.permutation_test(
            (d,), np.mean, permutation_type="samples", n_resamples=np.inf
        ).pvalue
        assert r["p_value"] == pytest.approx(ref, rel=1e-9)
        assert r["diff_pp"] == pytest.approx(d.mean())
    np.testing.assert_allclose(res["p_holm"], _holm_reference(res["p_value"]))
    assert set(res["holm_family"]) == {3}
    np.testing.assert_allclose(res["best_p_holm"], 3 * 2.0 / 2**n)


def test_pairwise_uses_only_the_seeds_both_agents_ran():
    rows = _rows({(10.0, "a"): -1.0, (10.0, "b"): 0.0}, seeds=6)
    rows = rows.drop(rows.index[(rows["agent"] == "b") & (rows["seed"] == 0)])
    (r,) = fs.pairwise_stats(rows).to_dict(orient="records")
    assert r["units"] == 5 and r["min_p"] == pytest.approx(2.0 / 2**5)
    assert r["mean_b"] == pytest.approx(np.mean(10.0 + 0.1 * np.arange(1, 6)))


# --------------------------------------------------------------------------- dominance
def _relation(diffs: dict, seeds: int) -> str:
    pair = fs.pairwise_stats(_rows(diffs, seeds))
    dom = fs.dominance(pd.DataFrame(), pair)
    assert len(dom) == 1
    return dom["relation"].iloc[0]


def test_dominance_relations():
    n = 8  # enough units: 2/256 is below 0.05
    noise = np.array([0.3, -0.2, 0.1, -0.4, 0.2, -0.1, 0.4, -0.3])
    assert (
        _relation({(10.0, "a"): -2.0, (10.0, "b"): 0.0, (20.0, "a"): -1.0, (20.0, "b"): 0.0}, n)
        == "dominates"
    )
    assert _relation({(10.0, "a"): 1.0, (10.0, "b"): 0.0}, n) == "is dominated by"
    flip = {(10.0, "a"): -2.0, (10.0, "b"): 0.0, (20.0, "a"): 2.0, (20.0, "b"): 0.0}
    assert _relation(flip, n) == "no dominance (order changes across budgets)"
    tie = {(10.0, "a"): noise, (10.0, "b"): 0.0}
    assert _relation(tie, n) == "no dominance (no significant difference)"
    assert set(fs.DOMINANCE_VERDICTS) >= {"dominates", "is dominated by"}


@pytest.mark.parametrize("seeds", [1, 2, 5])
def test_dominance_is_inconclusive_when_no_test_can_reach_alpha(seeds):
    """A always lower by a wide margin, but 2/2**n is not below 0.05 for n <= 5: never a
    tie, never a dominance."""
    diffs = {(10.0, "a"): -5.0, (10.0, "b"): 0.0, (20.0, "a"): -5.0, (20.0, "b"): 0.0}
    pair = fs.pairwise_stats(_rows(diffs, seeds))
    assert (pair["best_p_holm"] >= protocol.ALPHA).all() and not pair["significant"].any()
    dom = fs.dominance(pd.DataFrame(), pair)
    assert list(dom["relation"]) == ["inconclusive (too few episodes)"]
    assert dom["a_lower_at"].iloc[0] == [10.0, 20.0] and dom["significant_budgets"].iloc[0] == []


def test_dominance_lists_where_each_agent_is_lower():
    flip = {(10.0, "a"): -2.0, (10.0, "b"): 0.0, (20.0, "a"): 2.0, (20.0, "b"): 0.0}
    dom = fs.dominance(pd.DataFrame(), fs.pairwise_stats(_rows(flip, 8)))
    r = dom.iloc[0]
    assert (r["agent_a"], r["agent_b"], r["budgets"]) == ("a", "b", 2)
    assert r["a_lower_at"] == [10.0] and r["b_lower_at"] == [20.0]
    assert r["significant_budgets"] == [10.0, 20.0]


def test_dominance_of_no_pairs_is_an_empty_table_with_its_columns():
    dom = fs.dominance(pd.DataFrame(), pd.DataFrame())
    assert dom.empty
    assert list(dom.columns) == [
        "regime",
        "agent_a",
        "agent_b",
        "relation",
        "budgets",
        "significant_budgets",
        "a_lower_at",
        "b_lower_at",
    ]
