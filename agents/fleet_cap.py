"""A fleet agent that plans the per-site serving cap (``site_cap_pp``,
:mod:`diloco_gym.envs.fleet_cap`) as a budget of damage: ``cap-aware-forecast``.

The online forecaster on a fleet (``online-forecast`` through its
:class:`~diloco_gym.agents.fleet.FleetView`, ``sum`` aggregation) launches whenever the
fleet looks quiet. Under a cap it spends the cap on early launches, and the cap's rule
then masks every launch, so the corridor forces the rest of the episode's syncs at
``H_max``, wherever they fall. :class:`CapAwareForecast` keeps the same quiet test and adds
two rules, both read from the observation, the action mask and public parameters only:

* **late in the corridor**: it launches only once the gap is at least ``H_max - window``
  decisions, so its syncs replace forced ones instead of adding to them; inside that
  window it launches at the first quiet decision, else the corridor forces the sync;
* **the budget pays for the syncs ahead**: site ``i``'s budget left is ``1 - cap_used_i``
  (the ``<site>.cap_used`` feature: its settled excess over its cap); its cost per sync,
  ``c_i``, is the largest rise of ``cap_used_i`` between two decisions this episode (one
  settled sync, in cap units; 0 before one settled). A launch at decision ``d`` needs, at
  every site, ``1 - cap_used_i >= safety x (pending + 1 + reserve(d)) x c_i``, with
  ``reserve(d) = (n - 1 - d) // H_max`` the syncs the corridor forces after it and
  ``pending`` the syncs launched whose cost has not shown in ``cap_used`` yet. With
  ``safety = 1`` this is the env's own rule read from the observation; above 1 it keeps
  a margin, so the mask stays open for the late, quiet launches.

The episode's length ``n`` and the decision ``d`` come from ``gap`` and ``time_left``
(before the first sync the gap is the decision index and ``time_left = (n - d) / n``);
the syncs so far from ``merges`` (``k x H_min / n``). The agent keeps this episode's state
(reset by :meth:`~CapAwareForecast.attach`, which the runner calls after every reset), so
it follows one env at a time.

On a fleet without ``site_cap_pp`` (no ``cap_used`` features) it refuses in ``attach``
with one line: it exists to plan the cap; run ``online-forecast`` there.
"""

from __future__ import annotations

import numpy as np

from diloco_gym.agents.base import AgentContext
from diloco_gym.agents.fleet import FleetOptionForecast, feature_columns
from diloco_gym.envs.fleet_cap import CAP_FEATURE
from diloco_gym.envs.observation import OBS_INDEX

__all__ = ["CapAwareForecast", "cap_columns"]

_GAP, _TIME_LEFT, _MERGES = OBS_INDEX["gap"], OBS_INDEX["time_left"], OBS_INDEX["merges"]


def cap_columns(features: tuple[str, ...] | None) -> np.ndarray:
    """The columns of the ``<site>.cap_used`` features in a fleet observation table
    (empty without a cap)."""
    return feature_columns(features, CAP_FEATURE)


class CapAwareForecast(FleetOptionForecast):
    """The online forecaster on a capped fleet, launching late in the corridor and only
    where the cap's budget left pays for the syncs ahead (module docstring).

    Args:
        window: launches are considered once the gap is at least ``H_max - window``
            decisions.
        safety: the budget must cover ``safety`` times the forecast damage ahead.
        min_progress: the quiet test's least learner progress before a launch,
        quiet_ratio: its forecast rate's largest ratio to the baseline,
        max_trend: its rate trend's largest value
            (:class:`~diloco_gym.agents.fleet.FleetOptionForecast`).
    """

    name = "cap-aware-forecast"
    feature = CAP_FEATURE
    option = "site_cap_pp"
    needs = "a per-site serving cap"

    def __init__(
        self,
        window: int = 20,
        safety: float = 1.0,
        min_progress: float = 0.3,
        quiet_ratio: float = 0.9,
        max_trend: float = 0.05,
    ) -> None:
        super().__init__(min_progress, quiet_ratio, max_trend)
        self.window = int(window)
        self.safety = float(safety)
        self.reset_episode()

    def reset_episode(self) -> None:
        """Forget the episode: its length, the last ``cap_used`` and the costs seen."""
        self._n: int | None = None
        self._prev: np.ndarray | None = None
        self._cost = np.zeros(len(self._cols))
        self._settled = 0

    def attach(self, context: AgentContext) -> None:
        super().attach(context)
        self.reset_episode()

    @property
    def episode_decisions(self) -> int | None:
        """The episode's decisions ``n`` as read from the observations (``None`` until a
        decision after the first)."""
        return self._n

    def _observe(self, obs: np.ndarray) -> tuple[int, int, int, np.ndarray] | None:
        """``(d, gap, syncs so far, cap_used)`` of one observation, updating the costs seen
        from the rise of ``cap_used`` since the last call; ``None`` while the episode's
        length cannot be read yet (decision 0, where no launch is feasible)."""
        assert self._ctx is not None
        p = self._ctx.params
        gap = int(round(float(obs[_GAP]) * p.h_max))
        tl = float(obs[_TIME_LEFT])
        if self._n is None:
            if tl >= 1.0:
                return None
            # the first decision after 0: no sync can have happened (gap < H_min before),
            # so the gap is d and time_left = (n - d) / n
            self._n = int(round(gap / (1.0 - tl)))
        n = self._n
        d = n - int(round(tl * n))
        syncs = int(round(float(obs[_MERGES]) * n / p.h_min))
        used = obs[self._cols].astype(np.float64)
        if self._prev is not None:
            rise = used - self._prev
            if np.any(rise > 1e-9):
                self._settled += 1
                self._cost = np.maximum(self._cost, rise)
        self._prev = used
        return d, gap, syncs, used

    def budget_allows(self, d: int, syncs: int, used: np.ndarray) -> bool:
        """Whether every site's budget left covers ``safety`` times the damage of a launch
        at ``d`` and of the syncs pending and reserved after it."""
        assert self._ctx is not None and self._n is not None
        h_max = self._ctx.params.h_max
        reserve = max(0, (self._n - 1 - d) // h_max)
        pending = max(0, syncs - self._settled)
        need = self.safety * (pending + 1 + reserve) * self._cost
        return bool(np.all(1.0 - used >= need))

    def act(self, obs: np.ndarray) -> np.ndarray:
        if self._ctx is None:
            raise RuntimeError(f"{self.name}: attach it to a capped fleet env first")
        obs = np.asarray(obs, dtype=np.float32)
        if obs.ndim != 2 or len(obs) != 1:
            raise ValueError(
                f"{self.name} follows one env at a time; got observations of shape {obs.shape}"
            )
        seen = self._observe(obs[0])
        if seen is None or not self._ctx.action_mask()[1]:
            return np.zeros(1, dtype=np.int64)
        d, gap, syncs, used = seen
        late = gap >= self._ctx.params.h_max - self.window
        launch = late and bool(self.base.act(obs)[0]) and self.budget_allows(d, syncs, used)
        return np.full(1, int(launch), dtype=np.int64)
