"""The paper's scheduling policies as agents (rules and sources in ``docs/model.md``).

Decision rules with their defaults; ``clip(x, c) = min(1, max(0, x / c))``. The corridor
(wait below H_min, forced at H_max) is enforced by the environment for every agent, so
each rule below only decides inside the corridor. Sources: "the paper" is "Not every sync
is safe: calibrated DiLoCo scheduling for shared AI infrastructure"; "the reference" is its
public implementation (GitHub ``maincodeMax/workload-aware-diloco``).

Every agent here is deployable (it reads observations and the public parameters of its
:class:`~diloco_gym.agents.base.AgentContext`) except :class:`OfflineCalibratedOracle`, which
declares
``deployable = False`` and receives the episode through ``attach_episode``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from diloco_gym.agents.base import Agent, AgentContext, as_actions, obs_feature, one_or_batch
from diloco_gym.envs.budget_features import BudgetPace
from diloco_gym.envs.observation import unsquash_rate
from diloco_gym.envs.params import EnvParams
from diloco_gym.sim.schedules import optimal_schedule

__all__ = [
    "NoSync",
    "FixedInterval",
    "PressureGate",
    "RandomDeferral",
    "WADiLoCo",
    "CalibratedWA",
    "OnlineForecastWA",
    "OfflineCalibratedOracle",
    "WAWeights",
    "BudgetPace",
    "FixedBudget",
    "OnlineForecastBudget",
]


def _gap_steps(obs: np.ndarray, params: EnvParams) -> np.ndarray:
    # gap / H_max is exact in float32 for the default grid (multiples of 1/64).
    return np.rint(obs_feature(obs, "gap") * params.h_max) * params.decision_interval


class NoSync(Agent):
    """Never asks for a merge: ``a = 0``. The env still forces one at H_max; the
    protocol's true no-merge load match is computed directly (``core.schedule_summary``
    with an empty schedule), never by running this agent."""

    name = "no-sync"

    def act(self, obs: np.ndarray) -> np.ndarray:
        return np.zeros(len(obs), dtype=np.int64)


class FixedInterval(Agent):
    """Merge every ``H`` steps: ``a = 1[gap_steps >= H]`` (reference presets H = 256, 512).

    Args:
        interval_steps: H, in training steps.
        params: the env parameters (to read the gap feature in steps).
    """

    def __init__(self, interval_steps: int = 256, params: EnvParams | None = None) -> None:
        if interval_steps < 1:
            raise ValueError(f"interval_steps must be >= 1, got {interval_steps}")
        self.interval_steps = int(interval_steps)
        self.params = params or EnvParams()
        self.name = f"fixed-{self.interval_steps}"

    def attach(self, context: AgentContext) -> None:
        self.params = context.params

    def act(self, obs: np.ndarray) -> np.ndarray:
        return as_actions(_gap_steps(one_or_batch(obs), self.params) >= self.interval_steps)


class PressureGate(Agent):
    """Defer while fleet pressure is high:
    ``a = 1[max(network, serving, checkpoint) <= threshold]`` (reference default 0.6)."""

    name = "pressure-gate"

    def __init__(self, threshold: float = 0.6) -> None:
        self.threshold = float(threshold)

    def act(self, obs: np.ndarray) -> np.ndarray:
        p = np.maximum.reduce([obs_feature(obs, k) for k in ("network", "serving", "checkpoint")])
        return (p <= self.threshold).astype(np.int64)


class RandomDeferral(Agent):
    """Deployable random baseline: inside the corridor defer with probability ``p``
    (reference default 0.5). Not the matched control (that one is
    :class:`diloco_gym.eval.protocol.MatchedRandomDeferral`).

    Each episode draws its coins from its own random stream, independent of everything the
    agent observes after the episode's first observation. The stream is seeded from the
    agent's ``seed`` and a keyed hash (BLAKE2b) of that first observation, so an episode's
    schedule is reproducible, does not depend on what ran before, and needs no episode seed
    (which a deployable agent never gets). The runner's :meth:`attach` marks each new
    episode; without it (a plain ``predict`` loop) one stream runs on across episodes.

    Why not hash every observation: that makes each coin a fixed function of what the
    agent sees, i.e. a (meaningless) observation-dependent policy rather than independent
    coin flips; its results then vary with the key like a policy's, not like random draws.
    """

    name = "random-deferral"

    def __init__(self, p: float = 0.5, seed: int = 0) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be in [0, 1], got {p}")
        self.p = float(p)
        self.seed = int(seed)
        self._key = self.seed.to_bytes(16, "little", signed=True)
        self._rng: np.random.Generator | None = None

    def attach(self, context: Any) -> None:
        """A new episode starts: its stream is seeded from its first observation."""
        self._rng = None

    def uniforms(self, obs: np.ndarray) -> np.ndarray:
        """The next uniforms in [0, 1) of the episode's stream, one per observation row."""
        rows = np.ascontiguousarray(obs, dtype=np.float32).reshape(len(obs), -1)
        if self._rng is None:
            h = hashlib.blake2b(rows[0].tobytes(), digest_size=16, key=self._key).digest()
            self._rng = np.random.default_rng(int.from_bytes(h, "little"))
        return self._rng.random(len(rows))

    def act(self, obs: np.ndarray) -> np.ndarray:
        return (self.uniforms(obs) >= self.p).astype(np.int64)


