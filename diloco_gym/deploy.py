"""A scheduler in the loop: a loaded agent decides, every decision interval of a real
deployment, whether to launch the DiLoCo outer merge now.

:class:`Controller` turns what a deployment measures over each decision interval
(:class:`Telemetry`: the requests that arrived, the network and checkpoint-I/O pressure
now, the learners' reports since the last merge) into the observation
:class:`~diloco_gym.envs.env.DiLoCoSyncEnv` gives an agent, with the env's own arithmetic
(the same IEEE operations in the same order, so the float32 features are bit for bit the
env's), asks the agent when the env would, and returns a :class:`Decision`. It keeps the
state the env keeps: the gap since the last merge, the request-rate EWMAs (bias-corrected,
``forecast_alpha`` and ``baseline_alpha``), the merges so far, the decisions and the merge
budget left; it enforces the corridor (``H_min`` .. ``H_max``) and an exact merge budget as
the env's action mask does, and with ``skip_forced`` (the env's default) asks the agent
only when both actions are feasible. ``tests/test_deploy.py`` checks all of it against the
env, episode by episode.

Everything the controller uses is from the past: the observation at decision ``d`` reads
only the telemetry of decisions ``0 .. d``. docs/deploy.md says how to plug it into a
serving and DiLoCo training loop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from diloco_gym.agents.base import AgentContext
from diloco_gym.envs.kernel import BudgetTables, max_merges, options_at
from diloco_gym.envs.observation import OBS_DIM
from diloco_gym.envs.params import EnvParams
from diloco_gym.sim import learners as lrn
from diloco_gym.sim.limits import check_limit

__all__ = ["Telemetry", "Decision", "Controller"]


def _number(value: Any, field: str) -> float:
    """``value`` as a finite float, else a one-line ``ValueError`` naming ``field``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise ValueError(f"Telemetry.{field} must be a number, got {value!r:.60}")
    x = float(value)
    if not math.isfinite(x):
        raise ValueError(f"Telemetry.{field} must be finite, got {x!r}")
    return x


def _pressure(value: Any, field: str) -> float | None:
    if value is None:
        return None
    x = _number(value, field)
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"Telemetry.{field} must be in [0, 1] (or None), got {x!r}")
    return x


def _per_learner(values: Any, field: str, nonnegative: bool) -> tuple[float, ...] | None:
    if values is None:
        return None
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise ValueError(
            f"Telemetry.{field} must be a sequence of numbers, one per learner, "
            f"got {type(values).__name__}"
        )
    out = tuple(_number(v, f"{field}[{i}]") for i, v in enumerate(np.asarray(values).ravel()))
    if np.ndim(values) != 1 or not out:
        raise ValueError(
            f"Telemetry.{field} must be a non-empty 1-D sequence, one value per learner, "
            f"got shape {np.shape(values)}"
        )
    if nonnegative:
        for i, v in enumerate(out):
            if v < 0:
                raise ValueError(f"Telemetry.{field}[{i}] must be >= 0, got {v!r}")
    return out


