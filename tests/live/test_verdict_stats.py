"""The statistics of a live verdict (:mod:`diloco_gym.live.verdict_stats`): the protocol's
paired test on live and simulated differences, the verdict wording, the rank correlation,
the power sentence, the Markdown lines and the figure."""

from __future__ import annotations

import json

import numpy as np
import pytest

from diloco_gym.eval.protocol import paired_test
from diloco_gym.live.verdict_stats import (
    INCONCLUSIVE,
    closed_loop_summary,
    markdown_section,
    plot_verdicts,
    verdict_summary,
)


def _windows(diffs, m=3, sim_diffs=None, seed=0):
    """Live and simulated excess whose agent-minus-random-mean differences are ``diffs``
    (and ``sim_diffs``, default ``diffs``)."""
    rng = np.random.default_rng(seed)
    k = len(diffs)
    r_live = rng.uniform(1.0, 3.0, size=(k, m))
    r_sim = r_live + rng.normal(0.0, 0.2, size=(k, m))
    a_live = r_live.mean(axis=1) + np.asarray(diffs, dtype=float)
    sd = np.asarray(diffs if sim_diffs is None else sim_diffs, dtype=float)
    a_sim = r_sim.mean(axis=1) + sd
    return a_live, r_live, a_sim, r_sim


def test_five_windows_are_inconclusive_never_tied():
    s = verdict_summary(*_windows([0.5, 0.7, 0.2, 0.9, 0.4]))
    for side in ("live", "sim"):
        assert s[side]["verdict"] == INCONCLUSIVE
        assert s[side]["min_p"] == 0.0625 and s[side]["p_value"] == 0.0625
    assert s["verdicts_agree"] is True
    assert s["power"]["min_p"] == 0.0625 and s["power"]["units_needed"] == 6
    assert s["power"]["sentence"] == (
        "5 windows: the smallest p this test can give is 0.0625; below 6 windows no "
        "difference can reach p < 0.05"
    )


def test_eight_windows_lower_excess_is_a_placement_gain():
    diffs = [-0.5, -0.7, -0.2, -0.9, -0.4, -0.6, -0.3, -0.8]
    s = verdict_summary(*_windows(diffs))
    assert s["live"]["verdict"] == "placement gain"
    assert s["live"]["p_value"] == pytest.approx(2 / 2**8)
    assert s["live"]["mean"] == pytest.approx(np.mean(diffs))
    assert s["live"]["diffs"] == pytest.approx(diffs)
    assert s["live"]["ci_high"] < 0
    # the opposite sign is worse than matched random
    w = verdict_summary(*_windows([-d for d in diffs]))
    assert w["live"]["verdict"] == "worse than matched random"


def test_tied_only_when_the_test_could_have_decided():
    diffs = [0.5, -0.4, 0.3, -0.6, 0.2, -0.1, 0.4, -0.3]
    s = verdict_summary(*_windows(diffs))
    assert s["live"]["min_p"] < 0.05 <= s["live"]["p_value"]
    assert s["live"]["verdict"] == "tied with matched random"
    # a zero difference carries no evidence: 6 windows with one at 0 cannot reach 0.05
    z = verdict_summary(*_windows([-0.5, -0.7, -0.2, -0.9, -0.4, 0.0]))
    assert z["live"]["nonzero"] == 5 and z["live"]["min_p"] == 0.0625
    assert z["live"]["verdict"] == INCONCLUSIVE
    assert z["power"]["sentence"].startswith("6 windows (5 with a non-zero difference): ")


def test_live_and_sim_verdicts_agreement_and_effect_ratio():
    diffs = [-0.5, -0.7, -0.2, -0.9, -0.4, -0.6, -0.3, -0.8]
    sim = [-1.0, -1.4, 0.4, -1.8, -0.8, -1.2, -0.6, -1.6]
    s = verdict_summary(*_windows(diffs, sim_diffs=sim))
    assert s["sim"]["mean"] == pytest.approx(np.mean(sim))
    assert s["agreement"]["per_window"] == [True, True, False] + [True] * 5
    assert s["agreement"]["agreeing"] == 7 and s["agreement"]["fraction"] == 7 / 8
    assert s["effect_ratio"] == pytest.approx(np.mean(diffs) / np.mean(sim))
    flat = verdict_summary(*_windows(diffs, sim_diffs=[0.0] * 8))
    assert flat["effect_ratio"] is None and flat["sim"]["nonzero"] == 0
    assert flat["sim"]["verdict"] == INCONCLUSIVE and flat["verdicts_agree"] is False