@dataclass(frozen=True)
class WAWeights:
    """WA-DiLoCo score weights (the paper's configuration)."""

    loss: float = 0.5
    tokens: float = 0.5
    network: float = 0.5
    serving: float = 0.75
    checkpoint: float = 0.25
    staleness: float = 0.25
    cost: float = 0.0


#: the paper's weights (the online forecaster's progress term)
_PAPER_WEIGHTS = WAWeights()


class WADiLoCo(Agent):
    """Workload-aware DiLoCo: merge when ``score > threshold`` (default 0), with

    ``score = progress - pressure``,
    ``progress = w_loss * clip(loss_delta, 0.05) + w_tok * clip(tokens, 1e6)``,
    ``pressure = w_net * network + w_serve * serving + w_ckpt * checkpoint
    + w_cost * clip(sync_cost, 1) + w_stale * clip(staleness_s, 1800)``.

    Paper weights: w_loss .5, w_tok .5, w_net .5, w_serve .75, w_ckpt .25, w_stale .25,
    w_cost 0. ``aggregate="mean"`` (the paper) scores the mean learner;
    ``"unanimous"`` (the reference) needs every learner's score above the threshold, i.e.
    the slowest learner's (reports grow with throughput, so the minimum features in the
    observation are the slowest learner's). ``sync_cost`` is the expected overlap of a
    window started now: the forecast request rate relative to twice the slow baseline
    rate, ``forecast / (2 * baseline)`` (0.5 at average load, 1 at double).
    """

    name = "wa-diloco"

    def __init__(
        self,
        weights: WAWeights | None = None,
        threshold: float = 0.0,
        aggregate: str = "mean",
        rate_norm_rps: float = 8.0,
    ) -> None:
        if aggregate not in ("mean", "unanimous"):
            raise ValueError(f"aggregate must be 'mean' or 'unanimous', got {aggregate!r}")
        self.weights = weights or WAWeights()
        self.threshold = float(threshold)
        self.aggregate = aggregate
        self.rate_norm_rps = rate_norm_rps

    def attach(self, context: AgentContext) -> None:
        self.rate_norm_rps = context.params.rate_norm_rps

    def sync_cost(self, obs: np.ndarray) -> np.ndarray:
        f = unsquash_rate(obs_feature(obs, "rate_forecast"), self.rate_norm_rps)
        b = unsquash_rate(obs_feature(obs, "rate_baseline"), self.rate_norm_rps)
        return np.clip(f / np.maximum(2.0 * b, 1e-9), 0.0, 1.0)

    def score(self, obs: np.ndarray) -> np.ndarray:
        w = self.weights
        suffix = "mean" if self.aggregate == "mean" else "min"
        progress = w.loss * obs_feature(obs, f"loss_progress_{suffix}") + w.tokens * obs_feature(
            obs, f"tokens_{suffix}"
        )
        pressure = (
            w.network * obs_feature(obs, "network")
            + w.serving * obs_feature(obs, "serving")
            + w.checkpoint * obs_feature(obs, "checkpoint")
            + w.staleness * obs_feature(obs, "staleness")
        )
        if w.cost:
            pressure = pressure + w.cost * self.sync_cost(obs)
        return progress - pressure

    def act(self, obs: np.ndarray) -> np.ndarray:
        return as_actions(self.score(one_or_batch(obs)) > self.threshold)


class CalibratedWA(WADiLoCo):
    """WA-DiLoCo with the serving-overlap cost term: the paper weights with ``w_cost = 1``."""

    name = "calibrated-wa"

    def __init__(self, threshold: float = 0.0, aggregate: str = "mean") -> None:
        super().__init__(WAWeights(cost=1.0), threshold, aggregate)


