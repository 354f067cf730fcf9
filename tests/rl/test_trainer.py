"""Tests of :mod:`diloco_gym.rl.trainer`: same seed, same model; every algorithm trains
and loads; the documented configuration trains."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

from rl_helpers import (  # noqa: E402
    TINY,
    TINY_CONFIG,
    observations,
    write_config,
)

from diloco_gym.agents.learned import LearnedAgent, load_learned_agent  # noqa: E402
from diloco_gym.agents.registry import make_agent  # noqa: E402
from diloco_gym.cli import main  # noqa: E402
from diloco_gym.envs.env import DiLoCoSyncEnv  # noqa: E402
from diloco_gym.eval.rollout import run_episode  # noqa: E402


def test_same_seed_same_model(ppo_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "again"
    assert main(["train", "--algo", "ppo", "--seed", "3", "--out", str(out), *TINY]) == 0
    obs = observations()
    a = load_learned_agent(ppo_run / "model.zip")
    b = load_learned_agent(out / "model.zip")
    np.testing.assert_array_equal(a.predict(obs)[0], b.predict(obs)[0])
    pa = a.model.policy.state_dict()
    pb = b.model.policy.state_dict()
    for k in pa:
        np.testing.assert_array_equal(pa[k].numpy(), pb[k].numpy())


@pytest.mark.parametrize("algo", ["maskable-ppo", "dqn"])
def test_other_algorithms_train_and_load(algo: str, tmp_path: Path) -> None:
    pytest.importorskip("sb3_contrib")
    assert main(["train", "--algo", algo, "--seed", "0", "--out", str(tmp_path), *TINY]) == 0
    agent = make_agent(str(tmp_path / "model.zip"))
    assert isinstance(agent, LearnedAgent) and agent.meta["algo"] == algo
    r = run_episode(DiLoCoSyncEnv("bursty"), agent, seed=0)
    assert r["merges"] >= 1


def _policy_bytes(path: Path) -> bytes:
    with zipfile.ZipFile(path) as zf:
        return zf.read("policy.pth")


def test_retraining_with_the_same_seed_gives_the_same_policy(tiny_run: Path, tmp_path) -> None:
    cfg = write_config(tmp_path, TINY_CONFIG)
    out = tmp_path / "again"
    assert main(["train", "--config", str(cfg), "--out", str(out), "--no-progress"]) == 0
    assert _policy_bytes(out / "model.zip") == _policy_bytes(tiny_run / "model.zip")


def test_the_docs_config_example_parses_and_trains(tmp_path, monkeypatch) -> None:
    """docs/training.md's "Train your own agent" config, from the repository root."""
    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "training.md").read_text()
    section = text.split("## Train your own agent", 1)[1]
    example = section.split("```toml\n", 1)[1].split("```", 1)[0]
    cfg = write_config(tmp_path, example, "mine.toml")
    monkeypatch.chdir(root)
    out = tmp_path / "mine"
    argv = ["train", "--config", str(cfg), "--out", str(out), "--no-progress"]
    assert main([*argv, "--timesteps", "300", "--eval-episodes", "1", "--eval-freq", "0"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["regime"] == "replay:bursty"
    assert [s["merge_budget"] for s in meta["env_specs"]] == [2, 3]  # 120 s episodes
    assert meta["config"]["calibration"].endswith("calibration_reference.json")
    assert meta["timesteps"] >= 300


def test_a_shaping_discount_other_than_the_agents_is_warned() -> None:
    """train's own PPO defaults (gamma 0.995) with v1's reward (shaping_gamma 0.99): the
    shaping is then not potential-based for the agent, and train says so (on v1 those
    defaults gave policies that never merge, docs/training.md)."""
    from diloco_gym.envs.versions import V1_KWARGS
    from diloco_gym.rl.algos import default_hyperparameters
    from diloco_gym.rl.trainer import shaping_discount_warning

    hp = default_hyperparameters("ppo", 1, 1000)
    note = shaping_discount_warning(dict(V1_KWARGS), hp)
    assert note is not None and "shaping_gamma 0.99" in note and "gamma 0.995" in note
    assert "set [env] shaping_gamma = 0.995" in note
    assert shaping_discount_warning({**V1_KWARGS, "shaping_gamma": 0.995}, hp) is None
    assert shaping_discount_warning({"reward_shaping": "none"}, hp) is None
    assert shaping_discount_warning({}, hp) is None
    assert shaping_discount_warning(dict(V1_KWARGS), {**hp, "gamma": 0.99}) is None
