"""What several RL test modules share: tiny training settings and CLI helpers."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from diloco_gym.cli import main
from diloco_gym.envs.env import DiLoCoSyncEnv

#: ``diloco-gym train`` options of a tiny PPO run (checkpoints and validation included).
TINY = [
    "--timesteps",
    "1024",
    "--n-envs",
    "2",
    "--eval-episodes",
    "2",
    "--eval-freq",
    "512",
    "--checkpoint-freq",
    "512",
    "--no-progress",
]

#: ``diloco-gym train`` options of an even smaller run (run-directory tests).
SMALL = [
    "--timesteps",
    "256",
    "--n-envs",
    "1",
    "--eval-episodes",
    "1",
    "--eval-freq",
    "0",
    "--checkpoint-freq",
    "128",
    "--no-progress",
]

#: A tiny budget-conditioned configuration: imitation warm start, two budgets.
TINY_CONFIG = """
[train]
algo = "maskable-ppo"
timesteps = 256
seed = 5
eval_episodes = 1
eval_freq = 0
checkpoint_freq = 0
bc_teacher = "online-forecast-budget"
bc_episodes = 2
bc_epochs = 1

[env]
regimes = ["bursty"]
budgets_per_10min = [10, 16]
excess_weight = 1.0

[algo]
n_steps = 128
batch_size = 64
n_epochs = 2
policy_kwargs = { net_arch = [16, 16] }
"""


def observations(n: int = 64) -> np.ndarray:
    """Observations on two bursty trajectories plus random points of the observation
    space, to compare policies on and off trajectory."""
    env = DiLoCoSyncEnv("bursty")
    rng = np.random.default_rng(0)
    obs = []
    for seed in (3, 4):
        o, _ = env.reset(seed=seed)
        while len(obs) < n * seed // 4:
            obs.append(o)
            o, _, _, truncated, _ = env.step(int(rng.integers(2)))
            if truncated:
                break
    arr = np.array(obs, dtype=np.float32)
    space = env.observation_space
    space.seed(0)
    return np.concatenate([arr, np.array([space.sample() for _ in range(16)])])


def write_config(tmp_path: Path, text: str, name: str = "cfg.toml") -> Path:
    """``text`` written to ``tmp_path / name``."""
    p = tmp_path / name
    p.write_text(text)
    return p


def cli_exit(argv: list[str], capsys) -> tuple[int, str]:
    """``(exit code, stderr)`` of a CLI call that exits."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    return int(exc.value.code), err


def cli_exit_one_line(argv: list[str], capsys) -> tuple[int, str]:
    """As :func:`cli_exit`, and the error is one line without a traceback."""
    code, err = cli_exit(argv, capsys)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return code, err


def copy_run(src: Path, dst: Path) -> Path:
    """A copy of a run directory."""
    shutil.copytree(src, dst)
    return dst
