"""Parameters, episodes and the pure per-decision rules of the merge-scheduling problem.

An *episode* is everything that does not depend on the agent, precomputed once from a
trace (:func:`build_episode`; :func:`episode_core_batch` for many traces at once): the
exogenous observation features per decision and the no-merge replay, from which the cost
of a merge launched at any decision follows (computed when asked for). The rules here
(:func:`options`, :func:`learner_features`, :func:`sync_mask`) are plain arithmetic on
scalars or arrays; the step that applies them to the agent-dependent state is
:mod:`diloco_gym.envs.kernel`.

Time: training advances in steps of ``step_seconds``; the agent decides every
``decision_interval`` steps (one *decision* = ``decision_seconds``). The corridor
``[h_min_steps, h_max_steps]`` is expressed in decisions by dividing by the interval.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import cached_property, lru_cache
from typing import Any, NamedTuple

import numpy as np

from diloco_gym.envs.reward import (
    REWARD_NOMINAL_REQUESTS,
    check_reward_mode,
    nominal_rate_rps,
    reward_per_request,
)
from diloco_gym.sim import compiled
from diloco_gym.sim import learners as lrn
from diloco_gym.sim.limits import check_limit
from diloco_gym.sim.regimes import SyntheticRegime
from diloco_gym.sim.schedules import budget_range, completion_counts
from diloco_gym.sim.sidecar import (
    IsolatedMergeCost,
    ReplayResult,
    SidecarParams,
    merge_costs,
    replay,
)
from diloco_gym.sim.traces import PRESSURE_DT_S, Trace

__all__ = [
    "EnvParams",
    "Episode",
    "build_episode",
    "episode_from_seed",
    "episode_draws_batch",
    "synthetic_draws",
    "OBS_FEATURES",
    "OBS_DIM",
    "REWARD_NOMINAL_REQUESTS",
    "nominal_rate_rps",
    "reward_per_request",
    "learner_table",
    "learner_features",
    "learner_features_k",
    "options",
    "sync_mask",
    "replay_schedule",
    "BudgetTables",
]


@dataclass(frozen=True)
class EnvParams:
    """Environment parameters (units in the names; defaults in docs/model.md#clock).

    Attributes:
        step_seconds: wall time of one training (inner) step.
        h_min_steps: a merge may start only when the gap since the last merge is at least
            this many steps (paper: 128).
        h_max_steps: a merge must start when the gap reaches this many steps (paper: 512).
        merge_seconds: how long a merge occupies the host (paper: 8 s); rounded to steps.
        decision_interval: steps between two decisions; must divide both corridor bounds.
        skip_forced: advance through decisions with a single feasible action without
            asking the agent (gap < H_min, gap = H_max, budget-forced).
        merge_budget: if set, every episode has exactly this many merges; the action mask
            keeps the schedule feasible.
        excess_weight: weight of the sync-excess term (reward unit: extra SLO-violating
            requests per :data:`REWARD_NOMINAL_REQUESTS` nominal requests of the regime, a
            scale fixed before the episode starts; see :func:`reward_per_request`).
        progress_weight: weight of the training-progress term (global loss decrease).
        forecast_alpha: EWMA weight of the one-step request-rate forecast, per decision.
        baseline_alpha: EWMA weight of the slow request-rate baseline, per decision.
        rate_norm_rps: scale of the rate features (``r / (r + rate_norm_rps)``).
        loss_clip / tokens_clip / staleness_clip_s: normalisers of the learner features
            (the WA-DiLoCo score's ``clip(x, c)`` constants).
        reward_rate_rps: the nominal request rate of the reward scale; ``None`` (default)
            takes the regime's (:func:`nominal_rate_rps`). Set it to compare rewards across
            replays of different traces on one scale.
        reward_mode: ``"additive"`` (default): each merge's isolated cost, credited at
            launch; ``"exact"``: its marginal cost in the exact replay, credited once its
            backlog has drained (:class:`diloco_gym.envs.reward.ExactCredit`).
    """

    step_seconds: float = 0.14
    h_min_steps: int = 128
    h_max_steps: int = 512
    merge_seconds: float = 8.0
    decision_interval: int = 8
    skip_forced: bool = True
    merge_budget: int | None = None
    excess_weight: float = 1.0
    progress_weight: float = 0.0
    forecast_alpha: float = 0.5
    baseline_alpha: float = 0.02
    rate_norm_rps: float = 8.0
    loss_clip: float = 0.05
    tokens_clip: float = 1.0e6
    staleness_clip_s: float = 1800.0
    reward_rate_rps: float | None = None
    reward_mode: str = "additive"

    def __post_init__(self) -> None:  # noqa: C901 - one check per parameter, in sequence
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "reward_mode":
                check_reward_mode(v)
                continue
            if f.name == "reward_rate_rps":
                if v is not None and (
                    not isinstance(v, (int, float, np.integer, np.floating))
                    or isinstance(v, bool)
                    or not np.isfinite(v)
                    or v <= 0
                ):
                    raise ValueError(
                        f"EnvParams.reward_rate_rps must be None or a finite number > 0, got {v!r}"
                    )
                continue
            if f.name == "merge_budget":
                if v is not None and (
                    not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0
                ):
                    raise ValueError(
                        f"EnvParams.merge_budget must be None or an int >= 0, got {v!r}"
                    )
                continue
            if f.name == "skip_forced":
                if not isinstance(v, (bool, np.bool_)):
                    raise ValueError(f"EnvParams.skip_forced must be a bool, got {v!r}")
                continue
            if f.type in ("int", int):
                if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                    raise ValueError(f"EnvParams.{f.name} must be an int >= 1, got {v!r}")
            elif not isinstance(v, (int, float)) or isinstance(v, bool) or not np.isfinite(v):
                raise ValueError(f"EnvParams.{f.name} must be a finite number, got {v!r}")
        for name in (
            "step_seconds",
            "merge_seconds",
            "rate_norm_rps",
            "loss_clip",
            "tokens_clip",
            "staleness_clip_s",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"EnvParams.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("excess_weight", "progress_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"EnvParams.{name} must be >= 0, got {getattr(self, name)!r}")
        for name in ("forecast_alpha", "baseline_alpha"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"EnvParams.{name} must be in (0, 1], got {getattr(self, name)!r}")
        if self.h_min_steps > self.h_max_steps:
            raise ValueError(
                f"EnvParams: h_min_steps ({self.h_min_steps}) must not exceed "
                f"h_max_steps ({self.h_max_steps})"
            )
        for name in ("h_min_steps", "h_max_steps"):
            if getattr(self, name) % self.decision_interval:
                raise ValueError(
                    f"EnvParams.{name} ({getattr(self, name)}) must be a multiple "
                    f"of decision_interval ({self.decision_interval})"
                )
        check_limit("H_MAX_DECISIONS", self.h_max, "EnvParams.h_max_steps / decision_interval")
        if self.merge_budget is not None:
            check_limit("MERGE_BUDGET", self.merge_budget, "EnvParams.merge_budget")
        if self.merge_steps > self.h_min_steps:
            raise ValueError(
                f"EnvParams.merge_seconds: a merge ({self.merge_seconds} s = "
                f"{self.merge_steps} steps) must fit inside h_min_steps "
                f"({self.h_min_steps}) so that merges never overlap"
            )

    @cached_property  # derived, never a second default; cached for the hot path
    def decision_seconds(self) -> float:
        return self.step_seconds * self.decision_interval

    @cached_property
    def h_min(self) -> int:
        """H_min in decisions."""
        return self.h_min_steps // self.decision_interval

    @cached_property
    def h_max(self) -> int:
        """H_max in decisions."""
        return self.h_max_steps // self.decision_interval

    @cached_property
    def merge_steps(self) -> int:
        """Merge window in steps (``merge_seconds`` rounded to the step grid, at least 1)."""
        return max(1, int(round(self.merge_seconds / self.step_seconds)))

    def n_decisions(self, duration_s: float) -> int:
        """Decisions in an episode covering ``duration_s`` (the last may run past the end)."""
        return int(np.ceil(duration_s / self.decision_seconds - 1e-9))


# (name, unit / transform, low, high, meaning)
OBS_FEATURES: tuple[tuple[str, str, float, float, str], ...] = (
    ("gap", "gap / H_max", 0.0, 1.0, "training steps since the last merge"),
    ("corridor_open", "0/1", 0.0, 1.0, "1 when gap >= H_min, so a merge is allowed"),
    (
        "loss_progress_mean",
        "clip(loss_delta / loss_clip)",
        0.0,
        1.0,
        "mean over learners of the loss reduction since the last merge",
    ),
    ("loss_progress_min", "clip(loss_delta / loss_clip)", 0.0, 1.0, "the same, slowest learner"),
    (
        "tokens_mean",
        "clip(tokens / tokens_clip)",
        0.0,
        1.0,
        "mean tokens per learner since the last merge",
    ),
    ("tokens_min", "clip(tokens / tokens_clip)", 0.0, 1.0, "the same, slowest learner"),
    ("staleness", "clip(seconds / staleness_clip_s)", 0.0, 1.0, "seconds since the last merge"),
    ("network", "[0, 1]", 0.0, 1.0, "network pressure now"),
    (
        "serving",
        "[0, 1]",
        0.0,
        1.0,
        "serving pressure: rate forecast / serving_capacity_rps, capped at 1",
    ),
    ("checkpoint", "[0, 1]", 0.0, 1.0, "checkpoint-I/O pressure now"),
    (
        "rate_now",
        "r / (r + rate_norm_rps)",
        0.0,
        1.0,
        "request rate over the last decision interval",
    ),
    (
        "rate_forecast",
        "r / (r + rate_norm_rps)",
        0.0,
        1.0,
        "one-step EWMA forecast of the request rate (forecast_alpha)",
    ),
    (
        "rate_baseline",
        "r / (r + rate_norm_rps)",
        0.0,
        1.0,
        "slow EWMA of the request rate (baseline_alpha)",
    ),
    (
        "rate_trend",
        "clip((forecast - baseline) / rate_norm_rps, -1, 1)",
        -1.0,
        1.0,
        "forecast above (+) or below (-) the baseline",
    ),
    ("merges", "merges / (decisions / H_min)", 0.0, 1.0, "merges so far this episode"),
    ("time_left", "fraction", 0.0, 1.0, "fraction of the episode's decisions left"),
    ("budget_left", "fraction", 0.0, 1.0, "merges left / merge_budget (1 when there is no budget)"),
)
OBS_DIM = len(OBS_FEATURES)
OBS_INDEX = {name: i for i, (name, *_) in enumerate(OBS_FEATURES)}
OBS_LOW = np.array([f[2] for f in OBS_FEATURES], dtype=np.float32)
OBS_HIGH = np.array([f[3] for f in OBS_FEATURES], dtype=np.float32)
EXO_SLICE = slice(OBS_INDEX["network"], OBS_INDEX["rate_trend"] + 1)
LEARNER_SLICE = slice(OBS_INDEX["loss_progress_mean"], OBS_INDEX["staleness"] + 1)


def squash_rate(rate_rps, norm_rps: float):
    """``r / (r + norm)``: a bounded, invertible rate feature."""
    return rate_rps / (rate_rps + norm_rps)


def unsquash_rate(x, norm_rps: float):
    """Inverse of :func:`squash_rate` (requests per second)."""
    x = np.minimum(x, 1 - 1e-6)
    return norm_rps * x / (1.0 - x)


@dataclass(frozen=True)
class Episode:
    """Agent-independent data of one episode (all arrays read-only by convention).

    Attributes:
        trace: the sidecar's trace.
        n_decisions: N, decisions in the episode.
        exo: ``(N, 7)`` float32 exogenous features (network .. rate_trend) per decision,
            computed from arrivals strictly before the decision.
        throughputs: ``(K,)`` learner throughputs, ascending.
        base_s / req_bin / pressure_bin: replay inputs (service time per request, its
            step bin, fleet pressure per bin).
        baseline: the no-merge replay (the load match).
        params / sidecar: the parameters the episode was built with.
        seed: the episode seed (``None`` if built from an explicit generator).
        reward_per_request: reward units per extra violating request,
            :func:`reward_per_request` of the regime's nominal rate and the window length:
            fixed before the episode starts, never the episode's own request count.

    ``merge_cost`` (all decisions) is computed on first use; ``merge_cost_at(d)`` costs one
    decision without computing the others (what an env stepping an agent needs).
    """

    trace: Trace
    n_decisions: int
    exo: np.ndarray
    throughputs: np.ndarray
    base_s: np.ndarray
    req_bin: np.ndarray
    pressure_bin: np.ndarray
    baseline: ReplayResult
    params: EnvParams
    sidecar: SidecarParams
    seed: int | None = None
    reward_per_request: float = float("nan")
    #: ``(m0, S, prefmin)`` of the no-merge queue (:class:`EpisodeCore`), reused by the lazy
    #: merge costing; ``None`` recomputes them.
    queue: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(
        default=None, repr=False, compare=False
    )

    @cached_property
    def merge_cost(self) -> np.ndarray:
        """``(N,)`` extra SLO violations (requests) of a merge launched at each decision,
        evaluated in isolation (:func:`~diloco_gym.sim.sidecar.merge_costs`)."""
        cost = decision_costs(
            self.base_s,
            self.req_bin,
            self.pressure_bin,
            self.baseline.violated,
            self.n_decisions,
            self.params,
            self.sidecar,
        )
        cost.setflags(write=False)
        return cost

    @cached_property
    def _one_cost(self) -> IsolatedMergeCost:
        p = self.params
        return IsolatedMergeCost(
            self.base_s,
            self.req_bin,
            self.pressure_bin,
            self.sidecar,
            p.step_seconds,
            p.merge_steps,
            self.baseline.violated,
            queue=self.queue,
        )

    def merge_cost_at(self, d: int) -> float:
        """The cost of a merge at decision ``d`` (equal to ``merge_cost[d]``)."""
        full = self.__dict__.get("merge_cost")
        if full is not None:
            return float(full[d])
        memo = self.__dict__.setdefault("_cost_memo", {})  # the summary asks again at the end
        if d not in memo:
            memo[d] = self._one_cost.cost_at(d * self.params.decision_interval)
        return memo[d]

    @property
    def n_requests(self) -> int:
        return self.trace.num_requests

    @property
    def pct_per_request(self) -> float:
        """Percentage points of sync-excess per violated request (of this episode's requests:
        a score after the episode, never a reward, since the count depends on the future)."""
        return 100.0 / max(1, self.n_requests)


def decision_costs(
    base_s: np.ndarray,
    req_bin: np.ndarray,
    pressure_bin: np.ndarray,
    violated0: np.ndarray,
    n: int,
    params: EnvParams,
    sidecar: SidecarParams,
) -> np.ndarray:
    """The isolated cost of a merge at each of an episode's ``n`` decisions
    (:func:`~diloco_gym.sim.sidecar.merge_costs` at the decision starts)."""
    starts = np.arange(n, dtype=np.int64) * params.decision_interval
    return merge_costs(
        base_s,
        req_bin,
        pressure_bin,
        sidecar,
        params.step_seconds,
        starts,
        params.merge_steps,
        np.asarray(violated0).astype(np.float64),
    )


#: Largest episode seed: seeds are stored as int64 (Gymnasium wants them non-negative).
MAX_SEED = 2**63 - 1


def check_env_sizes(
    params: EnvParams, generator, num_envs: int = 1, what: str = "num_envs"
) -> None:
    """Refuse, before anything is allocated, an env whose episodes would be too large:
    decisions per episode (``DILOCO_GYM_MAX_DECISIONS``), envs (``DILOCO_GYM_MAX_ENVS``)
    and envs x decisions (``DILOCO_GYM_MAX_BATCH_DECISIONS``); see
    :mod:`diloco_gym.sim.limits`. ``generator`` is asked for its ``duration_s`` (the
    episode window); one without it is not checked here. ``what`` names ``num_envs`` in
    the message (a vector env's ``episode_pool`` is checked the same way).

    Raises:
        diloco_gym.sim.limits.LimitError: a size above its limit.
    """
    check_limit("ENVS", num_envs, what)
    duration = getattr(generator, "duration_s", None)
    if not isinstance(duration, (int, float, np.integer, np.floating)):
        return
    duration = float(duration)
    if not np.isfinite(duration):
        raise ValueError(f"the regime's episode window duration_s must be finite, got {duration}")
    n = duration / params.decision_seconds
    check_limit("DECISIONS", n, f"an episode window of {duration:g} s, in decisions")
    check_limit(
        "BATCH_DECISIONS",
        n * num_envs,
        f"{what} {num_envs:,} x {int(n):,} decisions per episode",
    )


def check_seed(seed, what: str = "seed") -> int:
    """``seed`` as an int in ``[0, MAX_SEED]``, or a ``ValueError`` naming ``what``."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"{what} must be an int, got {type(seed).__name__} {seed!r:.60}")
    if not 0 <= int(seed) <= MAX_SEED:
        raise ValueError(f"{what} must be an int in [0, 2**63 - 1], got {int(seed)}")
    return int(seed)


def check_reset_options(options, allowed: tuple[str, ...], owner: str) -> dict:
    """``options`` of ``reset`` as a dict (``{}`` for ``None``); anything but a dict, or a
    key not in ``allowed``, is a ``ValueError`` (an option is never silently ignored)."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ValueError(
            f"{owner}.reset options must be a dict or None, got {type(options).__name__}"
        )
    unknown = sorted(str(k) for k in options if k not in allowed)
    if unknown:
        valid = ", ".join(repr(k) for k in allowed) or "none"
        raise ValueError(
            f"{owner}.reset: unknown option(s) {', '.join(map(repr, unknown))}; valid options: "
            f"{valid} (environment parameters such as merge_budget are set when the env is made)"
        )
    return options


@lru_cache(maxsize=64)
def _ewma_norm(alpha: float, n: int) -> np.ndarray:
    """``1 - (1 - alpha)**d`` for ``d < n`` (the same for every episode of a length)."""
    corr = 1.0 - (1.0 - alpha) ** np.arange(n)
    corr.setflags(write=False)
    return corr


class EpisodeCore(NamedTuple):
    """The agent-independent arrays of an episode, as :func:`episode_core` computes them.

    ``m0``, ``s`` and ``prefmin`` are the no-merge queue of :mod:`diloco_gym.sim.sidecar`
    (slowdown per bin, running sum of work minus capacity, and its running minimum), from
    which both the no-merge replay (``latency``, ``violated``) and the isolated merge costs
    follow. From :func:`episode_core_batch` every per-decision and per-bin array has a
    leading batch axis and the per-request arrays are the episodes' requests concatenated
    (``counts`` per episode, ``flat_bin`` = episode * bins + bin).
    """

    n: int
    exo: np.ndarray
    pressure_dec: np.ndarray
    base_s: np.ndarray
    req_bin: np.ndarray
    pressure_bin: np.ndarray
    m0: np.ndarray
    s: np.ndarray
    prefmin: np.ndarray
    latency: np.ndarray
    violated: np.ndarray
    counts: np.ndarray | None = None
    flat_bin: np.ndarray | None = None


def min_episode_seconds(params: EnvParams, sidecar: SidecarParams) -> float:
    """The shortest trace window that holds an episode: more than H_min steps of decisions
    plus the margin that charges the last merge in full (its window and the sidecar's tail)."""
    margin_s = params.merge_steps * params.step_seconds + sidecar.tail_s
    return margin_s + (params.h_min + 1) * params.decision_seconds


def episode_length(
    duration_s: float, params: EnvParams, sidecar: SidecarParams, name: str = "trace"
) -> int:
    """Decisions in an episode of a ``duration_s`` trace (see :func:`episode_core`)."""
    n_slots = params.n_decisions(duration_s)  # decision intervals covering the trace
    margin_s = params.merge_steps * params.step_seconds + sidecar.tail_s
    n = min(n_slots, int(np.floor((duration_s - margin_s) / params.decision_seconds + 1e-9)))
    if n < params.h_min + 1:
        min_s = min_episode_seconds(params, sidecar)
        raise ValueError(
            f"trace {name!r} of {duration_s:.1f} s is too short: an episode "
            f"needs at least {min_s:.1f} s (more than H_min = "
            f"{params.h_min_steps} steps of decisions plus a {margin_s:.1f} s "
            f"margin for the last merge)"
        )
    return n


def episode_core(
    arrival_s: np.ndarray,
    prompt_tokens: np.ndarray,
    output_tokens: np.ndarray,
    network: np.ndarray | None,
    checkpoint: np.ndarray | None,
    duration_s: float,
    params: EnvParams,
    sidecar: SidecarParams,
    name: str = "trace",
) -> EpisodeCore:
    """Everything about an episode that does not depend on the agent, from a trace's arrays
    (``arrival_s`` sorted, as in a :class:`~diloco_gym.sim.traces.Trace`).

    Decisions stop ``merge_seconds + sidecar.tail_s`` before the trace ends, so that every
    merge's window and backlog lie inside the trace: a merge near the end is charged in
    full, not cheaper because its window runs off the recorded requests.

    This is :func:`episode_core_batch` on a batch of one (one code path for the single and
    the vector env).
    """
    c = episode_core_batch(
        [arrival_s],
        [prompt_tokens],
        [output_tokens],
        None if network is None else network[None, :],
        None if checkpoint is None else checkpoint[None, :],
        duration_s,
        params,
        sidecar,
        name,
    )
    return EpisodeCore(
        c.n,
        c.exo[0],
        c.pressure_dec[0],
        c.base_s,
        c.req_bin,
        c.pressure_bin[0],
        c.m0[0],
        c.s[0],
        c.prefmin[0],
        c.latency,
        c.violated,
    )


def episode_core_batch(
    arrivals: list[np.ndarray],
    prompts: list[np.ndarray],
    outputs: list[np.ndarray],
    network: np.ndarray | None,
    checkpoint: np.ndarray | None,
    duration_s: float,
    params: EnvParams,
    sidecar: SidecarParams,
    name: str = "trace",
    counts: np.ndarray | None = None,
) -> EpisodeCore:
    """:func:`episode_core` of several traces of the same duration at once.

    Every operation is elementwise, or runs along the time axis of each episode separately
    (filters, cumulative sums and minima, ``bincount`` over episode-major indices), so each
    episode's arrays are bit for bit those of a batch of one. ``network`` and ``checkpoint``
    are ``(B, samples)`` arrays or ``None`` (zero pressure). With ``counts`` (requests per
    trace), ``arrivals``, ``prompts`` and ``outputs`` are the traces' arrays concatenated.
    """
    n = episode_length(duration_s, params, sidecar, name)
    flat = counts is not None
    b = len(counts) if counts is not None else len(arrivals)
    dec_s = params.decision_seconds
    n_slots = params.n_decisions(duration_s)
    di = params.decision_interval
    n_bins = n_slots * di
    # Decision d is at t_dec[d]; interval d is [t_dec[d], t_dec[d + 1]), and the rate seen at
    # decision d is the count of interval d-1: arrivals strictly before t_dec[d] and at or
    # after t_dec[d - 1]. Counting against t_dec itself keeps that boundary exact
    # (floor(arrival / dec_s) could round an arrival at a decision time into the interval
    # before it: a look-ahead).
    t_dec = np.arange(n_slots) * dec_s
    p_idx = np.minimum(
        (t_dec / PRESSURE_DT_S).astype(np.int64),
        int(np.ceil(duration_s / PRESSURE_DT_S - 1e-9)) - 1,
    )
    if counts is None:
        counts = np.fromiter((a.size for a in arrivals), dtype=np.int64, count=b)
    offsets = np.zeros(b + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])

    def joined(xs) -> np.ndarray:
        x = xs if flat else xs[0] if b == 1 else np.concatenate(xs)
        return np.ascontiguousarray(x, dtype=np.float64)

    def pressure(x: np.ndarray | None) -> np.ndarray:
        return np.zeros((b, 0)) if x is None else np.ascontiguousarray(x, dtype=np.float64)

    m = int(offsets[-1])
    exo = np.empty((b, n, 7), dtype=np.float32)
    per_bin = [np.empty((b, n_bins)) for _ in range(2)] + [np.empty((b, n_bins + 1)) for _ in "sp"]
    per_req = [np.empty(m), np.empty(m, dtype=np.int64), np.empty(m, dtype=np.int64)]
    latency, violated = np.empty(m), np.empty(m, dtype=bool)
    pressure_dec = np.empty((b, n_slots))
    sc, fa, fb = sidecar, params.forecast_alpha, params.baseline_alpha
    # One compiled call for the whole batch: features, the no-merge queue and its replay
    # (sidecar.replay with sync_bin=None: the same arithmetic), episode by episode.
    compiled().episode_core_rows(
        joined(arrivals), joined(prompts), joined(outputs), offsets, pressure(network),
        pressure(checkpoint), p_idx, t_dec, dec_s, di, fa, fb, _ewma_norm(fa, n_slots),
        _ewma_norm(fb, n_slots), float(sc.serving_capacity_rps), float(params.rate_norm_rps),
        float(sc.ttft_ms), float(sc.prefill_ms_per_token), float(sc.decode_ms_per_token),
        float(sc.pressure_gain), params.step_seconds, sc.slots * params.step_seconds,
        float(sc.slots), float(sc.slo_s), exo, pressure_dec, *per_bin, *per_req, latency,
        violated,
    )  # fmt: skip
    pressure_bin, m0, s, prefmin = per_bin
    base_s, req_bin, flat_bin = per_req
    return EpisodeCore(
        n, exo, pressure_dec, base_s, req_bin, pressure_bin, m0, s, prefmin, latency, violated,
        counts, flat_bin,
    )  # fmt: skip


def build_episode(
    trace: Trace,
    params: EnvParams,
    sidecar: SidecarParams,
    learner_params: lrn.LearnerParams,
    rng: np.random.Generator,
    seed: int | None = None,
    rate_rps: float | None = None,
) -> Episode:
    """Precompute everything about an episode that does not depend on the agent
    (:func:`episode_core`), then draw the learner throughputs from ``rng``.

    ``rate_rps`` is the nominal rate of the reward scale (:func:`nominal_rate_rps` of the
    regime); ``None`` treats ``trace`` as a regime of its own (``params.reward_rate_rps``,
    else the trace's mean rate). Merge costs are computed lazily (``Episode.merge_cost`` /
    ``merge_cost_at``).
    """
    if rate_rps is None:
        rate_rps = (
            params.reward_rate_rps if params.reward_rate_rps is not None else trace.mean_rate_rps
        )
    return _episode(trace, learner_params.draw_throughputs(rng), params, sidecar, seed, rate_rps)


def _episode(
    trace: Trace,
    throughputs: np.ndarray,
    params: EnvParams,
    sidecar: SidecarParams,
    seed: int | None,
    rate_rps: float,
) -> Episode:
    """The :class:`Episode` of ``trace`` with learner ``throughputs`` (already drawn)."""
    c = episode_core(
        trace.arrival_s,
        trace.prompt_tokens,
        trace.output_tokens,
        trace.network,
        trace.checkpoint,
        trace.duration_s,
        params,
        sidecar,
        trace.name,
    )
    baseline = ReplayResult(
        c.latency, c.violated, np.zeros(c.req_bin.size, dtype=bool), c.pressure_bin[c.req_bin]
    )
    return Episode(
        trace,
        c.n,
        c.exo,
        throughputs,
        c.base_s,
        c.req_bin,
        c.pressure_bin,
        baseline,
        params,
        sidecar,
        seed,
        reward_per_request(rate_rps, trace.duration_s),
        (c.m0, c.s, c.prefmin),
    )


def episode_draws(
    generator: Any, seed: int, learner_params: lrn.LearnerParams, as_trace: bool = True
) -> tuple:
    """The draws of the episode of ``seed``, in their fixed order.

    One generator, ``np.random.default_rng(seed)``, draws first the trace
    (``generator(rng)``) and then the learner throughputs
    (``learner_params.draw_throughputs``). Every episode of either env comes from here, so
    the single and the vector env give the same episode for the same seed.

    Returns:
        ``(trace, throughputs)``; with ``as_trace=False`` the trace's arrays instead,
        ``(arrivals, prompt, output, network, checkpoint, duration_s, name, throughputs)``
        (:func:`episode_draws_batch` of one seed).
    """
    if as_trace:
        rng = np.random.default_rng(seed)
        trace = generator(rng)
        return trace, learner_params.draw_throughputs(rng)
    return episode_draws_batch(generator, [seed], learner_params)[0]


def is_synthetic(generator: Any) -> bool:
    """Whether ``generator`` draws its traces as :class:`SyntheticRegime` does."""
    cls = SyntheticRegime
    return isinstance(generator, cls) and type(generator).__call__ is cls.__call__


def synthetic_draws(
    generator: SyntheticRegime, seeds: list[int], learner_params: lrn.LearnerParams
) -> tuple:
    """The episodes of ``seeds`` of a synthetic regime as its traces' arrays concatenated:
    ``(arrivals, prompt, output, counts, pressure, throughputs)`` (``SyntheticRegime.draw_raw``
    and the learner throughputs from each seed's generator, then one ``from_raw``)."""
    raws, thrs = [], []
    for seed in seeds:
        rng = np.random.default_rng(seed)
        raws.append(generator.draw_raw(rng))
        thrs.append(learner_params.draw_throughputs(rng))
    return generator.from_raw(raws, np.float64) + (np.stack(thrs),)


def episode_draws_batch(
    generator: Any, seeds: list[int], learner_params: lrn.LearnerParams
) -> list[tuple]:
    """:func:`episode_draws` (``as_trace=False``) of each of ``seeds``: the same draws, and
    for a :class:`~diloco_gym.sim.regimes.SyntheticRegime` the traces' arrays made from
    them in one compiled call (``SyntheticRegime.from_raw``; no
    :class:`~diloco_gym.sim.traces.Trace` is built)."""
    if not is_synthetic(generator):
        out = []
        for seed in seeds:
            rng = np.random.default_rng(seed)
            tr = generator(rng)
            thr = learner_params.draw_throughputs(rng)
            out.append(
                (tr.arrival_s, tr.prompt_tokens, tr.output_tokens, tr.network, tr.checkpoint)
                + (tr.duration_s, tr.name, thr)
            )
        return out
    arrivals, prompt, output, counts, pressure, thrs = synthetic_draws(
        generator, seeds, learner_params
    )
    ends, gen = np.cumsum(counts), generator
    return [
        (arrivals[lo:hi], prompt[lo:hi], output[lo:hi], pressure[e, 0], pressure[e, 1])
        + (gen.duration_s, gen.name, thrs[e])
        for e, (lo, hi) in enumerate(zip((ends - counts).tolist(), ends.tolist(), strict=True))
    ]


def episode_from_seed(
    generator,
    seed: int,
    params: EnvParams,
    sidecar: SidecarParams,
    learner_params: lrn.LearnerParams,
    rate_rps: float | None = None,
) -> Episode:
    """The episode of ``seed``: its trace and learner throughputs from one generator.

    The draws come from :func:`episode_draws` (the trace, then the
    learner throughputs, from ``np.random.default_rng(seed)``), as the vector env's, so the
    single and the vector env give the same episode for the same seed. ``rate_rps``: the
    reward scale's nominal rate (default: the generator's, :func:`nominal_rate_rps`).
    """
    if rate_rps is None:
        rate_rps = nominal_rate_rps(generator, params)
    trace, throughputs = episode_draws(generator, seed, learner_params)
    return _episode(trace, throughputs, params, sidecar, seed, rate_rps)


def learner_features(
    gap_s, global_tokens, throughputs: np.ndarray, params: EnvParams, lp: lrn.LearnerParams
) -> np.ndarray:
    """The learner block of the observation (``LEARNER_SLICE``) after ``gap_s`` seconds.

    Shared by :func:`learner_table` (the single env: every gap at once) and the vector env
    (one gap per env), so both compute the features with the same arithmetic.

    Args:
        gap_s: seconds since the last merge, any shape ``S`` (broadcast with the tokens).
        global_tokens: tokens in the global model, broadcastable to ``S``.
        throughputs: ``(..., K)`` tokens per second, ascending along the last axis and
            broadcastable to ``S + (K,)``.

    Returns:
        float32 ``S + (5,)``: mean and min loss progress, mean and min tokens, staleness.
    """
    gap = np.asarray(gap_s, dtype=np.float64)
    tok = np.asarray(global_tokens, dtype=np.float64)
    thr = np.asarray(throughputs, dtype=np.float64)
    k = thr.shape[-1]
    shape = np.broadcast_shapes(gap.shape, tok.shape, thr.shape[:-1])
    # Learners on the first axis, so that the means over learners are whole-array adds.
    lead = (1,) * (len(shape) - (thr.ndim - 1))
    thr_k = np.moveaxis(thr, -1, 0).reshape((k,) + lead + thr.shape[:-1])
    return learner_features_k(gap, tok, thr_k, params, lp)


def learner_features_k(
    gap_s: np.ndarray,
    global_tokens: np.ndarray,
    throughputs_k: np.ndarray,
    params: EnvParams,
    lp: lrn.LearnerParams,
) -> np.ndarray:
    """:func:`learner_features` with the throughputs learners-first, ``(K, ...)``
    broadcastable to ``(K,) + S``: the compiled rule
    :func:`diloco_gym.sim.jit.learner_block` on the broadcast rows."""
    jit = compiled()
    gap = np.asarray(gap_s, dtype=np.float64)
    tok = np.asarray(global_tokens, dtype=np.float64)
    k = throughputs_k.shape[0]
    shape = np.broadcast_shapes(gap.shape, tok.shape, throughputs_k.shape[1:])
    thr = np.moveaxis(np.broadcast_to(throughputs_k, (k,) + shape), 0, -1).reshape(-1, k)
    out = np.empty(shape + (5,), dtype=np.float32)  # float64 -> float32 on store
    jit.learner_block(
        np.broadcast_to(gap, shape).reshape(-1),
        np.broadcast_to(tok, shape).reshape(-1),
        np.ascontiguousarray(thr, dtype=np.float64),
        lp.loss_floor,
        lp.loss_scale,
        lp.tokens_scale,
        lp.loss_exponent,
        params.loss_clip,
        params.tokens_clip,
        params.staleness_clip_s,
        out.reshape(-1, 5),
    )
    return out


def learner_table(
    global_tokens, throughputs: np.ndarray, params: EnvParams, lp: lrn.LearnerParams
) -> np.ndarray:
    """Learner features for every gap ``0..H_max`` decisions, given the global tokens.

    Returns:
        float32 ``(H_max + 1, 5)`` (or ``(B, H_max + 1, 5)`` for batched inputs): mean and
        min loss progress, mean and min tokens, staleness — the ``LEARNER_SLICE`` block.
    """
    gaps_s = np.arange(params.h_max + 1) * params.decision_seconds
    tok = np.asarray(global_tokens, dtype=np.float64)
    batched = tok.ndim == 1
    g = gaps_s[None, :] if batched else gaps_s
    tk = tok[:, None] if batched else tok
    thr = throughputs[:, None, :] if batched else throughputs
    return learner_features(g, tk, thr, params, lp)


class BudgetTables:
    """Feasibility tables for an exact merge budget (shared by every episode of length N).

    ``reach[m, d]``: after a merge at ``d`` with ``m`` merges still to place, a feasible
    completion exists. ``prefix[m, x]``: how many ``d < x`` have ``reach[m, d]``.
    """

    def __init__(self, n: int, h_min: int, h_max: int, budget: int) -> None:
        lo, hi = budget_range(n, h_min, h_max)  # closed form: refuse before allocating
        f = completion_counts(n, h_min, h_max, budget) if lo <= budget <= hi else None
        if f is None or f[budget, 0] <= 0:
            raise ValueError(
                f"merge_budget={budget} is infeasible for an episode of {n} "
                f"decisions (H_min={h_min}, H_max={h_max} decisions); feasible "
                f"budgets: {lo}..{hi}"
            )
        self.n, self.h_min, self.h_max, self.budget = n, h_min, h_max, budget
        self.reach = f > 0
        self.prefix = np.zeros((budget + 1, n + 1), dtype=np.int64)
        np.cumsum(self.reach, axis=1, out=self.prefix[:, 1:])


def options(d, last, m_left, params: EnvParams, n: int, budget: BudgetTables | None):
    """``(can_merge, can_defer)`` at decision ``d`` (scalars or arrays alike).

    Without a budget: merge iff ``gap >= H_min``; defer iff ``gap < H_max``. With a budget,
    additionally a merge must leave a feasible completion and a deferral must leave a
    feasible next merge (or, with no merges left, the tail must already be safe).
    """
    gap = d - last
    can_merge = gap >= params.h_min
    can_defer = gap < params.h_max
    if budget is None:
        return can_merge, can_defer
    m1 = np.maximum(m_left - 1, 0)
    dd = np.minimum(d, n - 1)
    can_merge = can_merge & (m_left > 0) & budget.reach[m1, dd]
    lo = np.maximum(d + 1, last + params.h_min)
    hi = np.minimum(last + params.h_max, n - 1)
    lo_c = np.minimum(lo, n)
    hi_c = np.clip(hi + 1, 0, n)
    later = (budget.prefix[m1, np.maximum(hi_c, lo_c)] - budget.prefix[m1, lo_c]) > 0
    tail_safe = budget.reach[0, np.minimum(last, n - 1)]
    can_defer = can_defer & np.where(m_left > 0, later, tail_safe)
    return can_merge, can_defer


def sync_mask(merges, n_bins: int, params: EnvParams, widths=None, levels=None) -> np.ndarray:
    """Per-bin 0/1 mask of the merge windows of a schedule (decision indices).

    A ``(K, M)`` array of schedules gives a ``(K, n_bins)`` mask, one row per schedule.
    ``widths`` (steps) and ``levels`` (the mask's value) per merge, for one schedule: windows
    that differ per merge (a fleet's per-sync precision); where two windows overlap the
    larger level holds.
    """
    starts = np.asarray(merges, dtype=np.int64) * params.decision_interval
    if widths is not None or levels is not None:
        w_ = np.full(starts.size, params.merge_steps) if widths is None else np.asarray(widths)
        lv = np.ones(starts.size) if levels is None else np.asarray(levels, dtype=np.float64)
        if starts.ndim != 1 or w_.shape != starts.shape or lv.shape != starts.shape:
            raise ValueError("widths and levels need one schedule and one value per merge")
        if starts.size and (starts.min() < 0 or w_.min() < 1):
            raise ValueError("merge starts must be >= 0 and widths >= 1")
        out = np.zeros(n_bins + int(w_.max(initial=0)))
        for a, wk, level in zip(starts.tolist(), w_.tolist(), lv.tolist(), strict=True):
            seg = out[a : a + wk]
            np.maximum(seg, level, out=seg)
        return out[:n_bins]
    w = params.merge_steps
    width = n_bins + w
    if starts.ndim > 1:
        rows = starts.reshape(-1, starts.shape[-1])
        if rows.size and (rows.min() < 0 or rows.max() + w > width):
            # out-of-range starts: each row as a schedule of its own (np.add.at below)
            out = np.stack([sync_mask(r, n_bins, params) for r in rows // params.decision_interval])
            return out.reshape(starts.shape[:-1] + (n_bins,))
        mask = np.zeros((rows.shape[0], width), dtype=np.float64)
        if rows.size:
            at = rows + (np.arange(rows.shape[0]) * width)[:, None]
            mask.reshape(-1)[(at[..., None] + np.arange(w)).ravel()] = 1.0
        return mask[:, :n_bins].reshape(starts.shape[:-1] + (n_bins,))
    mask = np.zeros(width, dtype=np.float64)
    if starts.size:
        # 1 on each window (a count of overlapping windows would be capped at 1 anyway).
        if starts.min() >= 0 and starts.max() + w <= mask.size:
            mask[(starts[:, None] + np.arange(w)).ravel()] = 1.0
        else:  # out-of-range starts: np.add.at's indexing (and its IndexError), as before
            delta = np.zeros(mask.size + 1)
            np.add.at(delta, starts, 1.0)
            np.add.at(delta, starts + w, -1.0)
            mask = np.cumsum(delta)[:-1]
    return np.minimum(mask[:n_bins], 1.0)


def replay_schedule(
    episode: Episode, merges, params: EnvParams, sidecar: SidecarParams, per_sync=None
) -> ReplayResult:
    """Exact replay of the episode's requests with the merge windows of ``merges``.

    ``per_sync``: one :class:`Episode` per merge (the same requests, built with that sync's
    window and slowdown: a fleet's per-sync precision), whose ``params.merge_steps`` is the
    merge's window and ``sidecar.sync_slowdown`` its slowdown; ``None``: every merge as
    ``params`` and ``sidecar`` say.
    """
    n_bins = episode.pressure_bin.size
    if per_sync is None:
        mask = sync_mask(merges, n_bins, params)
    else:
        if len(per_sync) != len(merges):
            raise ValueError(f"per_sync has {len(per_sync)} episodes for {len(merges)} merges")
        mask = sync_mask(
            merges,
            n_bins,
            params,
            widths=[e.params.merge_steps for e in per_sync],
            levels=[e.sidecar.sync_slowdown for e in per_sync],
        )
        sidecar = replace(sidecar, sync_slowdown=1.0)  # the mask carries each slowdown
    return replay(
        episode.base_s, episode.req_bin, episode.pressure_bin, mask, sidecar, params.step_seconds
    )


def schedule_summary(
    episode: Episode, merges, params: EnvParams, sidecar: SidecarParams, per_sync=None
) -> dict:
    """Replay summary of a realised schedule, with its exact and additive sync-excess
    (``per_sync``: as :func:`replay_schedule`; each merge's additive cost is then its own
    episode's)."""
    res = replay_schedule(episode, merges, params, sidecar, per_sync)
    out = res.summary()
    base = episode.baseline.summary()
    out["merges"] = int(len(merges))
    out["no_sync_violation_pct"] = base["violation_pct"]
    out["sync_excess_pct"] = out["violation_pct"] - base["violation_pct"]
    out["sync_excess_requests"] = out["violated"] - base["violated"]
    eps = [episode] * len(merges) if per_sync is None else per_sync
    additive = sum(e.merge_cost_at(int(d)) for e, d in zip(eps, merges, strict=True))
    out["additive_excess_requests"] = float(additive)
    out["additive_excess_pct"] = float(additive * episode.pct_per_request)
    return out
