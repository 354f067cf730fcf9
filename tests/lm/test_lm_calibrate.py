"""``calibrate-learners`` end to end at the tiny configuration: the file it writes passes
its schema, the env loads it, and a resumed calibration reuses the logged runs."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from diloco_gym.cli import main  # noqa: E402
from diloco_gym.envs.env import DiLoCoSyncEnv  # noqa: E402
from diloco_gym.lm.calibrate import TINY, calibrate_learners  # noqa: E402
from diloco_gym.sim.learner_calibration import load_learner_calibration  # noqa: E402


@pytest.mark.slow
def test_tiny_calibration_writes_a_file_the_env_loads(tmp_path):
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


def test_cli_refuses_to_overwrite_and_bad_values(tmp_path, capsys):
    out = tmp_path / "lc.json"
    out.write_text("{}")
    with pytest.raises(SystemExit) as info:
        main(["calibrate-learners", "--tiny", "--out", str(out)])
    assert info.value.code == 2
    assert "exists; pass --force" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["calibrate-learners", "--seeds", "1", "--out", str(tmp_path / "x.json")])
    assert info.value.code == 2
    assert "--seeds" in capsys.readouterr().err
