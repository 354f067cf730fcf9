"""The causal planner: a budget-aware scheduler that infers the burst phase from the past
arrivals and re-plans its remaining merges by an exact dynamic programme each decision.

Method (docs/planner.md):

1. **History** (:func:`fit_phase_model`). From episodes of *training* seeds of the same
   regime (seeds ``>= 10**6``, never a test seed; drawn from the regime's generator, which
   is only called, never read) the planner fits a renewal model of the bursts in the
   observable the agent itself sees: the arrivals per decision interval (``rate_now``).
   Bursts are found in each history episode as runs of its smoothed counts above the
   midpoint of their quiet and busy levels; the phase ``s`` of a decision is the number of
   decisions since the last burst onset. Fitted: the distribution of the decisions between
   onsets (its hazard), the mean count ``mu[s]`` and the mean isolated merge cost
   ``kappa[s]`` at each phase (the training episodes' own costs: history).
2. **Phase inference** (causal). During an episode a hidden semi-Markov filter over ``s``
   conditions on each observed count (a Poisson likelihood with mean ``mu[s]``); decisions
   the env skips (a forced action) pass without an observation. Nothing else of the episode
   is read: the observation at decision ``d`` carries only arrivals before ``d``.
3. **Planning**. The cost of a merge at each remaining decision is a power mean of
   ``kappa[s]`` under the filter's forecast of the phase there, ``E[kappa^a]^(1/a)``
   (default ``a = -1``; ``a = 1`` is the expected cost). An exact dynamic programme places
   the merges left in the corridor ``[H_min, H_max]`` with the env's end condition (the
   last merge less than ``H_max`` decisions before the end); its first merge pays an
   early-merge penalty per decision short of the even pace (``early``). The agent merges
   now iff the plan's first merge is now. The env's budget mask keeps exactly ``M`` merges
   whatever the agent asks.

What it never reads: the regime object's parameters (burst period, rates, ramp), the
episode's trace, its merge costs or anything after the current decision. Without history
(a replayed trace or an unknown regime name) it fits the same model to the episode's own
past counts as they come in (:attr:`CausalPlanner.refit_every`), with a cost proxy that
grows with the expected arrivals of a merge's window.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np

from diloco_gym.agents.base import Agent, AgentContext
from diloco_gym.envs.budget_features import BudgetPace
from diloco_gym.envs.observation import OBS_INDEX, unsquash_rate
from diloco_gym.envs.params import EnvParams

__all__ = [
    "CausalPlanner",
    "phase_predict",
    "phase_update",
    "cost_forecast",
    "PhaseModel",
    "fit_phase_model",
    "history_model",
    "carried_histories",
    "HISTORY_SEED0",
]

#: The first history seed: the training range's start (docs/training.md "Seeds").
HISTORY_SEED0 = 10**6
#: Half-width of the centred moving average used to find bursts in history counts.
_SMOOTH = 2
#: Shortest busy or quiet run (decisions) kept when finding bursts.
_MIN_RUN = 4
#: The ``rate_now`` feature's index in an observation.
_RATE_NOW = OBS_INDEX["rate_now"]
#: Busy levels below this multiple of the quiet level are no bursts (a steady regime).
_MIN_CONTRAST = 1.5


@dataclass(frozen=True)
class PhaseModel:
    """The burst model a :class:`CausalPlanner` plans with: plain NumPy arrays over the
    phase ``s = 0 .. S - 1`` (decisions since the last burst onset).

    Attributes:
        hazard: probability that a burst starts at the next decision, given phase ``s``
            (1 at the last phase).
        prior: the phase distribution at an episode's start (the renewal process's
            stationary one, proportional to ``P(interval > s)``).
        mu: mean arrivals per decision interval at phase ``s``.
        kappa: mean isolated merge cost (requests) of a merge at phase ``s``.
        bursts: whether bursts were found (``False``: one phase, a steady load).
    """

    hazard: np.ndarray
    prior: np.ndarray
    mu: np.ndarray
    kappa: np.ndarray
    bursts: bool


def _smooth(x: np.ndarray, half: int) -> np.ndarray:
    """Centred moving average of width ``2 half + 1``, NaN-aware (NaN where no value)."""
    ok = np.isfinite(x)
    v = np.where(ok, x, 0.0)
    k = np.ones(2 * half + 1)
    num = np.convolve(v, k, mode="same")
    den = np.convolve(ok.astype(float), k, mode="same")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.maximum(den, 1), np.nan)


def _runs(flag: np.ndarray) -> list[tuple[int, int, bool]]:
    """``(start, end, value)`` of the runs of a boolean array (end exclusive)."""
    if flag.size == 0:
        return []
    edges = np.flatnonzero(np.diff(flag.astype(np.int8))) + 1
    starts = np.concatenate([[0], edges])
    ends = np.concatenate([edges, [flag.size]])
    return [(int(a), int(b), bool(flag[a])) for a, b in zip(starts, ends, strict=True)]


def _onsets(counts: np.ndarray, theta: float) -> np.ndarray:
    """Burst onsets of one episode's counts: starts of busy runs (smoothed counts above
    ``theta``) after short runs are merged into their neighbours."""
    sm = _smooth(counts, _SMOOTH)
    busy = sm > theta
    # Where nothing was observed (decisions the env skipped), the last known state holds.
    seen = np.isfinite(sm)
    if not seen.all():
        last = np.maximum.accumulate(np.where(seen, np.arange(sm.size), -1))
        busy = np.where(last >= 0, busy[np.maximum(last, 0)], False)
    # Merge runs shorter than _MIN_RUN into the previous run (both directions of flicker).
    for _ in range(2):
        for a, b, v in _runs(busy):
            if b - a < _MIN_RUN and a > 0:
                busy[a:b] = not v
    return np.array([a for a, _b, v in _runs(busy) if v and a > 0], dtype=np.int64)


def _flat(counts: list[np.ndarray], costs: list[np.ndarray] | None) -> PhaseModel:
    c = np.concatenate([x[np.isfinite(x)] for x in counts]) if counts else np.zeros(1)
    mu = max(float(c.mean()) if c.size else 1.0, 0.05)
    kap = float(np.nanmean(np.concatenate(costs))) if costs else mu
    one = np.ones(1)
    return PhaseModel(one, one.copy(), np.array([mu]), np.array([kap]), False)


def _phase_sums(
    counts: list[np.ndarray],
    costs: list[np.ndarray] | None,
    onsets: list[np.ndarray],
    s_max: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-phase sums and numbers of the observed counts (and costs) after each episode's
    first onset (before it the phase is unknown)."""
    sum_c = np.zeros(s_max)
    n_c = np.zeros(s_max)
    sum_k = np.zeros(s_max)
    n_k = np.zeros(s_max)
    for i, (c, o) in enumerate(zip(counts, onsets, strict=True)):
        if o.size == 0:
            continue
        t = np.arange(o[0], c.size)
        ph = t - o[np.searchsorted(o, t, side="right") - 1]
        ph = np.minimum(ph, s_max - 1)
        ok = np.isfinite(c[t])
        np.add.at(sum_c, ph[ok], c[t][ok])
        np.add.at(n_c, ph[ok], 1.0)
        if costs is not None:
            k = np.asarray(costs[i], dtype=np.float64)[t]
            okk = np.isfinite(k)
            np.add.at(sum_k, ph[okk], k[okk])
            np.add.at(n_k, ph[okk], 1.0)
    return sum_c, n_c, sum_k, n_k


