"""Observation wrappers for learned, budget-conditioned schedulers.

A policy trained across merge budgets must know its budget. The env's observation already
carries ``budget_left`` (merges left / ``merge_budget``), which says nothing about how large
the budget is or how the merges left compare with the time left. :func:`budget_features`
adds three features, computed from the observation and the env's *public* merge budget
only (the same information :class:`agents.heuristics.BudgetPace` reads), so a deployed
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
(:class:`agents.learned.LearnedAgent`) applies :func:`budget_features` itself, from its
:class:`~agents.base.AgentContext`, so training and deployment compute the same numbers.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from diloco_gym.core import OBS_INDEX, EnvParams

__all__ = [
    "BUDGET_FEATURES",
    "HISTORY_FEATURES",
    "RateHistory",
    "OBS_TRANSFORMS",
    "budget_features",
    "augment_observation",
    "BudgetFeatures",
    "augmented_size",
]

#: Names of the features :func:`budget_features` appends, in order.
BUDGET_FEATURES = ("budget_rate", "pace_left", "urgency")
#: Names of the memory features :class:`RateHistory` appends after them.
HISTORY_FEATURES = ("since_busy", "since_busy_start")
#: Observation transforms a training run can record in its metadata (``None``: the env's
#: 17 features as they are; ``"budget"``: plus :data:`BUDGET_FEATURES`;
#: ``"budget-history"``: plus :data:`BUDGET_FEATURES` and :data:`HISTORY_FEATURES`).
OBS_TRANSFORMS = (None, "budget", "budget-history")
#: A decision is *busy* when its request rate exceeds this multiple of the slow baseline.
BUSY_RATIO = 1.3
#: Clip of the history features, in decisions (about 4.8 min).
HISTORY_CLIP = 256


def budget_features(obs: np.ndarray, params: EnvParams) -> np.ndarray:
    """The budget features of an observation or a batch, ``(..., 3)`` float32.

    Args:
        obs: observations ``(17,)`` or ``(n, 17)`` of an env with ``merge_budget`` set.
        params: the env's public parameters (``merge_budget`` must be >= 1).

    Raises:
        ValueError: ``params`` has no merge budget.
    """
    from agents.heuristics import BudgetPace  # the one decoder of the budget state

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


def augmented_size(transform: str | None) -> int:
    """Observation length after ``transform``."""
    if transform not in OBS_TRANSFORMS:
        raise ValueError(
            f"unknown observation transform {transform!r}; valid: "
            f"{', '.join(str(t) for t in OBS_TRANSFORMS)}"
        )
    extra = {None: 0, "budget": len(BUDGET_FEATURES)}
    return len(OBS_INDEX) + extra.get(transform, len(BUDGET_FEATURES) + len(HISTORY_FEATURES))


class RateHistory:
    """Memory of the request rate over the decisions an agent was asked (a stateful,
    causal feature: it sees each observation once, in order).

    A decision is *busy* when ``rate_now > BUSY_RATIO * rate_baseline`` (both from the
    observation). The features are the decisions since the last busy decision
    (``since_busy``) and since the start of the last busy spell (``since_busy_start``),
    each divided by :data:`HISTORY_CLIP` and clipped to 1 (1 as well before any busy
    decision). In a periodic load the second is the phase of the burst cycle, which a
    single observation does not carry. Decisions the env did not ask (the corridor's
    forced stretches) are not seen; the decision index comes from :class:`BudgetPace`.
    """

    def __init__(self, params: EnvParams) -> None:
        from agents.heuristics import BudgetPace

        self.params = params
        self._pace = BudgetPace(params)
        self.reset()

    def reset(self) -> None:
        """Forget the episode (call at every reset)."""
        self._last_busy: float | None = None
        self._busy_start: float | None = None
        self._prev_busy = False

    def update(self, obs: np.ndarray) -> np.ndarray:
        """The history features after seeing ``obs`` (one observation ``(17,)``)."""
        from diloco_gym.core import unsquash_rate

        o = np.asarray(obs, dtype=np.float64)
        if o.ndim != 1:
            raise ValueError(
                "the rate-history features follow one episode: give one observation at a "
                f"time, got shape {o.shape}"
            )
        d = float(self._pace.read(o)["d"])
        norm = self.params.rate_norm_rps
        now = unsquash_rate(o[OBS_INDEX["rate_now"]], norm)
        base = unsquash_rate(o[OBS_INDEX["rate_baseline"]], norm)
        busy = bool(now > BUSY_RATIO * base)
        if busy:
            if not self._prev_busy:
                self._busy_start = d
            self._last_busy = d
        self._prev_busy = busy

        def since(x: float | None) -> float:
            return 1.0 if x is None else min(1.0, max(0.0, d - x) / HISTORY_CLIP)

        return np.array([since(self._last_busy), since(self._busy_start)], dtype=np.float32)


def augment_observation(
    obs: np.ndarray,
    params: EnvParams,
    transform: str | None,
    history: RateHistory | None = None,
) -> np.ndarray:
    """``obs`` with the features of ``transform`` appended (``None``: unchanged).

    Args:
        history: for ``"budget-history"``: the episode's :class:`RateHistory` (updated).
    """
    augmented_size(transform)  # raises the one-line error for an unknown transform
    obs = np.asarray(obs, dtype=np.float32)
    if transform is None:
        return obs
    parts = [obs, budget_features(obs, params)]
    if transform == "budget-history":
        if history is None:
            raise ValueError("the budget-history transform needs the episode's RateHistory")
        rows = obs.reshape(-1, obs.shape[-1])
        hist = np.stack([history.update(r) for r in rows]).reshape(*obs.shape[:-1], -1)
        parts.append(hist)
    return np.concatenate(parts, axis=-1)


class BudgetFeatures(gym.ObservationWrapper):
    """Append :data:`BUDGET_FEATURES` (and, with ``history=True``, the
    :class:`RateHistory` features) to a :class:`~diloco_gym.env.DiLoCoSyncEnv`'s
    observation (which must have ``merge_budget`` set).

    Only the env's public parameters are read (``env.unwrapped.params``), never its trace.
    """

    def __init__(self, env: gym.Env, history: bool = False) -> None:
        super().__init__(env)
        params = env.unwrapped.params  # type: ignore[attr-defined]
        if params.merge_budget is None or params.merge_budget < 1:
            raise ValueError(
                "BudgetFeatures needs an env with a merge budget (merge_budget=M >= 1)"
            )
        self._params: EnvParams = params
        self.transform = "budget-history" if history else "budget"
        self._history = RateHistory(params) if history else None
        base = env.observation_space
        assert isinstance(base, gym.spaces.Box)
        k = augmented_size(self.transform) - len(OBS_INDEX)
        self.observation_space = gym.spaces.Box(
            low=np.concatenate([base.low, np.zeros(k, dtype=np.float32)]),
            high=np.concatenate([base.high, np.ones(k, dtype=np.float32)]),
            dtype=np.float32,
        )

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if self._history is not None:
            self._history.reset()
        return super().reset(seed=seed, options=options)

    def observation(self, observation: Any) -> np.ndarray:
        return augment_observation(observation, self._params, self.transform, self._history)

    def action_masks(self) -> np.ndarray:
        """The wrapped env's action mask (for sb3-contrib's MaskablePPO)."""
        return self.env.get_wrapper_attr("action_masks")()