@dataclass(frozen=True)
class Telemetry:
    """What a deployment measures over the last decision interval.

    Attributes:
        requests: requests that arrived at the serving sidecar during the interval (a
            count, ``>= 0``). The env's request rate at a decision is the count of the
            interval before it over ``decision_seconds``; the first decision of a run has
            no interval before it, so the env (and the controller) take its rate as 0 and
            the first ``requests`` is checked but not used.
        network: network pressure now, in ``[0, 1]``; ``None``: not measured, taken as 0
            (what the env does for a trace without a pressure series).
        checkpoint: checkpoint-I/O pressure now, in ``[0, 1]``; ``None`` as ``network``.
        loss_delta: per learner, its local loss reduction since the last merge (finite;
            a negative one, a loss that rose, counts as no progress, as the env's clip).
        tokens: per learner, the tokens it trained on since the last merge (``>= 0``).

    ``loss_delta`` and ``tokens`` come together, in any learner order (the features are
    means and minima). Both ``None``: the controller computes them from the learner
    surrogate (:mod:`diloco_gym.sim.learners`) with the throughputs it was given.
    Bad values raise a one-line ``ValueError`` naming the field.
    """

    requests: int
    network: float | None = None
    checkpoint: float | None = None
    loss_delta: Sequence[float] | None = None
    tokens: Sequence[float] | None = None

    def __post_init__(self) -> None:
        r = self.requests
        if isinstance(r, (bool, np.bool_)) or not isinstance(r, (int, np.integer)):
            raise ValueError(f"Telemetry.requests must be an int (a count), got {r!r:.60}")
        if r < 0:
            raise ValueError(f"Telemetry.requests must be >= 0, got {int(r)}")
        object.__setattr__(self, "requests", int(r))
        object.__setattr__(self, "network", _pressure(self.network, "network"))
        object.__setattr__(self, "checkpoint", _pressure(self.checkpoint, "checkpoint"))
        delta = _per_learner(self.loss_delta, "loss_delta", nonnegative=False)
        tokens = _per_learner(self.tokens, "tokens", nonnegative=True)
        if (delta is None) != (tokens is None):
            raise ValueError(
                "Telemetry.loss_delta and Telemetry.tokens come together (both None: the "
                "controller's learner surrogate computes them)"
            )
        if delta is not None and tokens is not None and len(delta) != len(tokens):
            raise ValueError(
                f"Telemetry.tokens has {len(tokens)} values but Telemetry.loss_delta has "
                f"{len(delta)}: one each per learner"
            )
        object.__setattr__(self, "loss_delta", delta)
        object.__setattr__(self, "tokens", tokens)


@dataclass(frozen=True, eq=False)
class Decision:
    """The controller's decision at one decision interval.

    Attributes:
        decision: the decision's index in the run (0 for the first interval).
        merge: launch the outer merge now.
        forced: no deferral was feasible: the gap reached ``H_max``, or the merge budget
            needs this merge.
        not_allowed: no merge was feasible: the gap is below ``H_min``, or the merge
            budget leaves none for now.
        asked: the agent was asked (with ``skip_forced``: only when both were feasible).
        overridden: the agent asked for an infeasible action and the feasible one was
            taken (only possible with ``skip_forced=False``).
        gap: decision intervals since the last merge at this decision.
        observation: the observation at this decision, float32 ``(17,)``, the one the
            agent saw when ``asked`` (``diloco_gym.envs.observation.OBS_FEATURES``).
    """

    decision: int
    merge: bool
    forced: bool
    not_allowed: bool
    asked: bool
    overridden: bool
    gap: int
    observation: np.ndarray


class _RateFilter:
    """The bias-corrected EWMA of the request rate as an episode build computes it
    (``sim.jit_build._ewma_into``: the direct form II transposed first-order filter, then
    divided by ``1 - (1 - alpha)**d``; 0 at the first decision)."""

    def __init__(self, alpha: float, n: int) -> None:
        self.b0 = alpha
        self.a1 = alpha - 1.0
        self.z = 0.0
        # The same NumPy expression as the env's table (elementwise, so its length is free).
        self.norm = 1.0 - (1.0 - alpha) ** np.arange(n)

    def push(self, x: float, d: int) -> float:
        yn = self.z + self.b0 * x
        self.z = x * 0.0 - yn * self.a1
        return yn / float(self.norm[d]) if d > 0 else 0.0


def _clip01(v: float) -> float:
    """``np.clip(v, 0, 1)`` as the env's compiled rule computes it."""
    v = v if v > 0.0 else 0.0
    return v if v < 1.0 else 1.0


