"""Tests of :mod:`diloco_gym.agents.learned`: loading trained models (safely), their names,
the shipped reference agents."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

from rl_helpers import (  # noqa: E402
    observations,
)

from diloco_gym.agents.learned import (  # noqa: E402
    REFERENCE_MODEL,
    load_learned_agent,  # noqa: E402
    reference_model_path,
)
from diloco_gym.agents.registry import (
    make_agent,  # noqa: E402
    make_agents,  # noqa: E402
)
from diloco_gym.cli import main  # noqa: E402
from diloco_gym.envs.env import DiLoCoSyncEnv  # noqa: E402
from diloco_gym.eval.rollout import run_episode  # noqa: E402


def test_save_load_round_trip_same_actions(ppo_run: Path, tmp_path: Path) -> None:
    agent = load_learned_agent(ppo_run / "model.zip")
    assert agent.name == "ppo:model" and agent.meta["regime"] == "bursty"
    obs = observations()
    a1 = agent.predict(obs)[0]
    trusted = load_learned_agent(ppo_run / "model.zip", trust=True)  # SB3's own loader
    np.testing.assert_array_equal(a1, trusted.predict(obs)[0])
    trusted.model.save(tmp_path / "copy.zip")
    again = load_learned_agent(tmp_path / "copy.zip")  # no meta.json: algo from the zip
    assert again.name == "ppo:copy"
    np.testing.assert_array_equal(a1, again.predict(obs)[0])
    # single observations agree with the batch
    assert [int(agent.predict(o)[0]) for o in obs[:8]] == list(a1[:8])


def test_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.zip"
    with pytest.raises(FileNotFoundError, match="nope.zip"):
        load_learned_agent(missing)
    with pytest.raises(SystemExit, match="not found"):
        main(["run", "--agent", str(missing), "--seeds", "2"])


def test_corrupt_model_is_a_clear_error(ppo_run: Path, tmp_path: Path) -> None:
    junk = tmp_path / "junk.zip"
    junk.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(ValueError, match=r"junk\.zip is not a valid model"):
        load_learned_agent(junk)
    truncated = tmp_path / "truncated.zip"
    data = (ppo_run / "model.zip").read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"truncated\.zip is not a valid model"):
        load_learned_agent(truncated)
    empty_zip = tmp_path / "empty.zip"
    with zipfile.ZipFile(empty_zip, "w") as zf:
        zf.writestr("hello.txt", "not a model")
    with pytest.raises(ValueError, match=r"empty\.zip is not a valid model"):
        load_learned_agent(empty_zip)


def test_unsafe_weights_error_gives_no_unsafe_advice(tmp_path: Path) -> None:
    """Weights that hold a pickled Python object: PyTorch's safe loader refuses them and
    advises retrying with weights_only=False; that advice (code execution from a file of
    unknown origin) must not reach the user."""
    import argparse
    import io

    import torch

    buf = io.BytesIO()
    torch.save({"x": argparse.Namespace(a=1)}, buf)
    bad = tmp_path / "pickled.zip"
    with zipfile.ZipFile(REFERENCE_MODEL) as zin, zipfile.ZipFile(bad, "w") as zout:
        for name in zin.namelist():
            zout.writestr(name, buf.getvalue() if name == "policy.pth" else zin.read(name))
    with pytest.raises(ValueError) as err:
        load_learned_agent(bad)
    msg = str(err.value)
    assert "pickled.zip is not a valid model" in msg
    assert "argparse.Namespace" in msg and "tensors only" in msg
    for unsafe in ("weights_only", "add_safe_globals", "safe_globals", "trusted source"):
        assert unsafe not in msg
    assert "\n" not in msg and "\x1b" not in msg


def test_reference_agent_loads_and_runs() -> None:
    if not REFERENCE_MODEL.is_file():
        pytest.skip("reference model not shipped")
    assert REFERENCE_MODEL.stat().st_size < 1_000_000
    agent = load_learned_agent(REFERENCE_MODEL)
    assert agent.name == "ppo:model" and agent.deployable
    meta = json.loads(REFERENCE_MODEL.with_name("meta.json").read_text())
    assert meta["regime"] == "bursty"
    r = run_episode(DiLoCoSyncEnv("bursty"), agent, seed=0)
    assert r["merges"] >= 1 and np.isfinite(r["sync_excess_pct"])
    assert make_agent(str(REFERENCE_MODEL)).name == agent.name
    ref = make_agent("reference-ppo")
    assert ref.name == "reference-ppo" and ref.path == REFERENCE_MODEL.resolve()
    assert run_episode(DiLoCoSyncEnv("bursty"), ref, seed=0) == r


def _copy_model(dst: Path) -> Path:
    dst.mkdir(parents=True)
    (dst / "model.zip").write_bytes(REFERENCE_MODEL.read_bytes())
    return dst / "model.zip"


def test_learned_agents_get_unique_names(tmp_path: Path, monkeypatch) -> None:
    """Two models of the same algorithm and regime used to share a name (one vanished from
    the summary); now each is named from its path, parents added only when needed."""
    a = _copy_model(tmp_path / "runs" / "ppo")
    b = _copy_model(tmp_path / "other" / "ppo")
    monkeypatch.chdir(tmp_path)
    agents = make_agents([str(REFERENCE_MODEL), "runs/ppo/model.zip", "wa-diloco"])
    assert [x.name for x in agents] == ["ppo:reference/model", "ppo:ppo/model", "wa-diloco"]
    assert [x.name for x in make_agents(["runs/ppo/model.zip"])] == ["ppo:model"]
    names = [x.name for x in make_agents([str(a), str(b), "reference-ppo"])]
    assert names == ["ppo:runs/ppo/model", "ppo:other/ppo/model", "reference-ppo"]
    assert len({x.name for x in make_agents(["runs/ppo", str(b)])}) == 2  # a directory


def test_the_same_agent_twice_is_refused(tmp_path: Path, monkeypatch) -> None:
    _copy_model(tmp_path / "runs" / "ppo")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="'wa-diloco' is given twice"):
        make_agents(["wa-diloco", "fixed-256", "wa-diloco"])
    with pytest.raises(ValueError, match="given twice \\(the same model as 'runs/ppo'\\)"):
        make_agents(["runs/ppo", "runs/ppo/model.zip"])
    with pytest.raises(ValueError, match="the same model as 'reference-ppo'"):
        make_agents(["reference-ppo", str(REFERENCE_MODEL)])
    with pytest.raises(SystemExit, match="given twice"):
        main(
            [
                "report",
                "--regimes",
                "bursty",
                "--agents",
                "fixed-256",
                "--agent",
                "runs/ppo/model.zip",
                "--agent",
                "./runs/ppo/model.zip",
                "--seeds",
                "2",
                "--out",
                str(tmp_path / "rep"),
                "--no-progress",
            ]
        )
    assert not (tmp_path / "rep").exists()


@pytest.mark.slow
def test_reference_agent_works_from_any_directory(tmp_path: Path) -> None:
    """The registry name loads the package data, whatever the working directory."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    code = (
        "from diloco_gym.agents.registry import make_agent\n"
        "from diloco_gym.envs.env import DiLoCoSyncEnv\n"
        "from diloco_gym.eval.rollout import run_episode\n"
        "a = make_agent('reference-ppo')\n"
        "r = run_episode(DiLoCoSyncEnv('bursty'), a, 0)\n"
        "print(a.name, a.path, r['merges'])\n"
    )
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    name, path, merges = out.stdout.split()
    assert name == "reference-ppo" and Path(path) == reference_model_path().resolve()
    assert int(merges) >= 1
    # The relative path only works from the repository root: a clear error elsewhere.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "diloco_gym.cli",
            "run",
            "--agent",
            "agents/reference/model.zip",
            "--seeds",
            "1",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0 and "model file not found" in out.stderr


