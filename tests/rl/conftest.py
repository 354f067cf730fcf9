"""Fixtures of the RL tests: one tiny PPO run and one tiny budget-conditioned run, trained
once per session and shared (read-only) by the modules that need them."""

from __future__ import annotations

from pathlib import Path

import pytest
from rl_helpers import TINY, TINY_CONFIG, write_config


@pytest.fixture(scope="session")
def ppo_run(tmp_path_factory) -> Path:
    """A tiny PPO run on bursty (seed 3): model, best model, checkpoints, logs."""
    pytest.importorskip("stable_baselines3")
    from diloco_gym.cli import main

    out = tmp_path_factory.mktemp("ppo")
    assert main(["train", "--algo", "ppo", "--seed", "3", "--out", str(out), *TINY]) == 0
    return out


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """A tiny budget-conditioned MaskablePPO run (:data:`rl_helpers.TINY_CONFIG`)."""
    pytest.importorskip("sb3_contrib")
    from diloco_gym.cli import main

    d = tmp_path_factory.mktemp("budget")
    cfg = write_config(d, TINY_CONFIG)
    assert main(["train", "--config", str(cfg), "--out", str(d / "run"), "--no-progress"]) == 0
    return d / "run"
