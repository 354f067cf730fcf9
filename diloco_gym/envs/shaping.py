"""Potential-based reward shaping: the *merge debt* that makes the default task learnable.

Why. Without shaping, the only payoff of a voluntary merge is that it moves a later forced
merge (at ``H_max``, or at the budget's last feasible moment) out of a burst: a payoff that
comes up to ``H_max`` decisions later, through another merge's cost, while the voluntary
merge's own cost is paid at once. Standard policy-gradient methods then settle on never
merging (docs/training.md has the measurements).

What. With ``EnvParams.reward_shaping = "merge-debt"`` the reward gets the shaping term of
Ng, Harada and Russell (1999), ``F = gamma * phi(s') - phi(s)``, with the potential

    phi(s) = -k * gap / G

* ``gap``: decisions since the last merge;
* ``G``: the interval the schedule has to keep from here: ``H_max`` without a budget, and
  with a budget of ``M`` merges the even-pace interval ``(n - last) / (m_left + 1)``
  (``n`` decisions per episode, ``last`` the last merge's decision, ``m_left`` the merges
  left; ``phi = 0`` once no merge is left);
* ``k``: the *reference merge cost*, the mean isolated cost of a merge over every decision
  of :data:`HISTORY_SEEDS` episodes of the regime (training-range seeds: history, never the
  episode being played), in reward units; ``EnvParams.shaping_cost`` sets it instead.

So deferring accrues debt at ``k / G`` per decision and a merge pays it off: a merge at a
cheap moment late in its interval earns more than it costs, one in a burst does not. The
shaping is a function of the state the agent observes (the gap, the budget), so it is
causal; being potential-based, it leaves the optimal policies of the discounted task
unchanged when ``shaping_gamma`` is the agent's discount (0.99, Stable-Baselines3's
default). It is reported apart in ``info["reward_terms"]["shaping"]``; the ``sync_excess``
terms are unchanged, so they still sum to minus the scored sync-excess, and with
``shaping_gamma = 1`` the shaping terms of an episode sum to ``phi(s_T) - phi(s_0)``
(tested).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from diloco_gym.envs.reward import REWARD_SHAPINGS, check_reward_shaping

__all__ = [
    "REWARD_SHAPINGS",
    "HISTORY_SEEDS",
    "check_reward_shaping",
    "reference_merge_cost",
    "shaping_scale",
    "merge_debt",
    "merge_debt_one",
    "require_unshaped",
]

#: The episodes the reference merge cost is measured on: the first 16 training-range seeds
#: (training episodes reset with seeds from 10**6 on; test seeds stay below 900000).
HISTORY_SEEDS = tuple(range(10**6, 10**6 + 16))


def shaping_scale(
    generator, params: Any, sidecar: Any, learner_params: Any, rate_rps: float
) -> float | None:
    """The merge debt's scale ``k`` (:func:`reference_merge_cost`) when ``params`` shape the
    reward (``reward_shaping = "merge-debt"``), else ``None``: what the single and the
    vector env keep as ``shaping_cost``."""
    if params.reward_shaping != "merge-debt":
        return None
    return reference_merge_cost(generator, params, sidecar, learner_params, rate_rps)


def reference_merge_cost(
    generator, params: Any, sidecar: Any, learner_params: Any, rate_rps: float
) -> float:
    """The shaping's ``k``: ``params.shaping_cost`` when set, else the mean isolated merge
    cost over every decision of the :data:`HISTORY_SEEDS` episodes of ``generator``, in
    reward units of ``excess_weight = 1`` (extra violating requests per 1,000 nominal
    requests). About 10 ms an episode. For a replayed trace the history episodes are random
    windows of the loaded file (like the reward scale's nominal rate, a constant of the env
    computed before any episode, but from the whole file: set ``shaping_cost`` for a
    declared one)."""
    if params.shaping_cost is not None:
        return float(params.shaping_cost)
    from diloco_gym.envs.episode import episode_from_seed

    total = 0.0
    count = 0
    for seed in HISTORY_SEEDS:
        ep = episode_from_seed(generator, seed, params, sidecar, learner_params, rate_rps)
        cost = ep.merge_cost
        total += float(np.sum(cost)) * ep.reward_per_request
        count += cost.size
    return total / max(count, 1)


def merge_debt(k: float, d: Any, last: Any, merges: Any, n: Any, params: Any) -> np.ndarray:
    """The potential ``phi = -k * gap / G`` (module docstring) of rows at decision ``d``
    (clipped to the episode's ``n`` decisions), last merge ``last`` and ``merges`` merges
    so far, with ``params.merge_budget`` (``None``: ``G = H_max``)."""
    d = np.minimum(np.asarray(d, dtype=np.float64), n)
    gap = d - last
    if params.merge_budget is None:
        return -k * gap / params.h_max
    left = params.merge_budget - np.asarray(merges, dtype=np.float64)
    interval = (n - np.asarray(last, dtype=np.float64)) / (np.maximum(left, 0.0) + 1.0)
    return np.where(left > 0, -k * gap / np.maximum(interval, 1.0), 0.0)


def merge_debt_one(k: float, d: int, last: int, merges: int, n: int, params: Any) -> float:
    """:func:`merge_debt` of one env, in plain Python (the single env's step pays no NumPy
    call for it)."""
    gap = min(d, n) - last
    if params.merge_budget is None:
        return -k * gap / params.h_max
    left = params.merge_budget - merges
    if left <= 0:
        return 0.0
    return -k * gap / max((n - last) / (left + 1.0), 1.0)


def require_unshaped(params: Any, owner: str) -> None:
    """Refuse a shaped reward in an env that does not shape (``owner``, the fleet env),
    rather than silently training without it."""
    if params.reward_shaping != "none":
        raise ValueError(
            f"{owner} does not shape its reward, got reward_shaping={params.reward_shaping!r}; "
            f"the merge-debt shaping is DiLoCoSyncEnv's and DiLoCoSyncVectorEnv's "
            f"(gym.make('DiLoCoSync-v2'))"
        )
