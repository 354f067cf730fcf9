"""With ``--learner-calibration`` the report's and the frontier's envs use the calibrated
learner model (what a policy trained with that file saw), and the scoring does not change."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from learner_cals import SHORT_DRIFT_OVERHEAD

from diloco_gym.eval import cells
from diloco_gym.eval import frontier as fr
from diloco_gym.eval.cells import cell_config, regime_plan
from diloco_gym.eval.report import ReportConfig, run_protocol
from diloco_gym.sim.learner_calibration import learner_params
from diloco_gym.sim.learners import LearnerParams

ROOT = Path(__file__).resolve().parents[2]
CAL = SHORT_DRIFT_OVERHEAD
CALIBRATED = learner_params(CAL)


@pytest.fixture(autouse=True)
def empty_cache():
    cells.release_cached()
    yield
    cells.release_cached()


@pytest.fixture(scope="module")
def cal_file(write_learner_calibration):
    f = write_learner_calibration(CAL)
    return str(f)


def test_the_calibration_differs_from_the_default_learners():
    # the checks below could not tell the two apart otherwise
    assert CALIBRATED.drift_s == pytest.approx(CAL.drift_s) != LearnerParams().drift_s
    assert CALIBRATED.merge_overhead_s > 0 == LearnerParams().merge_overhead_s


def test_a_report_cells_envs_use_the_learner_calibration(cal_file):
    config = cell_config(ReportConfig(regimes=["bursty"], seeds=2, learner_calibration=cal_file))
    units, *_ = regime_plan(config, "bursty")
    budget, *_ = regime_plan(config, "bursty", env={"merge_budget": 8})  # a sweep's override
    trace = cell_config(
        ReportConfig(
            trace=str(ROOT / "traces" / "bursty.csv"), window_s=300.0, learner_calibration=cal_file
        )
    )
    windows, *_ = regime_plan(trace, "replay:bursty")
    for unit in [*units, *budget, *windows]:
        assert unit.env.learner_params == CALIBRATED
        assert unit.env.learner_params.drift_s == pytest.approx(CAL.drift_s)
    assert budget[0].env.params.merge_budget == 8


def test_without_a_learner_calibration_the_cells_keep_the_default_learners():
    units, *_ = regime_plan(cell_config(ReportConfig(regimes=["bursty"], seeds=2)), "bursty")
    assert units[0].env.learner_params == LearnerParams()
    assert units[0].env.learner_params.drift_s == LearnerParams().drift_s


def test_a_frontier_runs_its_agents_in_calibrated_envs(cal_file, monkeypatch):
    ran = []

    def spy(jobs, **kw):
        ran.extend(env for env, *_ in jobs)
        return real(jobs, **kw)

    real = fr.run_episodes
    monkeypatch.setattr(fr, "run_episodes", spy)
    config = fr._shipped(
        fr.FrontierConfig(
            regimes=["bursty"],
            budgets_per_hour=[72.0],
            seeds=2,
            draws=10,
            budget_agents=["fixed-budget"],
            free_agents=["fixed-512"],
            in_process_agents=True,
            learner_calibration=cal_file,
        )
    )
    fr.run_frontier_cell(fr.FrontierCell(config, 0, 0))
    assert len(ran) == 2 and {e.params.merge_budget for e in ran} == {None, 12}
    assert all(e.learner_params == CALIBRATED for e in ran)


def test_the_calibration_leaves_the_serving_side_scores_unchanged(cal_file):
    """For agents that read no learner observation (random-deferral does: it seeds its coins
    from its first observation, learner features included), every serving-side column (sync-excess,
    matched random, oracle, violations) is the same with and without the calibration."""
    base = {"regimes": ["bursty"], "seeds": 2, "draws": 20, "in_process_agents": True}
    base["agents"] = ["fixed-512", "fixed-256", "pressure-gate"]
    plain = run_protocol(ReportConfig(**base), progress=False)["rows"]
    cells.release_cached()
    priced = run_protocol(ReportConfig(**base, learner_calibration=cal_file), progress=False)
    rows = priced["rows"]
    serving = [
        c
        for c in plain.columns
        if "excess" in c or "violation" in c or "oracle" in c or "random" in c or "p95" in c
    ]
    assert {"sync_excess_pct", "excess_requests", "violation_pct"} <= set(serving)
    for c in ["agent", "seed", "merges", *serving]:
        np.testing.assert_array_equal(rows[c].to_numpy(), plain[c].to_numpy(), err_msg=c)
    # the return too: the default progress_weight is 0, so no learner term enters it
    np.testing.assert_array_equal(rows["return"].to_numpy(), plain["return"].to_numpy())
