"""A fleet agent that reads its links (``link_levels``, :mod:`diloco_gym.envs.fleet_links`):
``link-aware-forecast``.

With changing links a sync started while a link runs below its nominal rate takes longer
and uses more of the slower links' share, so it usually costs the sites' serving more than
the same sync on nominal links (docs/fleet.md, "Links that change over time"). The agent
keeps the online forecaster's quiet test on the fleet's summed rates (``online-forecast``
through its :class:`~diloco_gym.agents.fleet.FleetView`, ``sum`` aggregation) and adds one
rule read from the ``<site>.link_rate`` features: it launches only while every link runs
at no less than ``min_rate`` of its nominal rate, unless the gap is within ``window``
decisions of ``H_max``; then the quiet test alone decides, and otherwise the corridor
forces the sync. Everything it reads is in the observation and the action mask.

``link-aware-forecast-budget`` is the same rule on ``online-forecast-budget`` (the budget's
pace decides when a quiet moment is good enough, and the env's budget mask keeps exactly
the budget's syncs), so that the frontier compares it with that agent at equal syncs.

On a fleet with fixed links (no ``link_rate`` features) both refuse in ``attach`` with one
line: run ``online-forecast`` there.
"""

from __future__ import annotations

import numpy as np

from diloco_gym.agents.base import Agent
from diloco_gym.agents.fleet import FleetOptionForecast, feature_columns
from diloco_gym.envs.fleet_links import LINK_FEATURE
from diloco_gym.envs.observation import OBS_INDEX

__all__ = ["LinkAwareForecast", "LinkAwareForecastBudget", "link_columns"]

_GAP = OBS_INDEX["gap"]


def link_columns(features: tuple[str, ...] | None) -> np.ndarray:
    """The columns of the ``<site>.link_rate`` features in a fleet observation table
    (empty with fixed links)."""
    return feature_columns(features, LINK_FEATURE)


class LinkAwareForecast(FleetOptionForecast):
    """The online forecaster on a fleet with changing links, launching only on links at
    ``min_rate`` or more of their nominal rate until the corridor's end nears (module
    docstring).

    Args:
        min_rate: the least share of its nominal rate every link must run at for a launch.
        window: within this many decisions of ``H_max`` the link rule no longer applies.
        min_progress: the quiet test's least learner progress before a launch,
        quiet_ratio: its forecast rate's largest ratio to the baseline,
        max_trend: its rate trend's largest value
            (:class:`~diloco_gym.agents.fleet.FleetOptionForecast`).
        base: another single-host agent for the quiet test (as the base class's).
    """

    name = "link-aware-forecast"
    feature = LINK_FEATURE
    option = "link_levels"
    needs = "changing links"

    def __init__(
        self,
        min_rate: float = 1.0,
        window: int = 4,
        min_progress: float = 0.3,
        quiet_ratio: float = 0.9,
        max_trend: float = 0.05,
        base: Agent | None = None,
    ) -> None:
        super().__init__(min_progress, quiet_ratio, max_trend, base)
        self.min_rate = float(min_rate)
        self.window = int(window)

    def links_allow(self, obs: np.ndarray) -> bool:
        """Whether every link runs at ``min_rate`` or more of its nominal rate (one
        observation row)."""
        return bool(np.all(obs[self._cols] >= self.min_rate - 1e-6))

    def act(self, obs: np.ndarray) -> np.ndarray:
        if self._ctx is None:
            raise RuntimeError(f"{self.name}: attach it to a fleet env with changing links first")
        obs = np.asarray(obs, dtype=np.float32)
        if obs.ndim != 2:
            raise ValueError(f"{self.name}: observations must be (B, features), got {obs.shape}")
        quiet = np.asarray(self.base.act(obs), dtype=np.int64).reshape(-1)
        h_max = self._ctx.params.h_max
        out = np.zeros(len(obs), dtype=np.int64)
        for b, row in enumerate(obs):
            gap = int(round(float(row[_GAP]) * h_max))
            late = gap >= h_max - self.window
            out[b] = int(quiet[b] and (late or self.links_allow(row)))
        return out


class LinkAwareForecastBudget(LinkAwareForecast):
    """:class:`LinkAwareForecast`'s link rule on the budget-aware online forecaster
    (:class:`~diloco_gym.agents.heuristics.OnlineForecastBudget`, through the fleet's
    ``sum`` view): budget-aware, run at every budget of the frontier.

    Args:
        min_rate: the least share of its nominal rate every link must run at for a launch.
        window: within this many decisions of ``H_max`` the link rule no longer applies.
    """

    name = "link-aware-forecast-budget"
    budget_aware = True

    def __init__(self, min_rate: float = 1.0, window: int = 4) -> None:
        from diloco_gym.agents.heuristics import OnlineForecastBudget

        super().__init__(min_rate, window, base=OnlineForecastBudget())