def test_tests_are_the_protocols_paired_test_seeded():
    diffs = [-0.51, 0.23, -0.97, -0.42, -0.66, -0.31, 0.17, -0.83, -0.12, -0.74]
    a_live, r_live, a_sim, r_sim = _windows(diffs)
    s = verdict_summary(a_live, r_live, a_sim, r_sim, seed=7)
    want = paired_test(a_live - r_live.mean(axis=1), np.random.default_rng(7))
    for key, value in want.items():
        assert s["live"][key] == pytest.approx(value), key
    assert verdict_summary(a_live, r_live, a_sim, r_sim, seed=7) == s
    other = verdict_summary(a_live, r_live, a_sim, r_sim, seed=8)["live"]
    assert (other["ci_low"], other["ci_high"]) != (s["live"]["ci_low"], s["live"]["ci_high"])
    assert other["p_value"] == s["live"]["p_value"]  # exact: no draw


def test_rank_correlation_against_a_hand_made_example():
    # sim ranks 1..6; live swaps the last two: sum d^2 = 2, rho = 1 - 6*2/(6*35)
    a_sim, r_sim = np.array([1.0, 4.0]), np.array([[2.0, 3.0], [5.0, 6.0]])
    a_live, r_live = np.array([10.0, 40.0]), np.array([[20.0, 30.0], [60.0, 50.0]])
    rc = verdict_summary(a_live, r_live, a_sim, r_sim)["rank_correlation"]
    assert rc["n"] == 6
    assert rc["rho"] == pytest.approx(1 - 12 / 210)
    assert 0 < rc["p_value"] < 0.05
    # within windows: 1 and 1 - 6*2/(3*8) = 0.5
    assert rc["per_window"] == pytest.approx([1.0, 0.5])
    assert rc["per_window_mean"] == pytest.approx(0.75)
    # one draw per window: two schedules a window, no per-window correlation
    one = verdict_summary(a_live, r_live[:, :1], a_sim, r_sim[:, :1])["rank_correlation"]
    assert one["per_window"] == [] and one["per_window_mean"] is None and one["n"] == 4


def test_summaries_are_strict_json():
    a_live, r_live, a_sim, r_sim = _windows([0.1, -0.2, 0.3], m=1)
    a_sim[:] = 2.0
    r_sim[:] = 2.0  # constant: no rank correlation, no effect ratio
    s = verdict_summary(a_live, r_live, a_sim, r_sim)
    assert s["rank_correlation"]["rho"] is None and s["effect_ratio"] is None
    c = closed_loop_summary(a_live, r_live, None)
    text = json.dumps({"summary": s, "closed_loop": c}, allow_nan=False)
    assert json.loads(text)["summary"]["windows"] == 3


def test_bad_input_is_one_line_naming_the_argument():
    a_live, r_live, a_sim, r_sim = _windows([0.1, -0.2, 0.3])
    cases = [
        ((a_live[:2], r_live, a_sim, r_sim), "random_live: one row per window"),
        ((a_live, r_live, a_sim[:2], r_sim), r"agent_sim: one value per window .*\(3,\)"),
        ((a_live, r_live, a_sim, r_sim[:, :2]), r"random_sim: .*\(3, 3\)"),
        (([], r_live, a_sim, r_sim), "agent_live: one value per window"),
        ((a_live, r_live[:, :0], a_sim, r_sim), "random_live: .*M >= 1"),
        ((np.array([0.1, np.nan, 0.3]), r_live, a_sim, r_sim), "agent_live: .*finite"),
    ]
    for args, match in cases:
        with pytest.raises(ValueError, match=match) as info:
            verdict_summary(*args)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="alpha must be in"):
        verdict_summary(a_live, r_live, a_sim, r_sim, alpha=1.5)
    with pytest.raises(ValueError, match="replay_live: one value per window"):
        closed_loop_summary(a_live, r_live, a_live[:1])