class OnlineForecastWA(Agent):
    """Deployable calibrated WA with a one-step EWMA forecast of the request rate.

    The env's ``rate_forecast`` feature is the one-step EWMA forecast
    ``f_{t+1} = alpha * r_t + (1 - alpha) * f_t`` (``EnvParams.forecast_alpha``, default
    0.5, computed causally over every decision); ``rate_baseline`` is a slow EWMA of the
    same rates (what the coming decisions offer on average). The expected overlap cost of
    a window started now is proportional to the forecast rate, so the agent merges when

    ``progress >= min_progress`` and ``max(f, r_now) <= quiet_ratio * baseline``
    and ``trend <= max_trend``,

    where ``progress`` is WA-DiLoCo's progress term (mean learner). The corridor forces a
    merge at H_max. Defaults: ``min_progress = 0.3``, ``quiet_ratio = 0.9``,
    ``max_trend = 0.05`` (rate features in requests/s through ``rate_norm_rps``).
    """

    name = "online-forecast"

    def __init__(
        self,
        min_progress: float = 0.3,
        quiet_ratio: float = 0.9,
        max_trend: float = 0.05,
        rate_norm_rps: float = 8.0,
    ) -> None:
        self.min_progress = float(min_progress)
        self.quiet_ratio = float(quiet_ratio)
        self.max_trend = float(max_trend)
        self.rate_norm_rps = rate_norm_rps

    def attach(self, context: AgentContext) -> None:
        self.rate_norm_rps = context.params.rate_norm_rps

    def act(self, obs: np.ndarray) -> np.ndarray:
        obs = one_or_batch(obs)
        w = _PAPER_WEIGHTS
        progress = w.loss * obs_feature(obs, "loss_progress_mean") + w.tokens * obs_feature(
            obs, "tokens_mean"
        )
        f = unsquash_rate(obs_feature(obs, "rate_forecast"), self.rate_norm_rps)
        r = unsquash_rate(obs_feature(obs, "rate_now"), self.rate_norm_rps)
        b = unsquash_rate(obs_feature(obs, "rate_baseline"), self.rate_norm_rps)
        quiet = np.maximum(f, r) <= self.quiet_ratio * b
        calm = obs_feature(obs, "rate_trend") <= self.max_trend
        return as_actions((progress >= self.min_progress) & quiet & calm)


class OfflineCalibratedOracle(Agent):
    """Non-deployable upper bound: sees the whole trace (through the env's
    ``oracle_costs()``) and merges on the schedule of least total sync-excess cost under
    the corridor, by exact dynamic programming (:func:`diloco_gym.sim.schedules.optimal_schedule`).

    It needs the episode, so it runs only where a runner hands it over after each reset:
    :func:`diloco_gym.eval.rollout.run_episode` (``diloco-gym run`` / ``report``) or, for code
    that only calls ``predict`` such as SB3's ``evaluate_policy``, an env wrapped in
    :class:`diloco_gym.eval.rollout.AttachAgentWrapper`. It follows one env at a time.

    Args:
        budget: exact number of merges, or ``None`` for the free-budget optimum.
    """

    name = "offline-oracle"
    deployable = False

    def __init__(self, budget: int | None = None) -> None:
        self.budget = budget
        self._env = None
        self._plan: set[int] = set()

    def attach_episode(self, env: Any, episode_seed: int) -> None:
        p = env.params
        merges, _ = optimal_schedule(env.oracle_costs(), p.h_min, p.h_max, self.budget)
        self._plan = set(int(d) for d in merges)
        self._env = env

    def act(self, obs: np.ndarray) -> np.ndarray:
        if self._env is None:
            raise RuntimeError(
                "offline-oracle is non-deployable: it needs the episode (the env's future "
                "merge costs) after each reset, which only a runner hands over. Use "
                "diloco_gym.eval.rollout.run_episode, or wrap the env for evaluate_policy: "
                "evaluate_policy(agent, diloco_gym.eval.rollout.AttachAgentWrapper(env, agent))"
            )
        if len(obs) != 1:
            raise ValueError(
                f"offline-oracle follows one env at a time; got a batch of {len(obs)} observations"
            )
        return np.full(len(obs), int(self._env.decision in self._plan), dtype=np.int64)


