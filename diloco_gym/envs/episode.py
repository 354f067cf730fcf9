"""Episodes: everything about an episode that does not depend on the agent.

An *episode* is precomputed once from a trace (:func:`build_episode`;
:func:`episode_from_seed` from a seed, whose draws come from
:func:`diloco_gym.envs.kernel.episode_draws`; :func:`episode_core_batch` for many traces
at once): the exogenous observation features per decision and the no-merge replay, from
which the cost of a merge launched at any decision follows (computed when asked for).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import NamedTuple

import numpy as np

from diloco_gym.envs.kernel import episode_draws
from diloco_gym.envs.params import EnvParams
from diloco_gym.envs.reward import nominal_rate_rps, reward_per_request
from diloco_gym.sim import compiled_rows
from diloco_gym.sim import learners as lrn
from diloco_gym.sim.sidecar import (
    IsolatedMergeCost,
    ReplayResult,
    SidecarParams,
    merge_costs,
)
from diloco_gym.sim.traces import PRESSURE_DT_S, Trace

__all__ = [
    "Episode",
    "EpisodeCore",
    "decision_costs",
    "min_episode_seconds",
    "episode_length",
    "episode_core",
    "episode_core_batch",
    "CoreSetup",
    "core_setup",
    "pressure_rows",
    "build_episode",
    "episode_from_seed",
]


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
    def baseline_violated(self) -> int:
        """Requests over their SLO in the no-merge replay (every summary of the episode
        subtracts them)."""
        return int(np.count_nonzero(self.baseline.violated))

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

    @cached_property
    def cost_memo(self) -> np.ndarray:
        """``(1, N)`` the isolated costs of merges at each decision computed so far (NaN: not
        yet; the full ``merge_cost`` when it was computed first). :meth:`merge_cost_at` and
        the compiled step (:mod:`diloco_gym.sim.jit_step`) fill it, so a cost is computed once
        per episode, also for several agents run on it and for the summary."""
        full = self.__dict__.get("merge_cost")
        if full is not None:
            return np.array(full, dtype=np.float64)[None]
        return np.full((1, self.n_decisions), np.nan)

    @cached_property
    def cost_source(self) -> tuple:
        """The cost queue of this episode as the compiled step reads it, a bank of one slot:
        ``(s, d, ptr, rbin, base, m0, thr_in, thr_tail, prefmin, m0_bins)`` (``prefmin`` per
        decision; :meth:`~diloco_gym.sim.sidecar.IsolatedMergeCost.rows`)."""
        return self._one_cost.rows(self.params.decision_interval, self.n_decisions)

    def merge_cost_at(self, d: int) -> float:
        """The cost of a merge at decision ``d`` (equal to ``merge_cost[d]``)."""
        full = self.__dict__.get("merge_cost")
        if full is not None:
            return float(full[d])
        memo = self.cost_memo[0]  # the summary asks again at the end
        c = memo[d]
        if c != c:
            c = memo[d] = self._one_cost.cost_at(d * self.params.decision_interval)
        return float(c)

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


class CoreSetup(NamedTuple):
    """What every episode of a trace duration shares in its compiled build: ``n`` decisions,
    ``n_slots`` decision intervals covering the trace, ``n_bins`` step bins, and ``args``,
    the build's per-duration arguments after the pressure arrays (the decision times and
    their pressure samples, the EWMA constants, the sidecar's service and queue constants:
    :func:`diloco_gym.sim.jit_build.episode_core_range`'s ``p_idx`` .. ``slo_s``)."""

    n: int
    n_slots: int
    n_bins: int
    args: tuple


def core_setup(
    duration_s: float, params: EnvParams, sidecar: SidecarParams, name: str = "trace"
) -> CoreSetup:
    """The :class:`CoreSetup` of episodes of ``duration_s`` seconds (``ValueError`` naming
    the trace ``name`` when too short, :func:`episode_length`)."""
    n = episode_length(duration_s, params, sidecar, name)
    dec_s = params.decision_seconds
    n_slots = params.n_decisions(duration_s)
    di = params.decision_interval
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
    sc, fa, fb = sidecar, params.forecast_alpha, params.baseline_alpha
    args = (
        p_idx, t_dec, dec_s, di, fa, fb, _ewma_norm(fa, n_slots), _ewma_norm(fb, n_slots),
        float(sc.serving_capacity_rps), float(params.rate_norm_rps), float(sc.ttft_ms),
        float(sc.prefill_ms_per_token), float(sc.decode_ms_per_token),
        float(sc.pressure_gain), params.step_seconds, sc.slots * params.step_seconds,
        float(sc.slots), float(sc.slo_s),
    )  # fmt: skip
    return CoreSetup(n, n_slots, n_slots * di, args)


def pressure_rows(x: np.ndarray | None, b: int) -> np.ndarray:
    """A batch's ``(b, samples)`` pressure series as the compiled builds read them
    (``(b, 0)`` for none: zero pressure)."""
    return np.zeros((b, 0)) if x is None else np.ascontiguousarray(x, dtype=np.float64)


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
    parallel: bool = False,
) -> EpisodeCore:
    """:func:`episode_core` of several traces of the same duration at once.

    Every operation is elementwise, or runs along the time axis of each episode separately
    (filters, cumulative sums and minima, ``bincount`` over episode-major indices), so each
    episode's arrays are bit for bit those of a batch of one. ``network`` and ``checkpoint``
    are ``(B, samples)`` arrays or ``None`` (zero pressure). With ``counts`` (requests per
    trace), ``arrivals``, ``prompts`` and ``outputs`` are the traces' arrays concatenated.
    ``parallel``: the compiled rule's parallel variant where it pays (the same result).
    """
    setup = core_setup(duration_s, params, sidecar, name)
    n, n_slots, n_bins = setup.n, setup.n_slots, setup.n_bins
    flat = counts is not None
    b = len(counts) if counts is not None else len(arrivals)
    if counts is None:
        counts = np.fromiter((a.size for a in arrivals), dtype=np.int64, count=b)
    offsets = np.zeros(b + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])

    def joined(xs) -> np.ndarray:
        x = xs if flat else xs[0] if b == 1 else np.concatenate(xs)
        return np.ascontiguousarray(x, dtype=np.float64)

    m = int(offsets[-1])
    exo = np.empty((b, n, 7), dtype=np.float32)
    per_bin = [np.empty((b, n_bins)) for _ in range(2)] + [np.empty((b, n_bins + 1)) for _ in "sp"]
    per_req = [np.empty(m), np.empty(m, dtype=np.int64), np.empty(m, dtype=np.int64)]
    latency, violated = np.empty(m), np.empty(m, dtype=bool)
    pressure_dec = np.empty((b, n_slots))
    # One compiled call for the whole batch: features, the no-merge queue and its replay
    # (sidecar.replay with sync_bin=None: the same arithmetic), episode by episode.
    compiled_rows("episode_core_rows", parallel, b, 2)(
        joined(arrivals), joined(prompts), joined(outputs), offsets,
        pressure_rows(network, b), pressure_rows(checkpoint, b), *setup.args, exo,
        pressure_dec, *per_bin, *per_req, latency, violated,
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
