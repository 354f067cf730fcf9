"""The single-host agents on a fleet (``DiLoCoFleet-v0``), through a documented aggregation
of the sites' pressure blocks.

A fleet observation is the single env's 17 features (the first site's pressure block in
the ``network .. rate_trend`` slots), one pressure block per further site and, with
``F > 1`` fragments, the fragments' staleness (:func:`diloco_gym.envs.fleet.fleet_obs_features`).
:class:`FleetView` turns it into a single-host observation by replacing the pressure block
with an aggregate over the sites and hands that to the wrapped agent, unchanged. The
learner block, ``gap``, ``corridor_open``, ``merges``, ``time_left`` and ``budget_left``
pass through (they concern the fragment syncs, one schedule for the fleet), so the
budget-aware agents pace their fragment-sync budget as they pace merges. With ``F > 1``
the env's learner block covers the gap since the last *fragment* sync, about ``1/F`` of
the next fragment's own staleness; the view multiplies the learner features by ``F``
(clipped to 1), an approximation of that fragment's progress, tokens and staleness, so
thresholds tuned on full-model gaps keep their meaning.

Aggregations (``r`` below is a rate in requests/s, recovered from the squashed feature
with ``rate_norm_rps``; ``w_s`` is site ``s``'s slow baseline rate over the sum of them,
i.e. its share of the traffic, observed causally):

* ``max``: every feature is the maximum over sites (the pressure gate: a sync must find
  every site quiet, so it is gated by the busiest);
* ``weighted``: pressure features and ``rate_trend`` are the traffic-weighted means
  ``sum_s w_s x_s``, rates the traffic-weighted mean rate (WA-DiLoCo scores the fleet's
  average request);
* ``sum``: the rates are the fleet's total (``sum_s r_s``: a window started now overlaps
  the requests of every site, so the forecaster's expected overlap is the sum of the
  sites' forecast overlaps), ``rate_trend = clip(sum_s (f_s - b_s) / rate_norm_rps, -1,
  1)``, pressure features the maximum.

Which agent gets which (:data:`FLEET_AGGREGATION`): the pressure gate ``max``, the WA
variants ``weighted``, the online forecasters (free and budget-aware) ``sum``; agents that
read no pressure feature (fixed intervals, the fixed budget, random deferral, no-sync) get
``max`` (it does not matter to them). The offline oracle needs no view: it plans on the
env's summed costs (:class:`FleetOracleView` only lets it accept the wider observation).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from diloco_gym.agents.base import Agent, AgentContext
from diloco_gym.envs.observation import (
    EXO_SLICE,
    LEARNER_SLICE,
    OBS_DIM,
    OBS_INDEX,
    squash_rate,
    unsquash_rate,
)

__all__ = [
    "FleetView",
    "FleetOracleView",
    "aggregate_obs",
    "FLEET_AGGREGATION",
    "AGGREGATIONS",
    "fleet_agent",
    "feature_columns",
    "FleetOptionForecast",
]

AGGREGATIONS = ("max", "weighted", "sum")
#: The aggregation each registry agent gets on a fleet (see the module docstring).
FLEET_AGGREGATION: dict[str, str] = {
    "pressure-gate": "max",
    "wa-diloco": "weighted",
    "calibrated-wa": "weighted",
    "online-forecast": "sum",
    "online-forecast-budget": "sum",
}

_N_EXO = EXO_SLICE.stop - EXO_SLICE.start
_E = {name: OBS_INDEX[name] - EXO_SLICE.start for name in OBS_INDEX if EXO_SLICE.start
      <= OBS_INDEX[name] < EXO_SLICE.stop}  # fmt: skip
_PRESSURE = [_E["network"], _E["serving"], _E["checkpoint"]]
_RATES = [_E["rate_now"], _E["rate_forecast"], _E["rate_baseline"]]
_TREND = _E["rate_trend"]


def _site_blocks(obs: np.ndarray, n_sites: int) -> np.ndarray:
    """``(..., n_sites, 7)`` pressure blocks of fleet observations."""
    first = obs[..., EXO_SLICE]
    rest = obs[..., OBS_DIM : OBS_DIM + _N_EXO * (n_sites - 1)]
    rest = rest.reshape(obs.shape[:-1] + (n_sites - 1, _N_EXO))
    return np.concatenate([first[..., None, :], rest], axis=-2)


def aggregate_obs(
    obs: np.ndarray, n_sites: int, how: str, rate_norm_rps: float, fragments: int = 1
) -> np.ndarray:
    """Single-host observations ``(..., 17)`` from fleet observations (module docstring)."""
    if how not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {how!r}")
    obs = np.asarray(obs, dtype=np.float32)
    out = obs[..., :OBS_DIM].copy()
    if fragments > 1:
        out[..., LEARNER_SLICE] = np.minimum(1.0, out[..., LEARNER_SLICE] * fragments)
    if n_sites == 1:
        return out
    blocks = _site_blocks(obs, n_sites).astype(np.float64)
    agg = blocks.max(axis=-2)
    if how in ("weighted", "sum"):
        rates = unsquash_rate(blocks[..., _RATES], rate_norm_rps)  # (..., sites, 3)
        base = rates[..., 2]
        if how == "weighted":
            tot = base.sum(axis=-1, keepdims=True)
            w = np.where(tot > 0, base / np.where(tot > 0, tot, 1.0), 1.0 / n_sites)
            agg[..., _PRESSURE] = np.einsum("...s,...sk->...k", w, blocks[..., _PRESSURE])
            agg[..., _RATES] = squash_rate(np.einsum("...s,...sk->...k", w, rates), rate_norm_rps)
            agg[..., _TREND] = np.einsum("...s,...s->...", w, blocks[..., _TREND])
        else:
            total = rates.sum(axis=-2)
            agg[..., _RATES] = squash_rate(total, rate_norm_rps)
            agg[..., _TREND] = np.clip((total[..., 1] - total[..., 2]) / rate_norm_rps, -1.0, 1.0)
    out[..., EXO_SLICE] = agg.astype(np.float32)
    return out


class FleetView(Agent):
    """A single-host agent on fleet observations, through :func:`aggregate_obs`.

    Args:
        agent: the wrapped (deployable) agent.
        how: the aggregation (default: :data:`FLEET_AGGREGATION` of its name, else
            ``max``).
    """

    def __init__(self, agent: Agent, how: str | None = None) -> None:
        if not getattr(agent, "deployable", True):
            raise ValueError(f"{agent.name} is non-deployable: wrap it in FleetOracleView")
        self.agent = agent
        self.how = how or FLEET_AGGREGATION.get(agent.name, "max")
        if self.how not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {self.how!r}")
        self.name = agent.name
        self.budget_aware = bool(getattr(agent, "budget_aware", False))
        self._n_sites: int | None = None
        self._fragments = 0
        self._dim: int | None = None
        self._norm = 8.0

    def attach(self, context: AgentContext) -> None:
        names = context.features
        if names is None:
            raise ValueError(
                f"{self.name}: a fleet agent needs the fleet's observation table "
                f"(run it on DiLoCoFleet-v0 through diloco_gym.eval.rollout.run_episode)"
            )
        self._n_sites = sum(1 for n in names if n.endswith(".network"))
        self._fragments = sum(1 for n in names if n.startswith("fragment"))  # 0 when F = 1
        self._dim = len(names)
        self._norm = context.params.rate_norm_rps
        self.agent.attach(context)

    def act(self, obs: np.ndarray) -> np.ndarray:
        if self._n_sites is None:
            raise RuntimeError(f"{self.name}: attach it to a fleet env first (run_episode does)")
        return self.agent.act(
            aggregate_obs(obs, self._n_sites, self.how, self._norm, max(1, self._fragments))
        )

    def predict(
        self,
        observation: np.ndarray,
        state: Any = None,
        episode_start: Any = None,
        deterministic: bool = True,
    ) -> tuple[np.ndarray, Any]:
        obs = np.asarray(observation, dtype=np.float32)
        if self._dim is not None and obs.shape[-1:] != (self._dim,):
            raise ValueError(
                f"{self.name}: expected fleet observations with {self._dim} features, "
                f"got shape {obs.shape}"
            )
        single = obs.ndim == 1
        actions = np.asarray(self.act(obs[None] if single else obs), dtype=np.int64)
        return (actions[0] if single else actions), state


class FleetOracleView(FleetView):
    """The offline oracle (non-deployable) on a fleet: it plans on the env's summed costs
    (``oracle_costs()``) and ignores the observation."""

    deployable = False

    def __init__(self, agent: Agent) -> None:
        if getattr(agent, "deployable", True):
            raise ValueError(f"{agent.name} is deployable: use FleetView")
        self.agent = agent
        self.how = "max"
        self.name = agent.name
        self.budget_aware = False
        self._n_sites = None
        self._dim = None
        self._norm = 8.0

    def attach_episode(self, env: Any, episode_seed: int) -> None:
        self.agent.attach_episode(env, episode_seed)


def feature_columns(features: tuple[str, ...] | None, feature: str) -> np.ndarray:
    """The columns of the ``<site>.<feature>`` features in a fleet observation table (empty
    where the fleet has none)."""
    suffix = "." + feature
    return np.asarray([i for i, f in enumerate(features or ()) if f.endswith(suffix)], np.int64)


class FleetOptionForecast(Agent):
    """The base of the heuristics written for one fleet option: the online forecaster's
    quiet test on the fleet's summed rates (``online-forecast`` through its
    :class:`FleetView`, ``sum`` aggregation) and the columns of the option's per-site
    feature ``<site>.<feature>``. A subclass names the feature, the option (its ``[fleet]``
    key) and what it needs (:attr:`needs`), and adds its own rule; :meth:`attach` refuses,
    in one line, a fleet without the option (or a single host).

    Args:
        min_progress: the quiet test's least learner progress before a launch,
        quiet_ratio: the forecast rate's largest ratio to the baseline,
        max_trend: and the rate trend's largest value
            (:class:`~diloco_gym.agents.heuristics.OnlineForecastWA`).
        base: another single-host agent for the quiet test, in place of the forecaster
            (a budget-aware one makes the agent budget-aware).
    """

    #: the per-site observation feature the agent reads
    feature = ""
    #: the fleet option's ``[fleet]`` key
    option = ""
    #: what the agent needs of a fleet, in words
    needs = ""

    def __init__(
        self,
        min_progress: float = 0.3,
        quiet_ratio: float = 0.9,
        max_trend: float = 0.05,
        base: Agent | None = None,
    ) -> None:
        from diloco_gym.agents.heuristics import OnlineForecastWA

        inner = base or OnlineForecastWA(min_progress, quiet_ratio, max_trend)
        self.base = FleetView(inner, how="sum")
        self.budget_aware = self.base.budget_aware
        self._ctx: AgentContext | None = None
        self._cols = np.zeros(0, np.int64)
        self.obs_size: int | None = None

    def attach(self, context: AgentContext) -> None:
        cols = feature_columns(context.features, self.feature)
        if cols.size == 0:
            raise ValueError(
                f"{self.name} needs a fleet with {self.needs} ({self.option} in [fleet], whose "
                f"<site>.{self.feature} features it reads); this env has none: run "
                f"online-forecast there"
            )
        self._cols = cols
        self._ctx = context
        self.obs_size = len(context.features or ())  # Agent.predict checks the width
        self.base.attach(context)


def fleet_agent(agent: Agent) -> Agent:
    """``agent`` ready for a fleet env: a heuristic through its :class:`FleetView` (or
    :class:`FleetOracleView`); a learned agent (which reads the fleet observation it was
    trained on) as it is."""
    from diloco_gym.agents.heuristics import OfflineCalibratedOracle

    if isinstance(agent, OfflineCalibratedOracle):
        return FleetOracleView(agent)
    if type(agent).__module__ == "diloco_gym.agents.heuristics":
        return FleetView(agent)
    return agent
