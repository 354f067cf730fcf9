"""Behaviour cloning: the imitation warm start of a budget-conditioned run.

A deployable teacher (a registry agent, e.g. ``online-forecast-budget``) plays
training-range episodes; the policy is fitted to its actions by cross-entropy before
reinforcement learning continues from there (:func:`behaviour_clone`, on single-host and
fleet envs alike: on a fleet the teacher reads the fleet observation through its fleet view,
:func:`diloco_gym.agents.fleet.fleet_agent`).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from diloco_gym.envs.observation import OBS_INDEX
from diloco_gym.eval.rollout import attach_agent
from diloco_gym.eval.seed_ranges import TRAIN_SEED_HIGH, TRAIN_SEED_LOW

__all__ = ["behaviour_clone", "teacher_samples", "fit_to_actions"]


def behaviour_clone(
    model: Any,
    specs: list[Any],
    teacher: str,
    episodes: int,
    epochs: int,
    seed: int,
    env_params: dict[str, Any] | None = None,
    obs_transform: str | None = None,
    learning_rate: float = 1e-3,
    batch_size: int = 256,
) -> dict[str, Any]:
    """Warm-start ``model``'s policy by imitating a teacher agent (behaviour cloning).

    The teacher (a deployable registry agent, e.g. ``online-forecast-budget``) plays
    ``episodes`` episodes of every env kind, with episode seeds from the training range
    ``[TRAIN_SEED_LOW, TRAIN_SEED_HIGH)`` drawn from a generator seeded with ``seed``; the
    policy is then fitted to its actions by cross-entropy (``epochs`` passes, Adam, torch
    generator seeded with ``seed``). Reinforcement learning continues from there. The
    teacher sees what any agent sees (observations, masks, public parameters); the policy
    sees the transformed observations it is trained on.

    Returns:
        ``{"teacher", "episodes_per_env", "samples", "merge_share", "epochs",
        "train_accuracy", "merge_recall", "final_loss"}``.
    """
    from diloco_gym.agents.fleet import fleet_agent
    from diloco_gym.agents.fleet_rounds import rounds_agent, split_rule
    from diloco_gym.agents.registry import make_agent
    from diloco_gym.envs.fleet import DiLoCoFleetEnv
    from diloco_gym.rl.wrappers import BudgetFeatures

    rng = np.random.default_rng([seed, 77])
    xs: list[np.ndarray] = []
    ys: list[int] = []
    for spec in specs:
        env: gym.Env = spec.make(env_params)
        fleet_env = env if isinstance(env, DiLoCoFleetEnv) else None
        fleet = fleet_env is not None
        # the teacher reads the env's own features: a fleet's wider observation, through
        # the heuristic's fleet view
        n_raw = int(np.prod(env.observation_space.shape or ())) if fleet else len(OBS_INDEX)
        if obs_transform is not None:
            env = BudgetFeatures(env)
        name, rule = split_rule(teacher)
        agent = make_agent(name)
        if not getattr(agent, "deployable", True):
            raise ValueError(f"behaviour cloning needs a deployable teacher, not {teacher!r}")
        if fleet:  # a rounds fleet's teacher opens the rounds; its site rule times each site
            agent = fleet_agent(agent)
            if fleet_env is not None and fleet_env.fleet.per_site_timing:
                agent = rounds_agent(agent, rule)
        teacher_samples(env, agent, episodes, rng, n_raw, xs, ys)
    return {"teacher": teacher, "episodes_per_env": int(episodes), "samples": len(ys)} | (
        fit_to_actions(model, xs, ys, epochs, seed, learning_rate, batch_size)
    )


def teacher_samples(
    env: gym.Env,
    agent: Any,
    episodes: int,
    rng: np.random.Generator,
    n_raw: int,
    xs: list[np.ndarray],
    ys: list[Any],
) -> None:
    """Append to ``xs``/``ys`` the observations and actions of ``agent`` on ``episodes``
    episodes of ``env`` (seeds from the training range, drawn from ``rng``); the teacher
    reads the first ``n_raw`` features (the env's own), the policy the whole observation.
    An action is an ``int``, or an array of site actions on a rounds fleet."""
    base = env.unwrapped
    for _ in range(episodes):
        ep_seed = int(rng.integers(TRAIN_SEED_LOW, TRAIN_SEED_HIGH))
        obs, _ = env.reset(seed=ep_seed)
        ctx = attach_agent(env, agent, ep_seed)
        done = False
        while not done:
            ctx._set_mask(base.action_masks())  # type: ignore[attr-defined]
            a, _ = agent.predict(np.asarray(obs)[:n_raw])
            a = int(a) if np.ndim(a) == 0 else np.asarray(a, dtype=np.int64)
            xs.append(np.asarray(obs, dtype=np.float32))
            ys.append(a)
            obs, _, terminated, truncated, _ = env.step(a)
            done = bool(terminated or truncated)


def fit_to_actions(
    model: Any,
    xs: list[np.ndarray],
    ys: list[Any],
    epochs: int,
    seed: int,
    learning_rate: float,
    batch_size: int,
) -> dict[str, Any]:
    """Fit ``model``'s policy to the actions ``ys`` at ``xs`` (cross-entropy, Adam, ``epochs``
    passes in a torch-generator order seeded with ``seed``). ``ys`` are actions ``0``/``1``,
    or rows of site actions (a rounds fleet's ``MultiBinary``).

    Returns:
        ``{"merge_share", "epochs", "train_accuracy", "merge_recall", "final_loss"}``:
        the share of ones among the actions (site actions counted one by one), the share
        of samples whose most likely action is the teacher's (every site right), the share
        of the teacher's ones the policy predicts, and the last batch's loss.
    """
    import torch

    x = torch.as_tensor(np.stack(xs))
    y = torch.as_tensor(np.array(ys, dtype=np.int64))
    policy = model.policy
    opt = torch.optim.Adam(policy.parameters(), lr=learning_rate)
    gen = torch.Generator().manual_seed(int(seed))
    loss = torch.tensor(0.0)
    policy.set_training_mode(True)
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), batch_size):
            idx = perm[i : i + batch_size]
            loss = -policy.get_distribution(x[idx]).log_prob(y[idx]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    policy.set_training_mode(False)
    with torch.no_grad():
        pred = policy.get_distribution(x).mode()
    merges = y == 1
    right = pred == y if y.ndim == 1 else (pred == y).all(dim=1)
    return {
        "merge_share": float(merges.float().mean()),
        "epochs": int(epochs),
        "train_accuracy": float(right.float().mean()),
        "merge_recall": float((pred[merges] == 1).float().mean()) if merges.any() else None,
        "final_loss": float(loss.detach()),
    }
