"""``report`` and ``frontier`` judge your own scheduler named as ``path/to/file.py:attr`` or
``module:attr``: sealed like the built-in deployable agents, its rows in results.csv,
report.json and frontier.csv under its name; bad arguments fail with one line first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]

#: An agent that merges whenever it may, but only in another process than the one that
#: built it: sealed (pickled into its own worker) it merges at the corridor's most, run in
#: the evaluating process it only takes the forced merges.
PROBE = """
import os

import numpy as np


class Probe:
    name = "sealed-probe"

    def __init__(self):
        self.built_in = os.getpid()

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        return np.int64(1 if os.getpid() != self.built_in else 0), state
"""

TINY = ["--seeds", "2", "--regimes", "bursty", "--draws", "20", "--no-progress"]


@pytest.fixture
def probe(tmp_path) -> Path:
    path = tmp_path / "probe.py"
    path.write_text(PROBE)
    return path


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("DILOCO_GYM_TRACEBACK", None)
    return subprocess.run(
        [sys.executable, "-m", "diloco_gym.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_report_judges_a_file_agent_sealed(probe, tmp_path):
    done = _cli(
        ["report", "--out", "r", "--agents", "fixed-512", "--agent", "probe.py:Probe", *TINY],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = pd.read_csv(tmp_path / "r" / "results.csv")
    mine = rows[rows["agent"] == "sealed-probe"]
    assert len(mine) == 2 and mine["deployable"].all()
    assert (mine["merges_per_hour"] == 192.0).all()  # it ran in a worker process
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    summary = {r["agent"]: r for r in report["summary"]}
    assert summary["sealed-probe"]["verdict"] == "inconclusive (too few episodes)"
    assert report["config"]["agents"] == ["fixed-512", "probe.py:Probe"]
    assert report["agent_sealing"].startswith("sealed")
    assert "sealed-probe" in done.stdout


@pytest.mark.slow
def test_report_in_process_runs_the_file_agent_in_the_evaluating_process(probe, tmp_path):
    """The control of the test above: --in-process-agents, and the probe only takes the
    forced merges (so 192 merges/h there means sealed)."""
    argv = ["report", "--out", "r", "--agents", "probe.py:Probe", "--in-process-agents", *TINY]
    done = _cli(argv, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = pd.read_csv(tmp_path / "r" / "results.csv")
    assert list(rows["agent"]) == ["sealed-probe"] * 2
    assert (rows["merges_per_hour"] < 100).all()


@pytest.mark.slow
def test_frontier_judges_a_module_agent_at_every_budget_and_free(probe, tmp_path):
    argv = [
        "frontier",
        "--out",
        "f",
        "--budgets",
        "48",
        "--budget-agents",
        "fixed-budget",
        "--free-agents",
        "fixed-512",
        "--agent",
        "probe:Probe",  # module:attr, the module found in the current directory
        *TINY,
    ]
    done = _cli(argv, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = pd.read_csv(tmp_path / "f" / "frontier.csv")
    mine = rows[rows["agent"] == "sealed-probe"]
    free = mine[mine["mode"] == "free"]
    assert len(free) == 2 and (free["merges_per_hour"] == 192.0).all()
    assert len(mine) > len(free)  # also held to the budget grid
    doc = json.loads((tmp_path / "f" / "frontier.json").read_text())
    assert "probe:Probe" in json.dumps(doc["config"])


@pytest.mark.parametrize("command", ["report", "frontier"])
@pytest.mark.parametrize(
    ("spec", "wanted"),
    [
        ("missing.py:Probe", "diloco-gym: agent 'missing.py:Probe': file missing.py not found"),
        ("{dir}/probe.py:Nope", "probe.py has no attribute 'Nope' (it defines: Probe)"),
        ("{dir}/probe.py:np", "numpy has no predict(observation"),
        ("{dir}/broken.py:Probe", "broken.py (line 1) failed: NameError"),
        ("nosuchmodule_xyz:Probe", "no module named 'nosuchmodule_xyz'"),
    ],
)
def test_bad_agent_code_is_one_line_before_any_work(command, spec, wanted, probe, tmp_path, fails):
    (tmp_path / "broken.py").write_text("undefined_name\n")
    out = tmp_path / "out"
    line = fails([command, "--out", str(out), "--agent", spec.format(dir=tmp_path)], 1)
    assert wanted in line
    assert not out.exists()


def test_report_refuses_a_budget_aware_file_agent(tmp_path, fails):
    path = tmp_path / "b.py"
    path.write_text(PROBE + "\n\nclass Budgeted(Probe):\n    budget_aware = True\n")
    line = fails(["report", "--out", str(tmp_path / "o"), "--agent", f"{path}:Budgeted"], 2)
    assert "runs only with one" in line and "diloco-gym frontier" in line


@pytest.mark.slow
def test_run_takes_a_file_agent(probe, tmp_path, capsys):
    from diloco_gym.cli import main

    assert main(["run", "--agent", f"{probe}:Probe", "--seeds", "2", "--in-process-agents"]) == 0
    assert "total" in capsys.readouterr().out