def test_closed_loop_summary():
    closed = np.array([1.0, 1.2, 0.8, 1.1, 0.9, 1.3, 1.0, 0.7])
    rand = np.column_stack([closed + 0.5, closed + 0.7])
    replay = closed + np.array([0.1, -0.2, 0.3, -0.1, 0.2, -0.3, 0.1, -0.05])
    c = closed_loop_summary(closed, rand, replay, seed=1)
    assert c["windows"] == 8 and c["draws"] == 2
    assert c["vs_random"]["mean"] == pytest.approx(-0.6)
    assert c["vs_random"]["verdict"] == "placement gain"
    assert c["vs_replay"]["diffs"] == pytest.approx((closed - replay).tolist())
    assert c["vs_replay"]["verdict"] == "closed loop tied with open-loop replay"
    worse = closed_loop_summary(closed, rand, closed - 0.4)
    assert worse["vs_replay"]["verdict"] == "closed loop worse than open-loop replay"
    better = closed_loop_summary(closed, rand, closed + 0.4)
    assert better["vs_replay"]["verdict"] == "closed loop better than open-loop replay"
    few = closed_loop_summary(closed[:4], rand[:4])
    assert few["vs_replay"] is None and few["vs_random"]["verdict"] == INCONCLUSIVE


def _block(k=6, m=3, closed=True):
    diffs = [-0.5, -0.7, -0.2, -0.9, -0.4, -0.6][:k]
    a_live, r_live, a_sim, r_sim = _windows(diffs, m=m)
    windows = []
    for i in range(k):
        sch = [{"kind": "agent", "merges": 7, "sim_excess_pp": a_sim[i],
                "live_excess_pp": a_live[i]}]  # fmt: skip
        sch += [
            {
                "kind": "random",
                "merges": 7,
                "sim_excess_pp": r_sim[i, j],
                "live_excess_pp": r_live[i, j],
            }  # fmt: skip
            for j in range(m)
        ]
        if closed:
            sch.append({"kind": "closed-loop", "merges": 6, "sim_excess_pp": None,
                        "live_excess_pp": a_live[i] + 0.1})  # fmt: skip
        windows.append({"window": i, "start_s": 300.0 * i, "duration_s": 300.0,
                        "control_violation_pct": 2.5, "schedules": sch})  # fmt: skip
    summary = verdict_summary(a_live, r_live, a_sim, r_sim)
    cl = closed_loop_summary(a_live + 0.1, r_live, a_live) if closed else None
    return {"agent": "online-forecast", "regime": "bursty", "windows": windows,
            "summary": summary, "closed_loop": cl}  # fmt: skip


def test_markdown_section_has_the_table_tests_and_power():
    block = _block()
    lines = markdown_section(block)
    text = "\n".join(lines)
    assert lines[0] == "### online-forecast on bursty"
    head = (
        "| window | merges | agent sim pp | agent live pp | random sim pp (mean) | "
        "random live pp (mean) | live diff pp | closed-loop live pp |"
    )
    assert head in lines
    w0 = block["windows"][0]["schedules"]
    diff = w0[0]["live_excess_pp"] - np.mean([s["live_excess_pp"] for s in w0[1:4]])
    row = next(line for line in lines if line.startswith("| 0 |"))
    assert row.split(" | ")[1] == "7" and row.split(" | ")[6] == f"{diff:.2f}"
    assert "- Live: mean difference " in text and ": placement gain." in text
    assert "- Simulator: mean difference " in text
    assert "Rank correlation of simulated and live excess (Spearman, 24 schedules)" in text
    assert block["summary"]["power"]["sentence"] in text
    assert "6 windows: the smallest p this test can give is 0.0312" in text
    assert "Closed loop vs open-loop replay (live)" in text
    plain = markdown_section(_block(closed=False))
    assert not any("closed-loop" in line.lower() for line in plain)


def test_plot_verdicts_writes_a_png(tmp_path):
    out = plot_verdicts(_block(), tmp_path / "verdicts.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # missing live numbers (a phase that did not run) are left out, not drawn
    block = _block(k=5, m=1, closed=False)
    block["windows"][2]["schedules"][0]["live_excess_pp"] = None
    path = plot_verdicts(block, tmp_path / "partial.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
