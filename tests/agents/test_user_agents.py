"""Your own scheduler as an agent (agents/user.py): every form an agent argument or object
may take, the one-line errors, and picklability (also into a fresh interpreter that cannot
import the agent's file)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from diloco_gym.agents.registry import is_budget_aware_spec, make_agent, make_agents, shipped_spec
from diloco_gym.agents.user import (
    AgentSpecError,
    UserAgent,
    _module_name,
    as_agent,
    is_user_spec,
    load_user_agent,
)
from diloco_gym.eval.rollout import run_episode

ROOT = Path(__file__).resolve().parents[2]

AGENT_FILE = """
import numpy as np

class Gate:
    name = "my-gate"

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        return np.int64(1 if obs[0] < 0.5 else 0), state

class Unnamed:
    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        return np.int64(0), state

gate_instance = Gate()

def make_gate():
    return Gate()

def merge_when_low(obs):
    return int(obs[0] < 0.5)

def two_args(a, b):
    return 0

class NeedsArgs:
    def __init__(self, x):
        self.x = x

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        return 0, state

class Budgeted(Gate):
    name = "budgeted"
    budget_aware = True

class Peeker:
    name = "peeker"
    deployable = False

    def attach_episode(self, env, episode_seed):
        self.seen = episode_seed

    def predict(self, obs, state=None, episode_start=None, deterministic=True):
        return 0, state

