"""The learner calibration (``diloco_gym/lm/calibrate.py``): the designed schedules, and
end to end at the tiny configuration: the file it writes passes its schema, the env loads
it, and a resumed calibration reuses the logged runs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from diloco_gym.envs.env import DiLoCoSyncEnv
from diloco_gym.lm.calibrate import TINY, calibrate_learners, design
from diloco_gym.sim.learner_calibration import load_learner_calibration


def test_design_is_in_the_corridor_and_splits_fit_from_heldout():
    plan = design(48, 4, 16, agent_schedules={"a": [5, 9, 16, 4]})
    names = [p["name"] for p in plan]
    assert len(set(names)) == len(names)
    assert {p["role"] for p in plan} == {"fit", "heldout"}
    for p in plan:
        gaps = np.diff([0, *p["schedule"]])
        assert p["schedule"][-1] <= 48
        if p["name"].startswith("random"):
            assert gaps.min() >= 4 and gaps.max() <= 16 and p["schedule"][-1] == 48
    assert any(p["fragments"] > 1 for p in plan if p["role"] == "fit")
    assert {p["bits"] for p in plan if p["role"] == "fit"} == {32, 16, 8, 4}
    assert design(48, 4, 16) == design(48, 4, 16)  # deterministic


@pytest.mark.slow
def test_tiny_calibration_writes_a_file_the_env_loads(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "lc.json"
    lines: list[str] = []
    doc = calibrate_learners(
        out=out,
        seeds=2,
        config=TINY,
        bootstrap=10,
        agents=("wa-diloco",),
        max_bytes=200_000,
        progress=lines.append,
    )
    assert json.loads(out.read_text()) == doc
    cal = load_learner_calibration(out)
    assert cal.drift_steps > 0 and set(cal.quant_efficiency) == {16, 8, 4}
    runs = doc["runs"]
    assert {r["role"] for r in runs} == {"fit", "heldout"}
    assert any(r["name"] == "agent-wa-diloco" for r in runs)
    assert all(r["merge_losses"][-1] < r["initial_loss"] for r in runs)  # every run learned
    for name, (lo, hi) in doc["intervals"].items():
        assert lo <= hi, name
    v = doc["validation"]
    assert v["schedules"] == len({r["name"] for r in runs if r["role"] == "heldout"})
    assert -1 <= v["spearman_rho"] <= 1 and v["mae"] >= 0
    assert any(line.startswith("[1/") for line in lines)  # progress, run by run
    env = DiLoCoSyncEnv(regime="bursty", learner_calibration=out)
    assert env.learner_params.drift_s == pytest.approx(cal.drift_s)
    # resume: every run is in the log, none is trained again, the fit is the same
    log = tmp_path / "lc.json.runs.jsonl"
    n = len(log.read_text().splitlines())
    assert n == len(runs)
    again = calibrate_learners(
        out=out,
        seeds=2,
        config=TINY,
        bootstrap=10,
        agents=("wa-diloco",),
        max_bytes=200_000,
        resume=True,
    )
    assert len(log.read_text().splitlines()) == n
    assert again["params"] == doc["params"]
