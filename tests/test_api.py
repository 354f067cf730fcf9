"""``diloco_gym.evaluate`` (diloco_gym/api.py): the report's verdict table from Python, by
the report's own code path, for an agent argument or an agent object."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import diloco_gym
from diloco_gym.agents.user import AgentSpecError
from diloco_gym.cli import main

ROOT = Path(__file__).resolve().parents[1]

GATE_FILE = """
import numpy as np


class Gate:
    name = "my-gate"

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        return np.int64(1 if obs[0] < 0.5 else 0), state
"""


class Gate:
    """The file's agent, defined here: an object given to evaluate()."""

    name = "my-gate"

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        return np.int64(1 if obs[0] < 0.5 else 0), state


TINY = {"regimes": ["bursty"], "seeds": 2, "draws": 20}


@pytest.mark.slow
def test_evaluate_gives_the_reports_rows_for_a_spec_and_an_object(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gate.py").write_text(GATE_FILE)
    argv = ["report", "--out", "r", "--agents", "gate.py:Gate", "--seeds", "2"]
    assert main([*argv, "--regimes", "bursty", "--draws", "20", "--no-progress"]) == 0
    capsys.readouterr()
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    summary = pd.DataFrame(report["summary"])
    episodes = pd.read_csv(tmp_path / "r" / "results.csv")

    by_spec = diloco_gym.evaluate("gate.py:Gate", **TINY)
    by_object = diloco_gym.evaluate(Gate(), **TINY)
    for got in (by_spec, by_object):
        assert got.agent == "my-gate"
        frame = got.to_frame()
        assert list(frame.columns) == list(summary.columns)
        pd.testing.assert_frame_equal(frame, summary, check_dtype=False)
        pd.testing.assert_frame_equal(got.episodes, episodes, check_dtype=False)
        assert got.verdicts == {"bursty": "inconclusive (too few episodes)"}
    assert by_spec.result["agent_sealing"] == report["agent_sealing"]
    assert "my-gate" in str(by_object)
    out = by_object.write(tmp_path / "again")
    pd.testing.assert_frame_equal(pd.read_csv(out / "results.csv"), episodes)


@pytest.mark.slow
def test_evaluate_alongside_shares_the_holm_family(tmp_path):
    got = diloco_gym.evaluate(Gate(), alongside=["fixed-512"], in_process=True, **TINY)
    frame = got.to_frame()
    assert list(frame["agent"]) == ["my-gate"]
    assert set(got.result["summary"]["agent"]) == {"my-gate", "fixed-512"}
    assert int(frame["holm_family"].iloc[0]) == 2  # one family: the regime's two agents
    alone = diloco_gym.evaluate(Gate(), in_process=True, **TINY).to_frame()
    assert int(alone["holm_family"].iloc[0]) == 1


def test_an_object_cannot_run_in_other_processes_cells():
    with pytest.raises(ValueError, match="backend='serial'"):
        diloco_gym.evaluate(Gate(), backend="processes", **TINY)


def test_bad_agents_are_refused_before_any_episode(tmp_path):
    with pytest.raises(ValueError, match="steers by a merge budget"):
        diloco_gym.evaluate("fixed-budget", **TINY)
    with pytest.raises(ValueError, match="fixed-budget steer"):
        diloco_gym.evaluate(Gate(), alongside=["fixed-512", "fixed-budget"], **TINY)
    with pytest.raises(AgentSpecError, match="has no predict"):
        diloco_gym.evaluate(42, **TINY)
    with pytest.raises(AgentSpecError, match="file nope.py not found"):
        diloco_gym.evaluate("nope.py:Gate", **TINY)
    with pytest.raises(ValueError, match="seeds must be >= 2"):
        diloco_gym.evaluate(Gate(), regimes=["bursty"], seeds=1)


def test_evaluate_is_exported_lazily():
    """``import diloco_gym`` does not import the API module (nor pandas); the attribute
    does."""
    code = (
        "import sys, diloco_gym\n"
        "before = 'diloco_gym.api' in sys.modules\n"
        "f = diloco_gym.evaluate\n"
        "print(before, 'diloco_gym.api' in sys.modules, 'pandas' in sys.modules, f.__name__)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True", "False", "evaluate"]


@pytest.mark.slow
def test_a_script_without_the_main_guard_fails_with_a_message_saying_so(tmp_path):
    """Sealed agents' workers import the calling script: without the guard the worker
    would run the evaluation again. The script must stop with a message naming the guard
    (or, where workers no longer import the script, simply succeed), never hang."""
    script = tmp_path / "noguard.py"
    script.write_text(
        textwrap.dedent(
            """
            import diloco_gym

            def gate(obs):
                return int(obs[0] < 0.5)

            print(diloco_gym.evaluate(gate, regimes=["bursty"], seeds=2, draws=20))
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    if out.returncode == 0:
        assert "gate" in out.stdout
    else:
        assert "if __name__ == '__main__':" in out.stderr, out.stderr[-3000:]
        assert "RuntimeError: diloco_gym.evaluate() was called while a worker" in out.stderr