not_an_agent = 42
"""


@pytest.fixture
def agent_file(tmp_path) -> Path:
    path = tmp_path / "my_sched.py"
    path.write_text(AGENT_FILE)
    return path


def test_user_specs_are_told_from_names_and_model_paths():
    assert is_user_spec("mypkg.sched:Gate") and is_user_spec("dir/x.py:Gate")
    assert is_user_spec("x.py:Outer.inner")
    for other in ("fixed-512", "model.zip", "a:b.zip", "no colon", ":Gate", "x.py:", "1x:y"):
        assert not is_user_spec(other), other


@pytest.mark.parametrize(
    ("attr", "name"),
    [
        ("Gate", "my-gate"),  # a class: instantiated, keeps its own name
        ("gate_instance", "my-gate"),  # an instance
        ("make_gate", "my-gate"),  # a factory
        ("merge_when_low", "merge_when_low"),  # f(obs) -> action, named after the function
        ("Unnamed", "Unnamed"),  # no name: the attribute's
    ],
)
def test_every_form_is_an_agent_that_runs_an_episode(agent_file, attr, name):
    from diloco_gym import DiLoCoSyncEnv

    agent = make_agent(f"{agent_file}:{attr}")
    assert isinstance(agent, UserAgent) and agent.name == name and agent.deployable
    res = run_episode(DiLoCoSyncEnv("bursty"), agent, seed=0)
    assert res["deployable"] and res["steps"] > 0


def test_a_function_and_a_gate_class_take_the_same_decisions(agent_file):
    from diloco_gym import DiLoCoSyncEnv

    env = DiLoCoSyncEnv("bursty")
    a = run_episode(env, make_agent(f"{agent_file}:Gate"), seed=1)
    b = run_episode(env, make_agent(f"{agent_file}:merge_when_low"), seed=1)
    assert a["merge_decisions"] == b["merge_decisions"] and len(a["merge_decisions"]) > 0


def test_a_function_agent_answers_one_observation_or_a_batch(agent_file):
    agent = make_agent(f"{agent_file}:merge_when_low")
    obs = np.zeros((3, 17), dtype=np.float32)
    obs[1, 0] = 0.9
    actions, _ = agent.predict(obs)
    assert actions.tolist() == [1, 0, 1]
    one, _ = agent.predict(obs[1])
    assert int(one) == 0


def test_a_module_attr_spec_imports_from_the_current_directory(agent_file, monkeypatch):
    monkeypatch.chdir(agent_file.parent)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    try:
        assert make_agent("my_sched:Gate").name == "my-gate"
    finally:
        sys.modules.pop("my_sched", None)


def test_a_file_is_loaded_once_per_process(agent_file):
    a = load_user_agent(f"{agent_file}:Gate")
    b = load_user_agent(f"{agent_file}:Gate")
    assert type(a.inner) is type(b.inner) and a.inner is not b.inner


@pytest.mark.parametrize(
    ("spec", "wanted"),
    [
        ("missing.py:Gate", "file missing.py not found"),
        ("{f}:Nope", "has no attribute 'Nope' (it defines: Budgeted, Gate, NeedsArgs,"),
        ("{f}:not_an_agent", "int has no predict(observation"),
        ("{f}:two_args", "takes 2 positional arguments"),
        ("{f}:NeedsArgs", "class NeedsArgs needs constructor arguments"),
        ("no_such_module_here:Gate", "no module named 'no_such_module_here'"),
    ],
)
def test_errors_are_one_line_and_name_the_file(agent_file, spec, wanted):
    spec = spec.format(f=agent_file)
    with pytest.raises(AgentSpecError) as exc:
        make_agent(spec)
    text = str(exc.value)
    assert "\n" not in text and wanted in text and text.startswith(f"agent {spec!r}")
    if "{f}" in spec:
        assert str(agent_file) in text


def test_an_import_error_names_the_file_and_its_line(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("import numpy\n\nx = 1 / 0\n")
    with pytest.raises(AgentSpecError) as exc:
        make_agent(f"{bad}:Gate")
    assert f"importing {bad} (line 3) failed: ZeroDivisionError: division by zero" in str(exc.value)
    syntax = tmp_path / "syntax.py"
    syntax.write_text("def f(:\n")
    with pytest.raises(AgentSpecError, match=r"syntax\.py \(line 1\) failed: SyntaxError"):
        make_agent(f"{syntax}:f")
    assert _module_name(bad.resolve()) not in sys.modules  # a failed import is not kept


def test_flags_are_kept_and_budget_awareness_is_read_from_the_object(agent_file):
    assert is_budget_aware_spec(f"{agent_file}:Budgeted")
    assert not is_budget_aware_spec(f"{agent_file}:Gate")
    peeker = make_agent(f"{agent_file}:Peeker")
    assert not peeker.deployable and callable(peeker.attach_episode)
    assert not hasattr(make_agent(f"{agent_file}:Gate"), "attach_episode")


def test_the_same_file_agent_twice_is_refused_and_paths_are_shipped_absolute(
    agent_file, monkeypatch
):
    monkeypatch.chdir(agent_file.parent)
    assert shipped_spec("my_sched.py:Gate") == f"{agent_file}:Gate"
    assert shipped_spec("pkg.mod:Gate") == "pkg.mod:Gate"
    with pytest.raises(ValueError, match="given twice"):
        make_agents(["my_sched.py:Gate", f"{agent_file}:Gate"])


def test_an_sb3_model_is_judged_through_its_policy():
    sb3 = pytest.importorskip("stable_baselines3")
    from diloco_gym import DiLoCoSyncEnv

    model = sb3.PPO("MlpPolicy", DiLoCoSyncEnv("bursty"), n_steps=16, batch_size=16, device="cpu")
    agent = as_agent(model, name="my-ppo")
    assert agent.name == "my-ppo" and agent.inner is model.policy
    res = run_episode(DiLoCoSyncEnv("bursty"), pickle.loads(pickle.dumps(agent)), seed=0)
    assert res["steps"] > 0


@pytest.mark.slow
def test_a_file_agent_unpickles_where_its_file_cannot_be_imported(agent_file, tmp_path):
    """The agent's class travels by value: a fresh interpreter with no access to the
    file's folder rebuilds it and gets the same actions."""
    agent = make_agent(f"{agent_file}:Gate")
    blob = tmp_path / "agent.pkl"
    blob.write_bytes(pickle.dumps(agent))
    agent_file.unlink()
    code = textwrap.dedent(
        f"""
        import pickle, numpy as np
        agent = pickle.loads(open({str(blob)!r}, "rb").read())
        obs = np.zeros(17, dtype=np.float32)
        print(agent.name, int(agent.predict(obs)[0]), type(agent.inner).__name__)
        """
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd="/"
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["my-gate", "1", "Gate"]


def test_sweep_files_name_agent_files_relative_to_their_folder(tmp_path):
    """A sweep file's ``agents = ["my_sched.py:Gate"]`` is the file beside it, as its model
    paths are; ``module:attr`` and names are left as they are."""
    from diloco_gym.scale.sweep import _agent_path

    assert _agent_path("my_sched.py:Gate", tmp_path) == f"{tmp_path.resolve()}/my_sched.py:Gate"
    assert _agent_path("pkg.mod:Gate", tmp_path) == "pkg.mod:Gate"
    assert _agent_path("fixed-512", tmp_path) == "fixed-512"
    assert _agent_path("runs/model.zip", tmp_path) == str((tmp_path / "runs/model.zip").resolve())
