"""The Gymnasium wrapper that gives a budget-conditioned policy its budget features in
training.

The features themselves (:data:`BUDGET_FEATURES`, :func:`budget_features`) live in
:mod:`diloco_gym.envs.budget_features`, below both this layer and the agents: the loaded
agent (:class:`diloco_gym.agents.learned.LearnedAgent`) applies them from its
:class:`~diloco_gym.agents.base.AgentContext`, so training and deployment compute the same
numbers. Their names stay importable from here.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from diloco_gym.envs.budget_features import (
    BUDGET_FEATURES,
    OBS_TRANSFORMS,
    augment_observation,
    augmented_size,
    budget_features,
)
from diloco_gym.envs.observation import OBS_INDEX
from diloco_gym.envs.params import EnvParams

__all__ = [
    "BUDGET_FEATURES",
    "OBS_TRANSFORMS",
    "budget_features",
    "augment_observation",
    "BudgetFeatures",
    "augmented_size",
]


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
