"""The algorithm table of ``diloco-gym train``: the algorithms by CLI name, their
stable-baselines3 classes, their default hyperparameters and the vector-env kinds.

A leaf of the RL layer (it imports stable-baselines3 only when a class is asked for), so
that the configuration checks (:mod:`diloco_gym.rl.config`) and the trainer
(:mod:`diloco_gym.rl.trainer`) both read it without importing each other.
"""

from __future__ import annotations

import inspect
import platform
from typing import Any

__all__ = [
    "ALGOS",
    "VEC_ENVS",
    "SELECT_BY",
    "RESERVED_ALGO_KEYS",
    "algo_class",
    "algo_kwargs",
    "default_hyperparameters",
    "library_versions",
]

#: Algorithms ``train`` knows, by CLI name.
ALGOS = ("ppo", "maskable-ppo", "dqn")
#: How ``train`` batches its ``n_envs`` environments (``--vec-env``).
VEC_ENVS = ("native", "subproc", "dummy")
#: How validation picks ``best_model.zip`` (``select_by``): the lowest mean of the agent's
#: sync-excess minus matched random at its own number of merges (``vs_random``: fair across
#: merge counts), or the lowest mean sync-excess (``sync_excess``: favours merging less
#: where the merge count is free; the rule before 0.6).
SELECT_BY = ("vs_random", "sync_excess")
#: Keyword arguments of an SB3 algorithm that ``train`` sets itself.
RESERVED_ALGO_KEYS = frozenset({"policy", "env", "seed", "device", "verbose", "tensorboard_log"})


def algo_class(algo: str) -> Any:
    """The stable-baselines3 (or sb3-contrib) class of ``algo``.

    Raises:
        ValueError: an unknown algorithm (listing the valid ones).
        ImportError: the ``rl`` extra is missing.
    """
    if algo == "ppo":
        from stable_baselines3 import PPO

        return PPO
    if algo == "maskable-ppo":
        from sb3_contrib import MaskablePPO

        return MaskablePPO
    if algo == "dqn":
        from stable_baselines3 import DQN

        return DQN
    raise ValueError(f"unknown algo {algo!r}; valid: {', '.join(ALGOS)}")


def algo_kwargs(algo: str) -> set[str]:
    """The hyperparameters ``algo``'s class takes, less those ``train`` sets itself."""
    params = inspect.signature(algo_class(algo).__init__).parameters
    return {n for n in params if n not in ("self", "_init_setup_model")} - RESERVED_ALGO_KEYS


def default_hyperparameters(algo: str, n_envs: int, timesteps: int) -> dict[str, Any]:
    """The hyperparameters ``train`` uses (an MLP 64x64 policy for every algorithm)."""
    arch = {"net_arch": [64, 64]}
    if algo in ("ppo", "maskable-ppo"):
        return {
            "n_steps": 256,
            "batch_size": 256,
            "n_epochs": 10,
            "learning_rate": 3e-4,
            "gamma": 0.995,
            "gae_lambda": 0.95,
            "ent_coef": 0.01,
            "clip_range": 0.2,
            "policy_kwargs": arch,
        }
    if algo == "dqn":
        return {
            "learning_rate": 5e-4,
            "buffer_size": 100_000,
            "learning_starts": int(min(5_000, max(64, timesteps // 10))),
            "batch_size": 64,
            "gamma": 0.995,
            "train_freq": 4,
            "target_update_interval": 1_000,
            "exploration_fraction": 0.3,
            "exploration_final_eps": 0.02,
            "policy_kwargs": arch,
        }
    raise ValueError(f"unknown algo {algo!r}; valid: {', '.join(ALGOS)}")


def library_versions() -> dict[str, str]:
    """The versions a trained model depends on (recorded in its ``meta.json``): same seed,
    same versions and machine give the same model. ``torch_cpu`` is the instruction set
    torch's CPU kernels use (``AVX2``, ``AVX512``, ...): the same seed and versions give
    other weights where it differs, since the kernels round differently."""
    import gymnasium as gym
    import numpy as np
    import stable_baselines3
    import torch

    import diloco_gym

    out = {
        "diloco_gym": diloco_gym.__version__,  # the trace generator's draws per seed
        "python": platform.python_version(),
        "stable_baselines3": stable_baselines3.__version__,
        "torch": torch.__version__,
        "gymnasium": gym.__version__,
        "numpy": np.__version__,
        "torch_cpu": torch.backends.cpu.get_cpu_capability(),
    }
    try:
        import sb3_contrib

        out["sb3_contrib"] = sb3_contrib.__version__
    except ImportError:  # pragma: no cover - part of the rl extra
        pass
    return out
