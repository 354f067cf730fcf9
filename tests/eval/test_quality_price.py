"""The model-quality price in the report and the frontier (with a learner calibration)."""

from __future__ import annotations

import numpy as np
import pytest
from learner_cals import SHORT_DRIFT

from diloco_gym.cli import main
from diloco_gym.eval import frontier as fr
from diloco_gym.eval.report import ReportConfig, run_protocol, write_report
from diloco_gym.sim.learner_calibration import (
    env_schedule_loss,
    load_learner_calibration,
    quality_cost,
)

CAL = SHORT_DRIFT


@pytest.fixture(scope="module")
def cal_file(write_learner_calibration):
    f = write_learner_calibration(CAL)
    assert load_learner_calibration(f) == CAL
    return f


@pytest.mark.slow
def test_report_prices_every_schedule(cal_file, tmp_path):
    agents = ["fixed-256", "online-forecast"]
    res = run_protocol(
        ReportConfig(
            regimes=["bursty"], agents=agents, seeds=2, draws=20, learner_calibration=str(cal_file)
        ),
        progress=False,
    )
    rows, s = res["rows"], res["summary"]
    assert {"pred_loss", "quality_cost"} <= set(rows.columns)
    # fixed H is its own reference: no price; every price is >= 0 (equal gaps merge most)
    fixed = rows[rows["agent"] == "fixed-256"]
    np.testing.assert_allclose(fixed["quality_cost"], 0.0, atol=1e-9)
    assert (rows["quality_cost"] >= -1e-12).all()
    assert set(s["agent"]) == set(agents) and s["quality_cost"].notna().all()
    md = (write_report(res, tmp_path / "rep") / "report.md").read_text()
    assert "| agent | merges/h | sync-excess % | predicted loss | quality cost |" in md
    # without a calibration the report is unchanged (no quality columns)
    plain = run_protocol(
        ReportConfig(regimes=["bursty"], agents=agents[:1], seeds=2, draws=20), progress=False
    )
    assert "quality_cost" not in plain["rows"].columns


def test_quality_cost_of_an_irregular_schedule_by_hand():
    times = [20.0, 30.0, 90.0]
    sec = 32 * 0.14
    even = [30.0, 60.0, 90.0]
    by_hand = []
    for t in (times, even):
        gaps = np.diff([0.0, *t]) / sec
        w = np.sum(gaps / (1 + gaps / CAL.drift_steps))
        by_hand.append(1.5 + 4.0 * (1 + w / 6.0) ** -0.6)
    assert env_schedule_loss(times, CAL) == pytest.approx(by_hand[0])
    assert quality_cost(times, CAL) == pytest.approx(by_hand[0] - by_hand[1])
    assert quality_cost(times, CAL) > 0


@pytest.mark.slow
def test_frontier_prices_every_agent_and_budget(cal_file):
    cfg = fr.FrontierConfig(
        regimes=["bursty"],
        budgets_per_hour=[72.0],
        seeds=2,
        draws=20,
        budget_agents=["wa-diloco"],
        free_agents=["fixed-512"],
        learner_calibration=str(cal_file),
    )
    res = fr.run_frontier(cfg, progress=False)
    assert res["rows"]["quality_cost"].notna().all()
    md = fr.render_markdown(res, {})
    assert "### Model quality (learner calibration)" in md
    assert "| wa-diloco | 72 |" in md and "| fixed-512 | free |" in md


def test_cli_bad_learner_calibration_is_a_data_error(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "diloco-gym-learner-calibration/1", "format": 1}')
    with pytest.raises(SystemExit) as info:
        main(
            [
                "report",
                "--regimes",
                "bursty",
                "--seeds",
                "2",
                "--learner-calibration",
                str(bad),
                "--out",
                str(tmp_path / "r"),
            ]
        )
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert "duplicate key 'format'" in err and str(bad) in err