# ----------------------------------------------------------------------------- budget-aware
class FixedBudget(Agent):
    """Fixed-H at the budget's interval: ``H = n / M`` decisions (episode decisions over
    the merge budget), i.e. ``a = 1[gap >= n / M]``.

    Budget-aware (reads ``budget_left`` and the budget ``M`` from the env's public
    parameters; needs ``merge_budget``). With ``H = n / M`` the ``M``-th merge would fall at
    the episode's end, so the env's budget mask places the last one (at the latest feasible
    decision); at the smallest budgets ``n / M`` exceeds ``H_max`` and the corridor forces
    every merge, as for fixed-512.
    """

    name = "fixed-budget"
    #: reads ``budget_left`` (the frontier tables mark such agents "budget-aware").
    budget_aware = True

    def __init__(self) -> None:
        self._pace: BudgetPace | None = None

    def attach(self, context: AgentContext) -> None:
        self._pace = BudgetPace(context.params)

    def act(self, obs: np.ndarray) -> np.ndarray:
        if self._pace is None:
            raise RuntimeError(
                f"{self.name} is budget-aware: attach it to an env with a merge "
                f"budget first (diloco_gym.eval.rollout.run_episode does)"
            )
        s = self._pace.read(one_or_batch(obs))
        interval = s["n"] / self._pace.budget
        return as_actions((s["gap"] >= interval) & (s["m_left"] > 0))


class OnlineForecastBudget(OnlineForecastWA):
    """The online forecaster with a merge budget: its quiet-rate rule, with the quiet
    threshold adapted to the merges left and the time left so that it spends its budget.

    Pacing. After the last merge at decision ``last`` the ``m_left`` merges still to place
    and the episode's tail share the ``n - last`` decisions left; on an even pace the next
    merge is due ``G = (n - last) / (m_left + 1)`` decisions after the last one. The
    agent's *urgency* is ``u = gap / G`` (1 = on pace).

    Rule. Merge when

    ``u >= min_urgency`` and (``max(f, r_now) <= quiet_ratio * u * baseline`` and
    ``trend <= max_trend``, or ``u >= max_urgency``),

    with ``f`` the one-step EWMA rate forecast, ``r_now`` the last interval's rate and
    ``baseline`` the slow EWMA (the forecaster's features). Early in a gap (``u`` small) only
    a clearly quiet period qualifies; the threshold relaxes linearly as the merge falls
    due, and past ``max_urgency`` it merges whatever the load, so it never drifts far
    behind its budget. The forecaster's progress threshold is dropped: the budget, not
    the learners' progress, decides how often to merge. The env's budget mask still
    guarantees exactly ``M`` merges (and the corridor H_min..H_max); the rule makes the
    agent's own choices spend them (its forced merges are few: tested).

    Defaults: ``quiet_ratio = 0.9``, ``max_trend = 0.05`` (the forecaster's),
    ``min_urgency = 0.5``, ``max_urgency = 1.5``. Deployable: observations and the public
    ``merge_budget`` only (:class:`BudgetPace`).
    """

    name = "online-forecast-budget"
    budget_aware = True

    def __init__(
        self,
        quiet_ratio: float = 0.9,
        max_trend: float = 0.05,
        min_urgency: float = 0.5,
        max_urgency: float = 1.5,
        rate_norm_rps: float = 8.0,
    ) -> None:
        super().__init__(
            min_progress=0.0,
            quiet_ratio=quiet_ratio,
            max_trend=max_trend,
            rate_norm_rps=rate_norm_rps,
        )
        if not 0.0 <= min_urgency <= max_urgency:
            raise ValueError(
                f"need 0 <= min_urgency <= max_urgency, got {min_urgency}, {max_urgency}"
            )
        self.min_urgency = float(min_urgency)
        self.max_urgency = float(max_urgency)
        self._pace: BudgetPace | None = None

    def attach(self, context: AgentContext) -> None:
        super().attach(context)
        self._pace = BudgetPace(context.params)

    def urgency(self, obs: np.ndarray) -> np.ndarray:
        """``gap / G`` per observation (see the class docstring)."""
        if self._pace is None:
            raise RuntimeError(
                f"{self.name} is budget-aware: attach it to an env with a merge "
                f"budget first (diloco_gym.eval.rollout.run_episode does)"
            )
        s = self._pace.read(obs)
        due = np.maximum((s["n"] - s["last"]) / (s["m_left"] + 1.0), 1.0)
        return np.where(s["m_left"] > 0, s["gap"] / due, 0.0)

    def act(self, obs: np.ndarray) -> np.ndarray:
        obs = one_or_batch(obs)
        u = self.urgency(obs)
        f = unsquash_rate(obs_feature(obs, "rate_forecast"), self.rate_norm_rps)
        r = unsquash_rate(obs_feature(obs, "rate_now"), self.rate_norm_rps)
        b = unsquash_rate(obs_feature(obs, "rate_baseline"), self.rate_norm_rps)
        quiet = np.maximum(f, r) <= self.quiet_ratio * u * b
        calm = obs_feature(obs, "rate_trend") <= self.max_trend
        go = (u >= self.min_urgency) & ((quiet & calm) | (u >= self.max_urgency))
        return as_actions(go)
