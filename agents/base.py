"""The one agent interface, shared by heuristic and learned schedulers.

Every agent has Stable-Baselines3's ``predict(observation, state=None, episode_start=None,
deterministic=True) -> (action, state)``, so ``stable_baselines3.common.evaluation.
evaluate_policy`` runs heuristic and learned agents alike (agents that need the runner's
per-episode hand-over, such as the offline oracle, through
:class:`diloco_gym.eval.rollout.AttachAgentWrapper`). ``predict`` accepts one observation
``(17,)`` or a batch ``(n, 17)`` and returns an action of matching shape.

What an agent may know is enforced by the runner (:func:`diloco_gym.eval.rollout.attach_agent`,
called by :func:`diloco_gym.eval.rollout.run_episode` after every ``env.reset``), not left to
the agent's goodwill:

* Every agent gets :meth:`Agent.attach` with an :class:`AgentContext`: the env's public
  parameters (:class:`~diloco_gym.envs.params.EnvParams`, a frozen dataclass), the regime's name
  and the current action mask, copied in by the runner before every decision. It holds no
  reference to the env, the trace, the merge costs or the episode seed. Together with the
  observations (computed from the past only) this is what a deployed scheduler knows.
* Only an agent that declares ``deployable = False`` also gets
  :meth:`Agent.attach_episode` with the unwrapped env and the episode seed (the offline
  oracle reads the env's ``oracle_costs()`` there). Reports mark such agents
  "non-deployable". A deployable agent that defines ``attach_episode`` is refused.

Limits: the runner controls what it hands over; it does not sandbox Python. Code that
walks the interpreter's stack frames or the garbage collector can reach anything in the
process, and a deployable agent that carries its own copy of the simulator could try to
recognise a synthetic episode's seed from the observations. Judge agents whose code you
do not trust on traces they cannot regenerate (real traces, unpublished seeds).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from diloco_gym.envs.observation import OBS_INDEX, obs_column
from diloco_gym.envs.params import EnvParams

__all__ = ["Agent", "AgentContext", "obs_feature", "one_or_batch", "as_actions"]


#: Column ``name`` of a batch of observations (an array), or of one observation (a NumPy
#: scalar: :func:`diloco_gym.envs.observation.obs_column`).
obs_feature = obs_column


def one_or_batch(obs: np.ndarray) -> np.ndarray:
    """A batch of one observation as that observation (1-D), else the batch: a rule written
    with :func:`obs_feature` and ufuncs then computes one decision on NumPy scalars, bit
    for bit as on the batch (:func:`as_actions` turns its result back into a batch)."""
    return obs[0] if obs.ndim == 2 and obs.shape[0] == 1 else obs


def as_actions(decision: Any) -> np.ndarray:
    """A rule's decision (a boolean array, or one NumPy boolean) as int64 actions, a batch."""
    return np.asarray(decision).astype(np.int64).reshape(-1)


@dataclass(frozen=True)
class AgentContext:
    """The read-only view of an episode that every agent gets: what a deployed scheduler has.

    Attributes:
        params: the env's public parameters (corridor, decision interval, merge budget,
            feature scales, reward weights).
        regime: the regime's name (a label; the trace itself is not here); a replayed
            trace's is ``replay:<trace name>``.
        features: the names of the observation's features when they differ from the
            single env's (``DiLoCoFleet-v0``: per-site pressure blocks); ``None`` otherwise.
    """

    params: EnvParams
    regime: str
    features: tuple[str, ...] | None = None
    _mask: np.ndarray = field(
        default_factory=lambda: np.ones(2, dtype=bool), repr=False, compare=False
    )

    def action_mask(self) -> np.ndarray:
        """The feasible actions at the current decision, ``[defer, merge]`` (a copy)."""
        return self._mask.copy()

    def _set_mask(self, mask: np.ndarray) -> None:
        """Runner only: copy in the mask of the decision about to be asked (an env with a
        wider action, such as a rounds fleet's per-site ``MultiBinary``, sets its own
        length on the first call)."""
        m = np.asarray(mask, dtype=bool)
        if m.shape != self._mask.shape:
            object.__setattr__(self, "_mask", m.copy())
        else:
            self._mask[:] = m


class Agent:
    """Base class: subclasses implement :meth:`act` on a batch of observations."""

    #: the agent's name in tables and reports (set by subclasses / the registry).
    name: str = "agent"
    #: whether the agent uses only what a deployed scheduler has (observations, action
    #: masks, public parameters). The runner reads it: only ``False`` gets the episode.
    deployable: bool = True

    def attach(self, context: AgentContext) -> None:
        """Called by the runner after each reset, for every agent. Default: no-op."""

    def attach_episode(self, env: Any, episode_seed: int) -> None:
        """Called by the runner after :meth:`attach`, only when ``deployable`` is False,
        with the unwrapped env (which can look into the future) and the episode seed."""

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Actions (0 defer, 1 merge) for a batch of observations ``(n, 17)``."""
        raise NotImplementedError

    def predict(
        self,
        observation: np.ndarray,
        state: Any = None,
        episode_start: Any = None,
        deterministic: bool = True,
    ) -> tuple[np.ndarray, Any]:
        """SB3-compatible prediction; the corridor itself is enforced by the env."""
        obs = np.asarray(observation, dtype=np.float32)
        size = getattr(self, "obs_size", None) or len(OBS_INDEX)  # a fleet model's is wider
        if obs.shape[-1:] != (size,):
            raise ValueError(
                f"{self.name}: expected observations with {size} features, got shape {obs.shape}"
            )
        single = obs.ndim == 1
        actions = np.asarray(self.act(obs[None] if single else obs), dtype=np.int64)
        return (actions[0] if single else actions), state

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
