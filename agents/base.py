"""The one agent interface, shared by heuristic and learned schedulers.

Every agent has Stable-Baselines3's ``predict(observation, state=None, episode_start=None,
deterministic=True) -> (action, state)``, so ``stable_baselines3.common.evaluation.
evaluate_policy`` runs heuristic and learned agents alike. ``predict`` accepts one
observation ``(17,)`` or a batch ``(n, 17)`` and returns an action of matching shape.

An agent that needs more than the observation vector gets it through one explicit,
documented channel: :meth:`Agent.attach`, which the runner
(:func:`diloco_gym.rollout.run_episode`) calls right after every ``env.reset``. Only
non-deployable baselines (the offline oracle) use it to look ahead, through the env's
public ``oracle_costs()``; deployable agents must work from observations alone.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from diloco_gym.core import OBS_INDEX

__all__ = ["Agent", "obs_feature"]


def obs_feature(obs: np.ndarray, name: str) -> np.ndarray:
    """Column ``name`` of an observation or a batch of observations."""
    return np.asarray(obs)[..., OBS_INDEX[name]]


class Agent:
    """Base class: subclasses implement :meth:`act` on a batch of observations."""

    #: registry name (set by subclasses / the registry).
    name: str = "agent"
    #: whether the agent only uses information a deployed controller has.
    deployable: bool = True

    def attach(self, env: Any, episode_seed: int | None = None) -> None:
        """Called by the runner after each reset with the (unwrapped) env. Default: no-op."""

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Actions (0 defer, 1 merge) for a batch of observations ``(n, 17)``."""
        raise NotImplementedError

    def predict(self, observation: np.ndarray, state: Any = None, episode_start: Any = None,
                deterministic: bool = True) -> tuple[np.ndarray, Any]:
        """SB3-compatible prediction; the corridor itself is enforced by the env."""
        obs = np.asarray(observation, dtype=np.float32)
        if obs.shape[-1:] != (len(OBS_INDEX),):
            raise ValueError(f"{self.name}: expected observations with {len(OBS_INDEX)} "
                             f"features, got shape {obs.shape}")
        single = obs.ndim == 1
        actions = np.asarray(self.act(obs[None] if single else obs), dtype=np.int64)
        return (actions[0] if single else actions), state

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
