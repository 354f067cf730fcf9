"""The budget state an observation carries, and the budget features learned schedulers see.

One home, below both the agents and the RL layer: the budget-aware heuristics
(:mod:`diloco_gym.agents.heuristics`) decode the budget state with :class:`BudgetPace`; a
budget-conditioned policy sees :func:`budget_features` appended to the env's observation,
in training (:class:`diloco_gym.rl.wrappers.BudgetFeatures`) and when deployed
(:class:`diloco_gym.agents.learned.LearnedAgent`), so both compute the same numbers.

Everything here reads the observation and the env's *public* merge budget only, so a
deployed scheduler can compute it as well. The env's observation already carries
``budget_left`` (merges left / ``merge_budget``), which says nothing about how large the
budget is or how the merges left compare with the time left; :func:`budget_features` adds:

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
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from diloco_gym.envs.observation import OBS_INDEX, obs_column
from diloco_gym.envs.params import EnvParams

__all__ = [
    "BUDGET_FEATURES",
    "OBS_TRANSFORMS",
    "BudgetPace",
    "budget_features",
    "augmented_size",
    "augment_observation",
]

#: Names of the features :func:`budget_features` appends, in order.
BUDGET_FEATURES = ("budget_rate", "pace_left", "urgency")
#: Observation transforms a training run can record in its metadata (``None``: the env's
#: 17 features as they are; ``"budget"``: plus :data:`BUDGET_FEATURES`).
OBS_TRANSFORMS = (None, "budget")


#: the observation's features the budget state is read from (:meth:`BudgetPace._read_one`)
_BUDGET_COLUMNS = ("budget_left", "gap", "time_left", "merges")


class BudgetPace:
    """What a budget-aware agent reads from an observation: where it stands on its budget.

    Everything comes from the observation and the public ``params.merge_budget`` (the env's
    exact merge budget ``M``), so it is deployable and stateless (batches of observations
    from different episodes are fine):

    * merges left ``m_left = rint(budget_left * M)`` and merges so far ``k = M - m_left``;
    * the episode's decisions ``n``: from the ``merges`` feature (``k * H_min / n``) once a
      merge happened, else from the gap and ``time_left`` (before the first merge the gap
      is the decision index ``d`` and ``time_left = (n - d) / n``, so ``n = d / (1 -
      time_left)``). A deployed scheduler knows its window; the observation carries it;
    * the decision ``d = n - rint(time_left * n)``, the gap ``g`` in decisions and the last
      merge ``d - g``.

    Args:
        params: the env's public parameters; ``merge_budget`` must be set.
    """

    def __init__(self, params: EnvParams) -> None:
        if params.merge_budget is None or params.merge_budget < 1:
            raise ValueError(
                "a budget-aware agent needs the env's merge budget: run it with "
                "merge_budget=M >= 1 (DiLoCoSyncEnv(..., merge_budget=M); "
                "`diloco-gym frontier` does this at every budget)"
            )
        self.params = params
        self.budget = int(params.merge_budget)

    def read(self, obs: np.ndarray) -> dict[str, np.ndarray]:
        """``{"m_left", "merges", "n", "d", "gap", "last"}`` per observation row (decisions);
        of one 1-D observation, floats (the same float64 operations, on Python floats)."""
        if np.ndim(obs) == 1:
            one = self._read_one(obs)
            if one is not None:
                return one
        h_min, h_max = self.params.h_min, self.params.h_max  # in decisions
        m_left = np.rint(obs_column(obs, "budget_left").astype(np.float64) * self.budget)
        k = self.budget - m_left
        gap = np.rint(obs_column(obs, "gap").astype(np.float64) * h_max)
        tl = obs_column(obs, "time_left").astype(np.float64)
        mf = obs_column(obs, "merges").astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            n_from_merges = k * h_min / mf
            n_from_gap = gap / (1.0 - tl)
        n = np.where((k > 0) & (mf > 0) & (mf < 1), n_from_merges, n_from_gap)
        n = np.rint(np.where(np.isfinite(n) & (n >= 1), n, gap + 1))
        d = n - np.rint(tl * n)
        return {"m_left": m_left, "merges": k, "n": n, "d": d, "gap": gap, "last": d - gap}

    def _read_one(self, obs: np.ndarray) -> dict[str, Any] | None:
        """:meth:`read` of one observation on Python floats (IEEE float64, as NumPy's
        float64 arrays; ``round`` rounds half to even, as ``np.rint``), or ``None`` when a
        feature is not finite (the array form then reads it, with NumPy's NaN and inf)."""
        b = self.budget
        h_min, h_max = self.params.h_min, self.params.h_max
        bl, g, tl, mf = (float(obs[OBS_INDEX[k]]) for k in _BUDGET_COLUMNS)
        if not all(math.isfinite(v) for v in (bl, g, tl, mf)):
            return None
        m_left = float(round(bl * b))
        k = b - m_left
        gap = float(round(g * h_max))
        if k > 0 and 0 < mf < 1:
            n = k * h_min / mf
        elif tl != 1.0:
            n = gap / (1.0 - tl)
        else:
            n = math.nan  # gap / 0: inf or NaN, never a length
        n = float(round(n if math.isfinite(n) and n >= 1 else gap + 1))
        d = n - float(round(tl * n))
        return {"m_left": m_left, "merges": k, "n": n, "d": d, "gap": gap, "last": d - gap}


def budget_features(obs: np.ndarray, params: EnvParams) -> np.ndarray:
    """The budget features of an observation or a batch, ``(..., 3)`` float32.

    Args:
        obs: observations ``(17,)`` or ``(n, 17)`` of an env with ``merge_budget`` set.
        params: the env's public parameters (``merge_budget`` must be >= 1).

    Raises:
        ValueError: ``params`` has no merge budget.
    """
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
    (default: the single env's 17; a fleet env's observation is wider).

    Raises:
        ValueError: an unknown transform.
    """
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