def _lead(counts: list[np.ndarray], onsets: list[np.ndarray], quiet: float, busy: float) -> int:
    """Decisions before the detected onsets in which the mean count already exceeds the
    quiet level by a tenth of the busy lift (a ramp), at most 30."""
    span = 30
    tot = np.zeros(span)
    num = np.zeros(span)
    for c, o in zip(counts, onsets, strict=True):
        for a in o:
            for j in range(1, span + 1):
                if a - j >= 1 and np.isfinite(c[a - j]):
                    tot[j - 1] += c[a - j]
                    num[j - 1] += 1
    profile = np.where(num > 0, tot / np.maximum(num, 1), quiet)
    above = _smooth(profile, 1) > quiet + 0.1 * (busy - quiet)
    return int(np.argmin(above)) if not above.all() else span


def fit_phase_model(
    counts: list[np.ndarray],
    costs: list[np.ndarray] | None = None,
    proxy_window: int = 12,
    lead: int | None = None,
    min_intervals: int = 3,
) -> PhaseModel:
    """Fit the burst model to episodes' arrivals per decision (``counts``: one array per
    episode, NaN where a decision was not observed; decision 0 carries no past and is
    ignored) and, when given, their isolated merge costs per decision.

    Without costs (an episode's own past) ``kappa[s]`` is a proxy: the expected arrivals of
    the ``proxy_window`` decisions from phase ``s`` on, under the fitted renewal chain, which
    grows with the load a merge started at ``s`` overlaps.

    ``lead``: decisions by which the phase's origin precedes a detected onset; ``None``
    measures it (:func:`_lead`: how long the mean count rises before the onsets).
    ``min_intervals``: fewer intervals between onsets than this fit no bursts (a flat
    model).
    """
    counts = [np.asarray(c, dtype=np.float64).copy() for c in counts]
    for c in counts:
        if c.size:
            c[0] = np.nan
    smoothed = np.concatenate([_smooth(c, _SMOOTH) for c in counts]) if counts else np.zeros(0)
    smoothed = smoothed[np.isfinite(smoothed)]
    if smoothed.size < 20:
        return _flat(counts, costs)
    lo, hi = np.percentile(smoothed, [20.0, 90.0])
    if hi < _MIN_CONTRAST * lo + 1.0:
        return _flat(counts, costs)
    theta = 0.5 * (lo + hi)
    onsets = [_onsets(c, theta) for c in counts]
    quiet = float(np.mean(smoothed[smoothed <= theta])) if np.any(smoothed <= theta) else lo
    if lead is None:
        lead = _lead(counts, onsets, quiet, hi)
    if lead:
        # The phase starts where the load starts to rise (a ramp), not where it is busy, so
        # that the filter has states for "a burst is building up".
        onsets = [o[o - lead >= 1] - lead for o in onsets]
    intervals = np.concatenate([np.diff(o) for o in onsets if o.size > 1] or [np.zeros(0)])
    if intervals.size < min_intervals:
        return _flat(counts, costs)
    s_max = int(np.max(intervals) * 1.25) + 2
    # The interval distribution, lightly smoothed (detection jitter), with a floor.
    pmf = np.bincount(intervals.astype(np.int64), minlength=s_max + 1)[: s_max + 1].astype(float)
    pmf = np.convolve(pmf, [0.25, 0.5, 0.25], mode="same")
    pmf[0] = 0.0
    pmf[1:] += 1e-4 * pmf.sum() / s_max
    pmf /= pmf.sum()
    surv = 1.0 - np.cumsum(pmf)  # surv[s] = P(L > s)
    surv = np.maximum(surv, 0.0)
    # hazard[s]: from phase s the next decision is an onset, P(L = s + 1 | L > s).
    hazard = np.ones(s_max)
    with np.errstate(invalid="ignore", divide="ignore"):
        h = pmf[1 : s_max + 1] / np.where(surv[:s_max] > 0, surv[:s_max], np.inf)
    hazard[:] = np.clip(np.nan_to_num(h, nan=1.0), 0.0, 1.0)
    hazard[-1] = 1.0
    prior = surv[:s_max].copy()
    prior = prior / prior.sum() if prior.sum() > 0 else np.full(s_max, 1.0 / s_max)
    sum_c, n_c, sum_k, n_k = _phase_sums(counts, costs, onsets, s_max)
    mu = np.where(n_c >= 3, sum_c / np.maximum(n_c, 1), quiet)
    mu = np.maximum(mu, 0.05)
    if costs is not None:
        base = float(np.nansum(sum_k) / max(n_k.sum(), 1.0))
        kappa = np.where(n_k >= 3, sum_k / np.maximum(n_k, 1), base)
    else:
        kappa = _proxy_costs(hazard, mu, proxy_window)
    return PhaseModel(hazard, prior, mu, kappa, True)


