"""The model-quality cost against matched random (diloco_gym.eval.quality_vs_random): the
per-episode columns priced on the protocol's own control draws, the summaries' interval and
test, the frontier's two-axis figure and the tables of report.md / frontier.md."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from learner_cals import SHORT_DRIFT

from diloco_gym.eval import frontier as fr
from diloco_gym.eval import protocol
from diloco_gym.eval import quality_vs_random as qr
from diloco_gym.eval.report import ReportConfig, run_protocol, write_report
from diloco_gym.sim.learner_calibration import (
    env_schedule_loss,
    load_learner_calibration,
)

CAL = SHORT_DRIFT
DECISION_S = 1.12


@pytest.fixture(scope="module")
def cal_file(write_learner_calibration):
    f = write_learner_calibration(CAL)
    assert load_learner_calibration(f) == CAL
    return f


@pytest.fixture(scope="module")
def drawn():
    """Every matched-random control the protocol draws while the module's runs go on, by
    (seed, merges): ``protocol.episode_control`` wrapped (the report and the frontier call
    it through the module)."""
    seen: dict[tuple[int, int], list[protocol.Control]] = {}
    real = protocol.episode_control

    def spy(scorer, merges, draws, seed, counts=None):
        c = real(scorer, merges, draws, seed, counts)
        seen.setdefault((int(seed), int(merges)), []).append(c)
        return c

    mp = pytest.MonkeyPatch()
    mp.setattr(protocol, "episode_control", spy)
    yield seen
    mp.undo()


@pytest.fixture(scope="module")
def frontier_run(cal_file, drawn):
    cfg = fr.FrontierConfig(
        regimes=["bursty"],
        budgets_per_hour=[72.0],
        seeds=3,
        draws=12,
        budget_agents=["wa-diloco"],
        free_agents=["fixed-512"],
        learner_calibration=str(cal_file),
        in_process_agents=True,
    )
    return fr.run_frontier(cfg, progress=False)


@pytest.fixture(scope="module")
def report_run(cal_file, drawn):
    cfg = ReportConfig(
        regimes=["bursty"],
        agents=["fixed-256", "online-forecast"],
        seeds=3,
        draws=12,
        learner_calibration=str(cal_file),
        in_process_agents=True,
    )
    return run_protocol(cfg, progress=False)


def _recomputed(control: protocol.Control) -> float:
    return float(np.mean([env_schedule_loss(s * DECISION_S, CAL) for s in control.schedules]))


def _controls_of(drawn, r: dict) -> list[protocol.Control]:
    """The controls drawn for the row's seed and merges whose sync-excess mean is the row's
    ``matched_random_mean``: the very draws behind its sync-excess control."""
    controls = {id(c): c for c in drawn.get((r["seed"], r["merges"]), [])}.values()
    found = [c for c in controls if c.scores.exact_pct.mean() == r["matched_random_mean"]]
    assert found, "the row's control was not drawn by protocol.episode_control"
    return found


# ----------------------------------------------------------------------------- functions
def test_control_pred_loss_is_the_mean_predicted_loss_of_the_draws():
    sch = np.array([[20, 40, 60], [10, 50, 60], [30, 45, 90]])
    by_hand = np.mean([env_schedule_loss(row * DECISION_S, CAL) for row in sch])
    assert qr.control_pred_loss(sch, DECISION_S, CAL) == pytest.approx(by_hand, rel=1e-12)
    with pytest.raises(ValueError, match="non-empty"):
        qr.control_pred_loss(np.empty((0, 3), dtype=int), DECISION_S, CAL)


def test_a_schedule_against_itself_costs_nothing_and_another_placement_does():
    """The control priced against itself (the agent's schedule is the control's only draw)
    gives 0; an evenly spaced schedule against a bunched control does not."""
    even = np.array([[20, 40, 60, 80]])
    bunched = protocol.Control(np.array([[20, 25, 30, 80]]), None)  # type: ignore[arg-type]
    same = protocol.Control(even, None)  # type: ignore[arg-type]
    agent = env_schedule_loss(even[0] * DECISION_S, CAL)
    assert qr.control_quality_columns(CAL, agent, same, DECISION_S)["quality_vs_random"] == 0.0
    cols = qr.control_quality_columns(CAL, agent, bunched, DECISION_S)
    assert cols["quality_vs_random"] < -1e-3  # even gaps merge more work: a lower loss
    assert cols["control_pred_loss"] == pytest.approx(agent - cols["quality_vs_random"])


@pytest.mark.parametrize(
    ("diff", "verdict"),
    [
        ([1e-4] * 3, "inconclusive (too few episodes)"),  # 3 units: p >= 0.25 whatever
        ([1e-4, 0, 0, 0, 0, 0, 0, 0], "inconclusive (too few episodes)"),  # one non-zero
        ([1e-4] * 6, "higher loss than matched random"),  # p = 2/64
        ([-1e-4] * 6, "lower loss than matched random"),
        ([1e-4, -1e-4] * 3, "no significant difference"),
    ],
)
def test_the_verdict_is_inconclusive_when_the_units_cannot_reach_alpha(diff, verdict):
    g = pd.DataFrame(
        {
            "quality_vs_random": diff,
            "control_pred_loss": 2.0,
            "pred_loss": 2.0 + np.asarray(diff),
            "sync_excess_pct": 5.0,
        }
    )
    s = qr.quality_vs_random_stats(g)
    assert s["quality_vs_random_verdict"] == verdict
    assert s["quality_vs_random"] == pytest.approx(np.mean(diff))
    assert "tied" not in " ".join(qr.QUALITY_VERDICTS)


# ----------------------------------------------------------------------------- frontier
def test_frontier_rows_are_priced_on_their_own_control_draws(frontier_run, drawn):
    rows = frontier_run["rows"]
    assert {"pred_loss", "quality_cost", "control_pred_loss", "quality_vs_random"} <= set(rows)
    for r in rows.to_dict(orient="records"):
        # the draws behind the row's sync-excess control, priced by the surrogate with each
        # merge at its decision's start
        for control in _controls_of(drawn, r):
            assert r["control_pred_loss"] == pytest.approx(_recomputed(control), rel=1e-12)
        assert r["quality_vs_random"] == pytest.approx(r["pred_loss"] - r["control_pred_loss"])
    assert (rows["quality_vs_random"].abs() > 1e-6).all()


def test_frontier_summaries_carry_the_mean_interval_and_test(frontier_run):
    for table in (frontier_run["budgets"], frontier_run["free"]):
        assert len(table) == 1
        s = table.iloc[0]
        g = frontier_run["rows"]
        g = g[(g["agent"] == s["agent"]) & (g["regime"] == s["regime"])]
        assert s["quality_vs_random"] == pytest.approx(g["quality_vs_random"].mean())
        assert s["control_pred_loss"] == pytest.approx(g["control_pred_loss"].mean())
        assert s["quality_vs_random_ci_low"] <= s["quality_vs_random"]
        assert s["quality_vs_random"] <= s["quality_vs_random_ci_high"]
        assert s["quality_vs_random_ci_low"] < s["quality_vs_random_ci_high"]
        assert 0.25 <= s["quality_vs_random_p"] <= 1.0 and s["quality_vs_random_min_p"] == 0.25
        assert s["quality_vs_random_verdict"] == "inconclusive (too few episodes)"


def test_write_frontier_draws_the_two_axis_figure_and_lists_it(frontier_run, tmp_path):
    out = fr.write_frontier(frontier_run, tmp_path / "fr")
    png = out / "frontier_quality_bursty.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads((out / "frontier.json").read_text())
    assert doc["quality_figures"] == {"bursty": "frontier_quality_bursty.png"}
    assert {"quality_vs_random_ci_low", "quality_vs_random_p"} <= set(doc["budgets"][0])
    md = (out / "frontier.md").read_text()
    assert "### Serving cost and model quality against matched random" in md
    assert "![serving and quality cost bursty](frontier_quality_bursty.png)" in md
    b = frontier_run["budgets"].iloc[0]
    row = (
        f"| wa-diloco | 72/h | {b['diff_pp']:+.2f} [{b['diff_ci_low']:+.2f}, "
        f"{b['diff_ci_high']:+.2f}] | {b['quality_vs_random']:+.2e} "
        f"[{b['quality_vs_random_ci_low']:+.2e}, {b['quality_vs_random_ci_high']:+.2e}] | 3 (3) | "
    )
    assert row in md
    assert "| fixed-512 | free | " in md
    # the fixed-H price's table is still there, unchanged
    assert (
        "| agent | budget merges/h | merges/h | sync-excess % | predicted loss | quality cost |"
        in md
    )
    # redrawn from the written rows: frontier.csv (tables recomputed) and frontier.json
    cols = ["agent", "budget_label", "diff_pp", "diff_ci_low", "quality_vs_random"]
    cols += ["quality_vs_random_ci_high", "quality_vs_random_p"]
    ref = qr.quality_points(frontier_run)[cols]
    for source in (out / "frontier.csv", out / "frontier.json"):
        pd.testing.assert_frame_equal(qr.quality_points(source)[cols], ref, check_dtype=False)
    names = qr.write_quality_figures(out / "frontier.csv", tmp_path / "redrawn")
    assert names == {"bursty": "frontier_quality_bursty.png"}
    assert (tmp_path / "redrawn" / names["bursty"]).read_bytes()[:4] == b"\x89PNG"


def test_the_figure_has_both_error_bars_zero_lines_and_units(frontier_run):
    fig = qr.quality_figure(frontier_run, "bursty")
    left, ax = fig.axes[:2]
    # the trade-off itself: sync-excess against predicted loss, intervals on both axes
    assert len(left.containers) == 2
    assert all(c.has_xerr and c.has_yerr for c in left.containers)
    assert "% of requests" in left.get_xlabel() and "predicted validation loss" in (
        left.get_ylabel()
    )
    pts = qr.quality_points(frontier_run)
    xs = sorted(float(x) for c in left.containers for x in c.lines[0].get_xdata())
    assert xs == pytest.approx(sorted(pts["sync_excess_pct"]))
    assert all(pts["pred_loss_ci_low"] <= pts["pred_loss"])
    assert all(pts["pred_loss"] <= pts["pred_loss_ci_high"])
    # both against matched random
    bars = ax.containers
    assert len(bars) == 2 and all(c.has_xerr and c.has_yerr for c in bars)
    lines = ax.get_lines()
    assert any(list(ln.get_xdata()) == [0, 0] for ln in lines)  # the vertical zero line
    assert any(list(ln.get_ydata()) == [0, 0] for ln in lines)  # the horizontal one
    assert "pp of requests" in ax.get_xlabel() and "nats/byte" in ax.get_ylabel()
    with pytest.raises(ValueError, match="'regime'.*'sync-heavy'"):
        qr.quality_figure(frontier_run, "sync-heavy")


def test_rows_without_a_learner_calibration_name_the_file_and_field(tmp_path):
    plain = tmp_path / "frontier.csv"
    pd.DataFrame({"regime": ["bursty"], "agent": ["a"], "seed": [0]}).to_csv(plain, index=False)
    with pytest.raises(ValueError, match=rf"{plain}: field 'quality_vs_random'"):
        qr.quality_points(plain)
    partial = tmp_path / "partial.csv"
    pd.DataFrame({"regime": ["bursty"], "seed": [0], "quality_vs_random": [0.1]}).to_csv(partial)
    with pytest.raises(ValueError, match=rf"{partial}: field 'mode': absent"):
        qr.quality_points(partial)
    with pytest.raises(ValueError, match="cannot read"):
        qr.quality_points(tmp_path / "absent.json")


# ----------------------------------------------------------------------------- report
def test_report_rows_and_summary_against_matched_random(report_run, drawn, tmp_path):
    rows, s = report_run["rows"], report_run["summary"]
    for r in rows.to_dict(orient="records"):
        for control in _controls_of(drawn, r):
            assert r["control_pred_loss"] == pytest.approx(_recomputed(control), rel=1e-12)
    for _, r in s.iterrows():
        g = rows[rows["agent"] == r["agent"]]
        assert r["quality_vs_random"] == pytest.approx(g["quality_vs_random"].mean())
        assert r["quality_vs_random_ci_low"] <= r["quality_vs_random"]
        assert r["quality_vs_random"] <= r["quality_vs_random_ci_high"]
        assert r["quality_vs_random_verdict"] == "inconclusive (too few episodes)"
    md = (write_report(report_run, tmp_path / "rep") / "report.md").read_text()
    head = "| agent | merges/h | predicted loss | matched random predicted loss | quality vs random"
    assert head in md
    r = s[s["agent"] == "online-forecast"].iloc[0]
    assert (
        f"| online-forecast | {r['merges_per_hour']:.1f} | {r['pred_loss']:.4f} | "
        f"{r['control_pred_loss']:.4f} | {r['quality_vs_random']:+.2e} "
        f"[{r['quality_vs_random_ci_low']:+.2e}, {r['quality_vs_random_ci_high']:+.2e}] | 3 ("
    ) in md
    assert "| agent | merges/h | sync-excess % | predicted loss | quality cost |" in md


def test_without_a_learner_calibration_nothing_is_added(tmp_path):
    cfg = fr.FrontierConfig(
        regimes=["bursty"],
        budgets_per_hour=[72.0],
        seeds=2,
        draws=8,
        budget_agents=["wa-diloco"],
        free_agents=[],
        in_process_agents=True,
    )
    res = fr.run_frontier(cfg, progress=False)
    assert "quality_vs_random" not in res["rows"] and "quality_vs_random" not in res["budgets"]
    out = fr.write_frontier(res, tmp_path / "fr")
    assert not (out / "frontier_quality_bursty.png").exists()
    assert json.loads((out / "frontier.json").read_text())["quality_figures"] == {}