def test_reference_agent_is_package_data() -> None:
    """pyproject ships every layer of the package, and the agents package with the reference
    model and its metadata."""
    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parents[2]
    conf = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    setuptools = pytest.importorskip("setuptools")
    found = set(
        setuptools.find_namespace_packages(
            where=str(root), include=conf["packages"]["find"]["include"]
        )
    )
    layers = {f"diloco_gym.{layer}" for layer in ("sim", "envs", "eval", "rl", "live", "scale")}
    assert {"diloco_gym", "diloco_gym.agents", "diloco_gym.agents.reference"} | layers <= found
    shipped = {
        f
        for pattern in conf["package-data"]["diloco_gym.agents"]
        for f in (root / "agents").glob(pattern)
    }
    for name in ("model.zip", "meta.json", "README.md"):
        assert root / "agents" / "reference" / name in shipped


@pytest.mark.slow
def test_only_the_train_and_calibrate_commands_import_torch() -> None:
    """``report``, ``run`` and ``--help`` build their parsers without the RL stack (it costs
    seconds to import); ``train`` still gets all its options."""
    import sys

    probe = (
        "import sys\nfrom diloco_gym.cli import build_parser\n"
        "p = build_parser({cmd!r})\n{parse}\n"
        "print('stable_baselines3' in sys.modules, 'torch' in sys.modules)"
    )
    for cmd, parse, want in [
        ("report", "p.parse_args(['report', '--seeds', '2'])", "False False"),
        ("", "", "False False"),
        (
            "train",
            "a = p.parse_args(['train', '--algo', 'dqn', '--timesteps', '5'])\n"
            "assert a.algo == 'dqn' and a.timesteps == 5",
            "True True",
        ),
    ]:
        out = subprocess.run(
            [sys.executable, "-c", probe.format(cmd=cmd, parse=parse)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split("\n")[-2] == want, (cmd, out.stdout)


class _Never:
    name = "never"

    def predict(self, obs, **kwargs):
        return np.array([0]), None


BUDGET_REFERENCES = [
    ("reference-budget-bursty", "budget-bursty"),
    ("reference-budget-non-periodic", "budget-non-periodic"),
    ("reference-budget-mixed", "budget-mixed"),
    ("reference-budget-bursty-v1", "budget-bursty-v1"),
]


@pytest.mark.parametrize(
    ("name", "folder"),
    [("reference-ppo-v1", "ppo-v1"), ("reference-ppo-v2", "ppo-v2"), *BUDGET_REFERENCES],
)
def test_v1_reference_agents_were_trained_on_v1s_reward(name, folder) -> None:
    """The ``-v1`` and ``-v2`` agents' recorded environment is DiLoCoSync-v1's reward; the
    others', v0's (their configs train as they did). The ``-v2`` agent's learners are the
    shipped calibration's, recorded by name (so its env rebuilds on any installation) and
    by SHA-256; the others' are the default learners."""
    import hashlib

    from diloco_gym.envs.versions import V1_KWARGS
    from diloco_gym.sim.learner_calibration import shipped_path

    root = Path(__file__).resolve().parents[2]
    meta = json.loads((root / "agents" / "reference" / folder / "meta.json").read_text())
    env = meta["env_params"]
    recorded = meta["config"].get("learner_calibration_file")
    if name.endswith("-v2"):
        assert meta["env_kwargs"]["learner_calibration"] == "shipped"
        sha = hashlib.sha256(Path(shipped_path()).read_bytes()).hexdigest()
        assert recorded == {"path": "shipped", "sha256": sha}
        assert DiLoCoSyncEnv("bursty", **meta["env_kwargs"]).learner_params == (
            DiLoCoSyncEnv("bursty", learner_calibration="shipped").learner_params
        )
    else:
        assert recorded is None
    if name[-3:] in ("-v1", "-v2"):
        assert {k: env[k] for k in V1_KWARGS} == V1_KWARGS
        assert meta["command"].startswith(f"diloco-gym train --config agents/reference/{folder}/")
    else:
        assert env.get("reward_shaping", "none") == "none"


@pytest.mark.parametrize(("name", "folder"), BUDGET_REFERENCES)
def test_budget_reference_agents_ship_with_config_command_and_curve(name, folder) -> None:
    """Each shipped budget-conditioned agent: package data (model, meta, config, README,
    validation curve), trained from the config file in its folder, and loaded by name as a
    budget-aware agent that holds every budget of the frontier's grid."""
    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parents[2]
    ref = root / "agents" / "reference"
    conf = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    shipped = {f for p in conf["package-data"]["diloco_gym.agents"] for f in ref.parent.glob(p)}
    files = ("model.zip", "meta.json", "config.toml", "validation.csv", "validation.png")
    for f in files:
        assert ref / folder / f in shipped, f
    meta = json.loads((ref / folder / "meta.json").read_text())
    assert meta["config"]["file"]["text"] == (ref / folder / "config.toml").read_text()
    assert meta["command"].startswith(f"diloco-gym train --config agents/reference/{folder}/")
    assert meta["status"] == "complete" and meta["algo"] == "maskable-ppo"
    assert f"`{name}`" in (ref / "README.md").read_text()
    from diloco_gym.agents.registry import is_budget_aware_spec

    assert is_budget_aware_spec(name)  # frontier --agent runs it on the grid only
    agent = make_agent(name)
    assert agent.name == name and agent.budget_aware
    for m in (8, 12, 24):
        res = run_episode(DiLoCoSyncEnv("bursty", merge_budget=m), agent, seed=1)
        assert res["merges"] == m
    again = run_episode(DiLoCoSyncEnv("bursty", merge_budget=24), make_agent(name), seed=1)
    assert again == res  # deterministic


def test_a_missing_rl_extra_is_named_not_blamed_on_the_file(monkeypatch) -> None:
    """Without stable-baselines3 (no 'rl' extra) the shipped model is a valid file: the
    error names the missing extra, not the model."""
    import diloco_gym.agents.learned as learned

    def no_rl(algo: str):
        raise ImportError(f"No module named 'stable_baselines3' ({algo})")

    monkeypatch.setattr(learned, "_model_class", no_rl)
    # The safe loader imports the policy classes itself: hide them too.
    for mod in ("stable_baselines3.common.policies", "sb3_contrib.common.maskable.policies"):
        monkeypatch.setitem(sys.modules, mod, None)
    for trust in (False, True):
        with pytest.raises(
            ValueError, match=r"needs the 'rl' extra \(pip install 'diloco-gym\[rl\]'\)"
        ):
            learned.load_learned_agent(str(learned.reference_model_path()), trust=trust)
