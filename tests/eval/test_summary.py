"""The report's summary statistics (diloco_gym.eval.summary): the Holm family per regime or
across every setting of a report, and the gate's verdict from it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from diloco_gym.eval import summary as sm


def _summary_rows(p_values: dict[tuple[str, str], float], nonzero: int = 12) -> pd.DataFrame:
    """Summary rows as summarise builds them, before the gate: one per regime x agent."""
    return pd.DataFrame(
        [
            {
                "regime": regime,
                "agent": agent,
                "units": nonzero,
                "nonzero_units": nonzero,
                "diff_pp": -1.0,
                "p_value": p,
                "no_sync_violation_pct": 5.0,
            }
            for (regime, agent), p in p_values.items()
        ]
    )


P = {
    ("bursty", "a"): 0.004,
    ("bursty", "b"): 0.02,
    ("sync-heavy", "a"): 0.011,
    ("sync-heavy", "b"): 0.3,
}
VERDICTS = {"bursty": "calibrated", "sync-heavy": "calibrated"}


def test_holm_is_the_step_down_adjustment():
    p = np.array([0.01, 0.04, 0.03, 0.2])
    # sorted 0.01, 0.03, 0.04, 0.2 -> 4*0.01, max(., 3*0.03), max(., 2*0.04), max(., 0.2)
    assert sm.holm(p) == pytest.approx([0.04, 0.09, 0.09, 0.2])


def test_per_regime_family_by_default():
    out = sm.apply_gate(_summary_rows(P), VERDICTS, 0.05)
    assert set(out["holm_family"]) == {2}
    b = out.set_index(["regime", "agent"])
    assert b.loc[("bursty", "b"), "p_holm"] == pytest.approx(0.02)  # max(2*0.004, 1*0.02)
    assert b.loc[("sync-heavy", "a"), "p_holm"] == pytest.approx(0.022)
    # the correction across every setting is reported beside it either way
    assert out["p_holm_all_settings"].to_numpy() == pytest.approx(
        sm.holm(np.array(list(P.values())))
    )
    assert b.loc[("bursty", "b"), "verdict"] == "placement gain"


def test_across_settings_family_changes_the_verdicts():
    per = sm.apply_gate(_summary_rows(P), VERDICTS, 0.05).set_index(["regime", "agent"])
    allf = sm.apply_gate(_summary_rows(P), VERDICTS, 0.05, across_settings=True)
    assert set(allf["holm_family"]) == {4}
    assert allf["p_holm"].to_numpy() == pytest.approx(allf["p_holm_all_settings"].to_numpy())
    a = allf.set_index(["regime", "agent"])
    # 0.004, 0.011, 0.02, 0.3 -> 0.016, 0.033, 0.04, 0.3 across the four
    assert a.loc[("bursty", "b"), "p_holm"] == pytest.approx(0.04)
    assert a.loc[("sync-heavy", "a"), "p_holm"] == pytest.approx(0.033)
    assert per.loc[("sync-heavy", "a"), "p_holm"] == pytest.approx(0.022)
    # the family's size enters the 'too few units' gate too: 7 non-zero units reach
    # 2 * 2 / 2**7 = 0.031 < 0.05 per regime, but 4 * 2 / 2**7 = 0.0625 across settings
    few = sm.apply_gate(_summary_rows(P, nonzero=7), VERDICTS, 0.05, across_settings=True)
    assert few["best_p_holm"].to_numpy() == pytest.approx(np.full(4, 4 * 2 / 2**7))
    assert set(few["verdict"]) == {"inconclusive (too few episodes)"}
    per7 = sm.apply_gate(_summary_rows(P, nonzero=7), VERDICTS, 0.05)
    assert per7["best_p_holm"].to_numpy() == pytest.approx(np.full(4, 2 * 2 / 2**7))
    assert "inconclusive (too few episodes)" not in set(per7["verdict"])


def test_holm_family_label():
    assert sm.holm_family({}) == sm.HOLM_PER_SETTING
    assert sm.holm_family({"holm_across_settings": True}) == sm.HOLM_ACROSS_SETTINGS