def _proxy_costs(hazard: np.ndarray, mu: np.ndarray, window: int) -> np.ndarray:
    """Expected arrivals over ``window`` decisions from each phase on (the renewal chain run
    forward from a point mass at each phase), squared: a merge's overlap cost grows faster
    than linearly with the load it meets."""
    s_max = hazard.size
    p = np.eye(s_max)
    total = np.zeros(s_max)
    for _ in range(window):
        total += p @ mu
        nxt = np.zeros_like(p)
        nxt[:, 1:] = p[:, :-1] * (1.0 - hazard[:-1])
        nxt[:, 0] = p @ hazard
        p = nxt
    return (total / window) ** 2


def _episode_counts(exo_rate: np.ndarray, params: EnvParams) -> np.ndarray:
    """Arrivals per decision interval from the ``rate_now`` feature (what the agent sees)."""
    r = unsquash_rate(exo_rate.astype(np.float64), params.rate_norm_rps)
    return np.rint(r * params.decision_seconds)


def history_episodes(
    generator: Any,
    params: EnvParams,
    sidecar: Any,
    seeds: range,
    with_costs: bool = True,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The counts and (``with_costs``) isolated merge costs per decision of the episodes of
    ``seeds`` drawn from ``generator`` (only called: its attributes are never read; the
    reward scale, which the costs do not use, is fixed at 1 req/s rather than read from it).

    Raises:
        ValueError: a seed below the training range (:data:`HISTORY_SEED0`): history is
            drawn from training seeds only.
    """
    from diloco_gym.envs.episode import episode_from_seed
    from diloco_gym.sim import learners as lrn

    if seeds.start < HISTORY_SEED0:
        raise ValueError(
            f"history seeds must be training seeds (>= {HISTORY_SEED0}), got {seeds.start}"
        )
    lp = lrn.LearnerParams()
    counts, costs = [], []
    col = OBS_INDEX["rate_now"] - OBS_INDEX["network"]
    for seed in seeds:
        ep = episode_from_seed(generator, seed, params, sidecar, lp, rate_rps=1.0)
        counts.append(_episode_counts(ep.exo[:, col], params))
        if with_costs:
            costs.append(np.asarray(ep.merge_cost, dtype=np.float64))
    return counts, costs


@lru_cache(maxsize=16)
def _cached_history(
    regime: str, params: EnvParams, n: int, seed0: int, lead: int | None
) -> PhaseModel:
    from diloco_gym.sim.regimes import get_regime

    gen = get_regime(regime)
    # A first look at a few episodes' counts: a steady regime (no bursts) needs no merge
    # costs (its model is flat, one phase), which are most of the fitting's time.
    probe = min(n, 8)
    counts, _ = history_episodes(gen, params, gen.sidecar, range(seed0, seed0 + probe), False)
    if not fit_phase_model(counts, None, lead=lead).bursts:
        return _flat(counts, None)
    counts, costs = history_episodes(gen, params, gen.sidecar, range(seed0, seed0 + n))
    return fit_phase_model(counts, costs, lead=lead)


def history_model(
    regime: str,
    params: EnvParams,
    n: int = 64,
    seed0: int = HISTORY_SEED0,
    lead: int | None = None,
) -> PhaseModel | None:
    """The burst model fitted to ``n`` training episodes of the named regime (cached per
    process), or ``None`` when the name is not a synthetic regime (a replayed trace)."""
    from diloco_gym.sim.regimes import REGIMES

    if regime not in REGIMES:
        return None
    base = replace(params, merge_budget=None)
    return _cached_history(regime, base, int(n), int(seed0), lead)


@lru_cache(maxsize=4)
def carried_histories(
    n: int = 64, lead: int | None = None
) -> dict[tuple[str, EnvParams], PhaseModel]:
    """The history model of every synthetic regime at the default parameters, by
    ``(regime, params)`` (cached per process: fitted once, about 0.1 s per regime)."""
    from diloco_gym.sim.regimes import REGIMES

    params = EnvParams()
    out: dict[tuple[str, EnvParams], PhaseModel] = {}
    for name in REGIMES:
        model = history_model(name, params, n, lead=lead)
        if model is not None:
            out[(name, params)] = model
    return out


def _plan_first() -> Any:
    """The compiled budget DP (:func:`diloco_gym.sim.jit_plan.plan_first`), imported on
    first use (it imports numba)."""
    from diloco_gym.sim import compiled_plan

    return compiled_plan().plan_first


def phase_predict(p: np.ndarray, hazard: np.ndarray, k: int) -> np.ndarray:
    """``k`` steps of the renewal chain from the phase distribution ``p``: from phase ``s``
    a burst starts (phase 0) with probability ``hazard[s]``, else the phase grows by one."""
    for _ in range(k):
        go = p * hazard
        nxt = np.empty_like(p)
        nxt[0] = go.sum()
        nxt[1:] = p[:-1] - go[:-1]
        p = nxt
    return p


def phase_update(
    p: np.ndarray,
    mu: np.ndarray,
    count: float,
    weight: float,
    log_mu: np.ndarray | None = None,
) -> np.ndarray:
    """``p`` conditioned on a Poisson ``count`` with mean ``mu[s]`` at phase ``s`` (the
    log-likelihood ``count log mu - mu`` times ``weight``; ``count!`` cancels), normalised.
    A count no phase with mass can explain leaves ``p`` as it was. ``log_mu``: ``np.log(mu)``
    when the caller keeps it."""
    ll = weight * (count * (np.log(mu) if log_mu is None else log_mu) - mu)
    top = ll[p > 0].max(initial=-np.inf)
    if not np.isfinite(top):
        return p
    post = p * np.exp(np.minimum(ll - top, 0.0))  # capped: a phase without mass stays 0
    return post / post.sum()


def cost_forecast(hazard: np.ndarray, kappa: np.ndarray, horizon: int) -> np.ndarray:
    """``V[j] = T^j kappa`` for ``j < horizon`` (``T`` the renewal chain's transition
    matrix), ``(horizon, S)``: the expected merge cost ``j`` decisions ahead of a phase
    distribution ``p`` is ``V[j] @ p``, one matrix product for every decision left."""
    out = np.empty((horizon, hazard.size))
    v = np.asarray(kappa, dtype=np.float64)
    stay = 1.0 - hazard
    for j in range(horizon):
        out[j] = v
        nxt = hazard * v[0]
        nxt[:-1] += stay[:-1] * v[1:]
        v = nxt
    return out


def power_transform(kappa: np.ndarray, power: float) -> np.ndarray:
    """``kappa ** power`` (``log kappa`` for ``power = 0``), costs floored at 1e-3."""
    k = np.maximum(np.asarray(kappa, dtype=np.float64), 1e-3)
    return np.log(k) if power == 0.0 else k**power


def power_inverse(x: np.ndarray, power: float) -> np.ndarray:
    """The inverse of :func:`power_transform`: ``E[kappa ** a] ** (1 / a)`` from its mean."""
    return np.exp(x) if power == 0.0 else np.maximum(x, 1e-300) ** (1.0 / power)


class CausalPlanner(Agent):
    """Budget-aware causal planner (module docstring; docs/planner.md).

    Args:
        history: number of training episodes the burst model is fitted to (default 64).
        model: a fitted :class:`PhaseModel` to use instead (e.g. fitted before sealing).
        weight: the Poisson log-likelihood's weight in the filter (``< 1`` tempers it for
            counts more dispersed than Poisson).
        refit_every: without history, refit the model to the episode's own past counts
            every this many observed decisions (from the first ``min_own`` on).
        min_own: observed decisions needed before the episode's own past is used.
        lead: decisions by which a phase's origin precedes a detected burst onset
            (``None``: measured from the history, :func:`fit_phase_model`).
        power: the power mean of the phase costs a decision's forecast cost is
            (:func:`power_transform`): 1 the expected cost, 0 the geometric mean, -1 (the
            default) the harmonic mean, in [-4, 1].
        early: the first merge's penalty per decision its gap falls short of the even pace,
            in units of the mean forecast cost over ``H_max`` (default 1; 0: none).

    Deployable: it reads observations, the public parameters and the merge budget; the
    regime's *name* selects which training history to draw. ``power``, ``early`` and
    ``lead``'s measurement were chosen on seeds 500-519 (docs/planner.md).
    """

    name = "causal-planner"
    budget_aware = True

    def __init__(
        self,
        history: int = 64,
        model: PhaseModel | None = None,
        weight: float = 1.0,
        refit_every: int = 25,
        min_own: int = 100,
        lead: int | None = None,
        power: float = -1.0,
        early: float = 1.0,
    ) -> None:
        if history < 0:
            raise ValueError(f"history must be >= 0 episodes, got {history}")
        if not 0.0 < weight <= 1.0:
            raise ValueError(f"weight must be in (0, 1], got {weight}")
        self.history = int(history)
        self.model = model
        self.weight = float(weight)
        self.refit_every = int(refit_every)
        self.min_own = int(min_own)
        self.lead = lead
        if not -4.0 <= power <= 1.0:
            raise ValueError(f"power must be in [-4, 1], got {power}")
        if not (np.isfinite(early) and early >= 0.0):
            raise ValueError(f"early must be a number >= 0, got {early}")
        self.power = float(power)
        self.early = float(early)
        self._pace: BudgetPace | None = None
        self._params: EnvParams | None = None
        self._active: PhaseModel | None = None
        self._own = False
        self._p = np.zeros(1)
        self._seen = -1
        self._counts: list[float] = []
        self._since_fit = 0
        self._forecast: np.ndarray | None = None
        self._log_mu: np.ndarray | None = None  # np.log of the active model's mu
        self._scratch = np.empty(0)  # the DP's scratch, kept across decisions
        #: history models carried into a sealed worker (:meth:`__getstate__`)
        self._carried: dict[tuple[str, EnvParams], PhaseModel] = {}

    def attach(self, context: AgentContext) -> None:
        """A new episode: pick the model (given, or the regime's history, or the episode's
        own past) and start the filter at the model's prior."""
        self._params = context.params
        self._pace = BudgetPace(context.params)
        model = self.model
        if model is None and self.history > 0:
            key = (context.regime, replace(context.params, merge_budget=None))
            model = self._carried.get(key)
            if model is None:
                model = history_model(context.regime, context.params, self.history, lead=self.lead)
        self._own = model is None
        model = model if model is not None else _flat([], None)
        if model is not self._active:  # the forecast matrix is the model's: kept with it
            self._forecast = None
            self._log_mu = None
        self._active = model
        self._start()

    def __getstate__(self) -> dict[str, Any]:
        """The agent as it is pickled or copied, e.g. to be sealed: with the history models
        of the synthetic regimes at the default parameters, fitted here, in the evaluator
        (:func:`carried_histories`), so that a sealed worker need not build history
        episodes (it has no on-disk cache of the simulator's compiled code, and compiling
        it there costs seconds per run). A worker still fits other parameters itself."""
        state = dict(self.__dict__)
        if self.model is None and self.history > 0 and not self._carried:
            state["_carried"] = carried_histories(self.history, self.lead)
        return state

    def _start(self) -> None:
        assert self._active is not None
        self._p = self._active.prior.astype(np.float64).copy()
        self._seen = 0  # the filter stands at decision 0 (no observation there)
        self._counts = []
        self._since_fit = 0

    def _refit_own(self) -> None:
        """Without history: refit on the episode's own past counts (NaN where skipped),
        then re-run the filter over them."""
        counts = np.array(self._counts, dtype=np.float64)
        if np.isfinite(counts).sum() < self.min_own:
            return
        model = fit_phase_model([counts], lead=self.lead, min_intervals=2)
        if not model.bursts:
            return
        self._active = model
        self._forecast = None
        self._log_mu = None
        p = model.prior.astype(np.float64).copy()
        for d in range(1, counts.size):
            p = phase_predict(p, model.hazard, 1)
            if np.isfinite(counts[d]):
                p = phase_update(p, model.mu, float(counts[d]), self.weight)
        self._p = p

    def act(self, obs: np.ndarray) -> np.ndarray:
        if self._pace is None or self._active is None or self._params is None:
            raise RuntimeError(
                f"{self.name} is budget-aware: attach it to an env with a merge "
                f"budget first (diloco_gym.eval.rollout.run_episode does)"
            )
        if len(obs) != 1:
            raise ValueError(
                f"{self.name} follows one episode at a time; got a batch of {len(obs)} observations"
            )
        return np.array([int(self._decide(obs[0]))], dtype=np.int64)

    def _count(self, x: float) -> float:
        """:func:`_episode_counts` of one ``rate_now`` value, on Python floats (the same
        float64 operations; ``round`` rounds half to even, as ``np.rint``)."""
        assert self._params is not None
        x = min(x, 1 - 1e-6)
        r = self._params.rate_norm_rps * x / (1.0 - x)
        return float(round(r * self._params.decision_seconds))

    def _decide(self, o: np.ndarray) -> bool:
        assert self._pace is not None and self._active is not None and self._params is not None
        s = self._pace.read(o)
        d, n, gap, m_left = int(s["d"]), int(s["n"]), int(s["gap"]), int(s["m_left"])
        count = self._count(float(o[_RATE_NOW]))
        if d < self._seen:  # a new episode without attach (a plain predict loop)
            self._start()
        model = self._active
        if d > self._seen:
            self._p = phase_predict(self._p, model.hazard, d - self._seen)
            if d > 0:
                if self._log_mu is None or self._log_mu.size != model.mu.size:
                    self._log_mu = np.log(model.mu)
                self._p = phase_update(self._p, model.mu, count, self.weight, self._log_mu)
        if self._own:
            self._counts.extend([np.nan] * (d - len(self._counts)))
            self._counts.append(count if d > 0 else np.nan)
            self._since_fit += 1
            if self._since_fit >= self.refit_every:
                self._since_fit = 0
                self._refit_own()
                model = self._active
        self._seen = d
        if m_left <= 0:
            return False
        r = n - d
        if r <= 0:
            return True
        if self._forecast is None or self._forecast.shape[0] < r:
            self._forecast = cost_forecast(
                model.hazard, power_transform(model.kappa, self.power), max(n, r)
            )
        cost = power_inverse(self._forecast[:r] @ self._p, self.power)
        h_min, h_max = self._params.h_min, self._params.h_max
        pace = (n - (d - gap)) / (m_left + 1.0)  # the even-pace gap, for ties
        early = self.early * (float(np.add.reduce(cost)) / r) / h_max  # the mean, as .mean()
        need = 2 * (r + h_max + 1)
        if self._scratch.size < need:
            self._scratch = np.empty(need)
        first = _plan_first()(cost, gap, h_min, h_max, m_left, pace, early, self._scratch)
        return first == 0