class Controller:
    """A deployable agent in the loop of a real deployment: call :meth:`step` once per
    decision interval (``decision_interval`` training steps, ``decision_seconds`` of the
    env's clock) with that interval's :class:`Telemetry`; launch the merge when the
    returned :class:`Decision` says so.

    Args:
        agent: an agent with Stable-Baselines3's ``predict`` (``diloco_gym.agents``:
            ``make_agent("online-forecast")``, a loaded model). It is attached once with an
            :class:`~diloco_gym.agents.base.AgentContext` (the public parameters, ``regime``
            and the action mask before each question), as the evaluation runner does. A
            non-deployable agent (``deployable = False``, e.g. the offline oracle, which
            reads the future) is refused.
        params: the env's parameters (corridor, decision interval, EWMA weights, feature
            scales, ``skip_forced``, ``merge_budget``); default ``EnvParams()``.
        learners: the learner surrogate's parameters; its ``num_learners`` is the number
            of learners every report must have. ``DiLoCoSync-v2``'s are the shipped
            calibration's (``env.unwrapped.learner_params``). Default ``LearnerParams()``.
        serving_capacity_rps: the serving sidecar's capacity (requests per second): the
            ``serving`` feature is the rate forecast over it, capped at 1.
        decisions: decision intervals in the run (the env's episode length): the
            ``time_left`` and ``merges`` features and the merge budget's feasibility are
            relative to it. After it, start a new controller (a new episode).
        merge_budget: exact number of merges in the run (``None``: the params' own); a
            budget other than the params' non-``None`` one is refused.
        learner_throughputs: per learner, tokens per second, for runs whose telemetry
            carries no learner reports: the surrogate then gives them (and tracks the global
            model's tokens through its merges), as the env does.
        regime: the label the agent's context carries (some agents key on it).

    Attributes:
        d: the next decision's index; ``done`` once it reaches ``decisions``.
        last: the decision of the last merge (0 at the start: a run starts just after one).
        n_merges: merges so far; ``m_left``: merges left of the budget (0 without one).
        global_tokens: the surrogate's global tokens (moved only with
            ``learner_throughputs``).
    """

    def __init__(
        self,
        agent: Any,
        params: EnvParams | None = None,
        learners: lrn.LearnerParams | None = None,
        *,
        serving_capacity_rps: float,
        decisions: int,
        merge_budget: int | None = None,
        learner_throughputs: Sequence[float] | np.ndarray | None = None,
        regime: str = "deploy",
    ) -> None:
        p = params if params is not None else EnvParams()
        if merge_budget is not None:
            if p.merge_budget is not None and p.merge_budget != merge_budget:
                raise ValueError(
                    f"merge_budget={merge_budget} differs from params.merge_budget="
                    f"{p.merge_budget}: give one"
                )
            p = replace(p, merge_budget=merge_budget)
        self.params = p
        self.learners = learners if learners is not None else lrn.LearnerParams()
        self.serving_capacity_rps = _positive(serving_capacity_rps, "serving_capacity_rps")
        self.decisions = _decisions(decisions, p)
        self._thr = _throughputs(learner_throughputs, self.learners.num_learners)
        self._budget = (
            BudgetTables(self.decisions, p.h_min, p.h_max, p.merge_budget)
            if p.merge_budget is not None
            else None
        )  # an infeasible budget fails here, as in the env
        self.agent = agent
        self._attach(agent, regime)
        self._forecast = _RateFilter(p.forecast_alpha, self.decisions)
        self._baseline = _RateFilter(p.baseline_alpha, self.decisions)
        self._max_merges = float(max_merges(self.decisions, p))
        self.d = 0  # the next decision
        self.last = 0  # the decision of the last merge (a run starts just after one)
        self.n_merges = 0
        self.m_left = p.merge_budget if p.merge_budget is not None else 0
        self.global_tokens = float(self.learners.initial_tokens)  # the surrogate's
        self._agent_state: Any = None
        self._asked = False

    def _attach(self, agent: Any, regime: str) -> None:
        if not callable(getattr(agent, "predict", None)):
            raise TypeError(
                f"agent must have Stable-Baselines3's predict(), got {type(agent).__name__}"
            )
        if not bool(getattr(agent, "deployable", True)):
            raise ValueError(
                f"agent {getattr(agent, 'name', agent)!r} is not deployable (it reads the "
                f"future); a controller runs deployable agents only"
            )
        self._context = AgentContext(params=self.params, regime=str(regime))
        if callable(getattr(agent, "attach", None)):
            agent.attach(self._context)

    @property
    def done(self) -> bool:
        """Whether the run's ``decisions`` are all taken."""
        return self.d >= self.decisions

    @property
    def gap(self) -> int:
        """Decision intervals since the last merge, at the next decision."""
        return self.d - self.last

    def step(self, telemetry: Telemetry) -> Decision:
        """Decide at the next decision from the telemetry of the interval before it.

        Raises:
            ValueError: telemetry that is not a :class:`Telemetry`, or with another number
                of learners than ``learners.num_learners``, or without learner reports
                when the controller has no throughputs; an agent action other than 0 or 1.
            RuntimeError: called after the run's last decision.
        """
        if not isinstance(telemetry, Telemetry):
            raise ValueError(f"step() takes a Telemetry, got {type(telemetry).__name__}")
        if self.done:
            raise RuntimeError(
                f"the run's {self.decisions} decisions are over; start a new Controller"
            )
        block = self._learner_block(telemetry)  # checked before any state changes
        d, p = self.d, self.params
        rate = 0.0 if d == 0 else telemetry.requests / p.decision_seconds
        fc = self._forecast.push(rate, d)
        bl = self._baseline.push(rate, d)
        obs = self._observation(telemetry, block, rate, fc, bl)
        can_merge, can_defer = options_at(
            d, self.last, self.m_left, p, self.decisions, self._budget
        )
        asked = (can_merge and can_defer) or not p.skip_forced
        want = self._ask(obs, can_defer, can_merge) if asked else False
        merge = (want and can_merge) or not can_defer
        decision = Decision(
            decision=d,
            merge=bool(merge),
            forced=not can_defer,
            not_allowed=not can_merge,
            asked=asked,
            overridden=asked and merge != want,
            gap=d - self.last,
            observation=obs,
        )
        if merge:
            self._merge()
        self.d = d + 1
        return decision

    def _ask(self, obs: np.ndarray, can_defer: bool, can_merge: bool) -> bool:
        """The agent's answer (merge?) to ``obs``, with the mask ``[can_defer, can_merge]``
        in its context, as the evaluation runner asks it."""
        self._context._set_mask(np.array([can_defer, can_merge]))
        action, self._agent_state = self.agent.predict(
            obs.copy(),
            state=self._agent_state,
            episode_start=np.array([not self._asked]),
            deterministic=True,
        )
        self._asked = True
        a = np.asarray(action).reshape(-1)
        if a.size != 1 or a.dtype.kind not in "iub" or int(a[0]) not in (0, 1):
            raise ValueError(
                f"agent {getattr(self.agent, 'name', self.agent)!r} answered {action!r:.60}; "
                f"an action is 0 (defer) or 1 (merge)"
            )
        return int(a[0]) == 1

    def _merge(self) -> None:
        """A merge at the current decision: the state after it (the env's ``merge_row``)."""
        if self._thr is not None:
            gap_s = (self.d - self.last) * self.params.decision_seconds
            added, _ = lrn.merge_gain(gap_s, self.global_tokens, self._thr, self.learners)
            self.global_tokens = self.global_tokens + added
        self.last = self.d
        self.m_left -= 1
        self.n_merges += 1

    def _reports(self, t: Telemetry) -> tuple[np.ndarray, np.ndarray]:
        """``(loss_delta, tokens)`` per learner: the telemetry's, or the surrogate's."""
        k = self.learners.num_learners
        if t.loss_delta is not None and t.tokens is not None:
            if len(t.loss_delta) != k:
                raise ValueError(
                    f"Telemetry.loss_delta has {len(t.loss_delta)} learners, the controller "
                    f"{k} (LearnerParams.num_learners)"
                )
            return np.array(t.loss_delta), np.array(t.tokens)
        if self._thr is None:
            raise ValueError(
                "Telemetry.loss_delta and Telemetry.tokens are None and the controller has "
                "no learner_throughputs for its surrogate: give one or the other"
            )
        gap_s = (self.d - self.last) * self.params.decision_seconds
        delta, tau = lrn.reports(gap_s, self.global_tokens, self._thr, self.learners)
        return np.asarray(delta, dtype=np.float64), np.asarray(tau, dtype=np.float64)

    def _learner_block(self, t: Telemetry) -> list[float]:
        """Mean and minimum clipped loss progress, mean and minimum clipped tokens and the
        clipped staleness (the env's ``jit.learner_row``; the learners in ascending order,
        the env's order, so that the mean's pairwise sum is the env's)."""
        p = self.params
        delta, tau = self._reports(t)
        k = delta.size
        lp = np.sort(np.array([_clip01(x / p.loss_clip) for x in delta.tolist()]))
        tk = np.sort(np.array([_clip01(x / p.tokens_clip) for x in tau.tolist()]))
        gap_s = min(self.d - self.last, p.h_max) * p.decision_seconds
        return [
            float(np.sum(lp)) / k,
            float(lp[0]),
            float(np.sum(tk)) / k,
            float(tk[0]),
            _clip01(gap_s / p.staleness_clip_s),
        ]

    def _observation(
        self, t: Telemetry, block: list[float], rate: float, fc: float, bl: float
    ) -> np.ndarray:
        """The observation at the current decision (``jit.observe_range`` and the episode
        build's ``jit_build.exo_row``, value by value, stored as float32)."""
        p, d, n = self.params, self.d, self.decisions
        gap = d - self.last
        norm = p.rate_norm_rps
        trend = (fc - bl) / norm
        trend = trend if trend > -1.0 else -1.0
        budget = p.merge_budget
        row = [
            min(1.0, gap / p.h_max),
            1.0 if gap >= p.h_min else 0.0,
            *block,
            0.0 if t.network is None else t.network,
            min(1.0, fc / self.serving_capacity_rps),
            0.0 if t.checkpoint is None else t.checkpoint,
            rate / (rate + norm),
            fc / (fc + norm),
            bl / (bl + norm),
            trend if trend < 1.0 else 1.0,
            min(1.0, self.n_merges / self._max_merges),
            (n - d) / n,
            1.0 if budget is None else (self.m_left / budget if budget > 0 else 0.0),
        ]
        obs = np.array(row, dtype=np.float32)  # float64 -> float32, as the env's stores
        assert obs.shape == (OBS_DIM,)
        return obs


def _positive(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise ValueError(f"Controller {name} must be a number, got {value!r:.60}")
    x = float(value)
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"Controller {name} must be finite and > 0, got {x!r}")
    return x


def _decisions(value: Any, p: EnvParams) -> int:
    """The run's decisions: an int above ``H_min`` (an episode's least), within the
    ``DECISIONS`` limit (:mod:`diloco_gym.sim.limits`)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"Controller decisions must be an int, got {value!r:.60}")
    check_limit("DECISIONS", int(value), "Controller decisions")
    if value < p.h_min + 1:
        raise ValueError(
            f"Controller decisions must be > H_min = {p.h_min} decisions, got {int(value)}"
        )
    return int(value)


def _throughputs(value: Any, k: int) -> np.ndarray | None:
    """The surrogate's per-learner throughputs, ascending (the env's order), or ``None``."""
    if value is None:
        return None
    thr = np.asarray(value, dtype=np.float64)
    if thr.shape != (k,):
        raise ValueError(
            f"Controller learner_throughputs must have one value per learner ({k}), "
            f"got shape {thr.shape}"
        )
    if not np.all(np.isfinite(thr) & (thr > 0)):
        raise ValueError("Controller learner_throughputs must be finite and > 0")
    return np.sort(thr)
