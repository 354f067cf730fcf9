"""Observation wrappers for learned, budget-conditioned schedulers.

A policy trained across merge budgets must know its budget. The env's observation already
carries ``budget_left`` (merges left / ``merge_budget``), which says nothing about how large
the budget is or how the merges left compare with the time left. :func:`budget_features`
adds three features, computed from the observation and the env's *public* merge budget
only (the same information :class:`diloco_gym.agents.heuristics.BudgetPace` reads), so a deployed
scheduler can compute them as well:

=====  ================  ===================================================================
#      feature           meaning (decisions ``n`` per episode, decision ``d``, ``M`` merges)
=====  ================  ===================================================================
17     ``budget_rate``   ``M * H_min / n``: the budget relative to the most merges the
                         corridor allows in the episode, in (0, 1]
18     ``pace_left``     ``m_left * H_min / (n - d)``, clipped to [0, 1]: merges left relative
                         to the most that fit in the decisions left
19     ``urgency``       ``gap / G / 2``, clipped to [0, 1], with ``G = (n - last) /
                         (m_left + 1)`` the even-pace interval to the next merge (0.5 = on
                         pace; 0 when no merge is left)
=====  ================  ===================================================================

:class:`BudgetFeatures` is the Gymnasium wrapper used in training; the loaded agent
(:class:`diloco_gym.agents.learned.LearnedAgent`) applies :func:`budget_features` itself, from its
:class:`~diloco_gym.agents.base.AgentContext`, so training and deployment compute the same numbers.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from diloco_gym.envs.core import OBS_INDEX, EnvParams

__all__ = [
    "BUDGET_FEATURES",
    "OBS_TRANSFORMS",
    "budget_features",
    "augment_observation",
    "BudgetFeatures",
    "augmented_size",
]

#: Names of the features :func:`budget_features` appends, in order.
BUDGET_FEATURES = ("budget_rate", "pace_left", "urgency")
#: Observation transforms a training run can record in its metadata (``None``: the env's
#: 17 features as they are; ``"budget"``: plus :data:`BUDGET_FEATURES`).
OBS_TRANSFORMS = (None, "budget")


def budget_features(obs: np.ndarray, params: EnvParams) -> np.ndarray:
    """The budget features of an observation or a batch, ``(..., 3)`` float32.

    Args:
        obs: observations ``(17,)`` or ``(n, 17)`` of an env with ``merge_budget`` set.
        params: the env's public parameters (``merge_budget`` must be >= 1).

    Raises:
        ValueError: ``params`` has no merge budget.
    """
    from diloco_gym.agents.heuristics import BudgetPace  # the one decoder of the budget state

    pace = BudgetPace(params)
    s = pace.read(np.asarray(obs))
    h_min = float(params.h_min)
    n = np.maximum(s["n"], 1.0)
    left = np.maximum(n - s["d"], 1.0)
    rate = np.clip(pace.budget * h_min / n, 0.0, 1.0)
    pace_left = np.clip(s["m_left"] * h_min / left, 0.0, 1.0)
    due = np.maximum((n - s["last"]) / (s["m_left"] + 1.0), 1.0)
    urgency = np.where(s["m_left"] > 0, np.clip(s["gap"] / due / 2.0, 0.0, 1.0), 0.0)
    return np.stack([rate, pace_left, urgency], axis=-1).astype(np.float32)


def augmented_size(transform: str | None, base: int | None = None) -> int:
    """Observation length after ``transform`` of an observation of ``base`` features
    (default: the single env's 17; a fleet env's observation is wider)."""
    if transform not in OBS_TRANSFORMS:
        raise ValueError(
            f"unknown observation transform {transform!r}; valid: "
            f"{', '.join(str(t) for t in OBS_TRANSFORMS)}"
        )
    n = len(OBS_INDEX) if base is None else int(base)
    return n + (len(BUDGET_FEATURES) if transform == "budget" else 0)


def augment_observation(obs: np.ndarray, params: EnvParams, transform: str | None) -> np.ndarray:
    """``obs`` with the features of ``transform`` appended (``None``: unchanged)."""
    augmented_size(transform)  # raises the one-line error for an unknown transform
    obs = np.asarray(obs, dtype=np.float32)
    if transform is None:
        return obs
    return np.concatenate([obs, budget_features(obs, params)], axis=-1)


class BudgetFeatures(gym.ObservationWrapper):
    """Append :data:`BUDGET_FEATURES` to a :class:`~diloco_gym.envs.env.DiLoCoSyncEnv`'s
    observation (which must have ``merge_budget`` set).

    Only the env's public parameters are read (``env.unwrapped.params``), never its trace.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        params = env.unwrapped.params  # type: ignore[attr-defined]
        if params.merge_budget is None or params.merge_budget < 1:
            raise ValueError(
                "BudgetFeatures needs an env with a merge budget (merge_budget=M >= 1)"
            )
        self._params: EnvParams = params
        self.transform = "budget"
        base = env.observation_space
        assert isinstance(base, gym.spaces.Box)
        k = augmented_size(self.transform) - len(OBS_INDEX)
        self.observation_space = gym.spaces.Box(
            low=np.concatenate([base.low, np.zeros(k, dtype=np.float32)]),
            high=np.concatenate([base.high, np.ones(k, dtype=np.float32)]),
            dtype=np.float32,
        )

    def observation(self, observation: Any) -> np.ndarray:
        return augment_observation(observation, self._params, self.transform)

    def action_masks(self) -> np.ndarray:
        """The wrapped env's action mask (for sb3-contrib's MaskablePPO)."""
        return self.env.get_wrapper_attr("action_masks")()
