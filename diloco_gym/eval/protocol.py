"""The calibration protocol (docs/protocol.md): load match, matched-random envelope,
statistics, gate.

For each regime and agent, over N episodes (seeds):

1. **No-sync load match**: the same trace replayed without merges; sync-excess is
   measured against it.
2. **Effect-size transfer**: the simulator's effect sizes vs the real sidecar's
   (:mod:`diloco_gym.eval.calibration`) give the regime's verdict.
3. **Matched-random envelope**: K schedules drawn uniformly among all feasible schedules
   with exactly the agent's number of merges in that episode (same trace), each replayed
   exactly; the envelope is the distribution of their sync-excess.
4. **Gate**: a paired test over episodes of the agent's sync-excess against its envelope
   mean (exact sign-flip test for up to 20 episodes, a 100,000-flip Monte Carlo test
   above), a bootstrap CI of the mean difference, and the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import gymnasium as gym
import numpy as np

from diloco_gym.envs import core
from diloco_gym.envs.env import Action, Observation
from diloco_gym.sim.schedules import (
    CompletionTable,
    completion_table,
    optimal_schedule,
    sample_uniform,
)
from diloco_gym.sim.sidecar import (
    SidecarParams,
    cost_horizon,
    cost_queue,
    merge_window,
    no_merge_queue,
    padded,
    replay,
)

if TYPE_CHECKING:
    from diloco_gym.envs.env import DiLoCoSyncEnv

__all__ = [
    "MatchedRandomDeferral",
    "EpisodeScorer",
    "Scores",
    "envelope",
    "replay_many",
    "replay_full",
    "oracle_score",
    "oracle_excess",
    "paired_test",
    "gate_verdict",
    "min_achievable_p",
    "units_needed",
    "nonzero_units",
    "ZERO_TOL",
    "ALPHA",
    "VERDICTS",
    "SATURATION_PCT",
    "N_FLIP",
]

ALPHA = 0.05
#: Random sign patterns of the Monte Carlo test (more than 20 units).
N_FLIP = 100_000
#: Largest exact test: up to this many units every sign pattern is counted.
EXACT_MAX_N = 20
#: A paired difference no larger than this (pp) is zero: flipping its sign changes no
#: statistic by more than the sign-flip test's rounding tolerance, so it carries no evidence.
ZERO_TOL = 1e-12
#: No-merge SLO violation rate (% of requests) above which a replay is *saturated* and the
#: gate makes no claim. Above 50 % the median request already misses its SLO before any
#: merge: the sidecar is overloaded (its backlog grows through the window), a merge can only
#: move requests between "late" and "later", and sync-excess is squeezed against the
#: ceiling of the requests left to violate. Sync-excess then says nothing about whether a
#: scheduler protects a service that meets its SLO. The threshold is a property of the
#: service (its typical request fails), not of any agent's numbers. The synthetic
#: pressure-heavy regime (39.6 % with no merges) is below it: it stays judged by its
#: calibration (no measurable SLO effect), not called saturated.
SATURATION_PCT = 50.0
VERDICTS = (
    "placement gain",
    "tied with matched random",
    "worse than matched random",
    "inconclusive (too few episodes)",
    "no claim (saturated)",
    "no claim (uncalibrated)",
    "no claim (calibration uncertain)",
    "no claim (no SLO effect)",
)


#: Largest replay grid (windows x bins) the scorer holds at once (~16 MiB per array).
_GRID_MAX = 1 << 21


class Scores(NamedTuple):
    """Sync-excess of a batch of schedules on one episode.

    Attributes:
        exact_pct: the exact replay's sync-excess (pp), one per schedule.
        additive_pct: the sum of the merges' isolated costs (``episode.merge_cost``), pp.
        replayed: the schedule had a merge that started before the previous merge's backlog
            had drained (or whose own backlog outlived its isolated cost window), so it was
            replayed through the queue over those windows.
    """

    exact_pct: np.ndarray
    additive_pct: np.ndarray
    replayed: np.ndarray


class EpisodeScorer:
    """Exact sync-excess of many schedules on one episode, computed only where merges act.

    A merge changes the queue only from its start until its backlog re-joins the no-merge
    backlog (the *drain* point: the first bin after its window where the two backlogs are
    equal, which, with a real slowdown, is where the queue with the merge empties). Before
    the first merge and after a drain the replay equals the no-merge replay, so a
    schedule's exact sync-excess is a sum over its merges of the extra violations between
    each merge's start and its drain (or the next merge's start, whichever is first; the
    queue state is then carried into the next merge's window).

    Per decision the scorer precomputes, for a merge started from the no-merge state, its
    drain bin and its exact extra violations up to the drain (``iso_excess``; the same
    arithmetic as :class:`~diloco_gym.sim.sidecar.IsolatedMergeCost`). A merge of a schedule
    that starts from the no-merge state and drains before the next merge contributes
    exactly ``iso_excess``; any other merge is replayed over its window from the carried
    state. Nothing is assumed: the additive cost (``episode.merge_cost``) is compared with
    the exact sum per schedule.

    Violations are decided as in the isolated cost (backlog against the request's
    threshold), so the scorer is bitwise consistent with ``episode.merge_cost``; a
    whole-episode replay (:func:`replay_full`, the env's episode summary) decides them
    from the latency and rounds differently, so the two can differ by a request whose
    latency is within rounding (~1e-15 s) of the SLO (measured: one request in each of 2 of
    the default report's 800 agent-episodes).

    ``episode_proven``: every decision's isolated merge drains within ``H_min`` and its
    exact excess equals its isolated cost, so *every* feasible schedule of the episode has
    exact == additive sync-excess (each merge starts from the no-merge state); then the
    additive optimum is the exact optimum.
    """

    def __init__(
        self, episode: core.Episode, params: core.EnvParams, sidecar: SidecarParams
    ) -> None:
        p, sc = params, sidecar
        self.episode, self.params, self.sidecar = episode, params, sidecar
        self.interval = p.decision_interval
        self.w = p.merge_steps
        self.n_bins = n_bins = episode.pressure_bin.size
        self.pct = episode.pct_per_request
        self.cost = np.asarray(episode.merge_cost, dtype=np.float64)
        m0, s, prefmin = episode.queue or no_merge_queue(
            episode.base_s, episode.req_bin, episode.pressure_bin, sc, p.step_seconds
        )
        # Windows of one block share a length (the longest), so one starting near the end
        # reads up to n_bins past it (padding: index clipping; masked out after its length).
        size = 2 * (n_bins + 1) + self.w
        self._q = cost_queue(
            episode.base_s,
            episode.req_bin,
            episode.baseline.violated,
            m0[None, :],
            s[None, :],
            sc,
            p.step_seconds,
            size,
        )
        self._prefmin = padded(prefmin, size)
        self._base_bl = self._q.s[0] - self._prefmin  # the no-merge backlog (as replay's)
        horizon = cost_horizon(sc, p.step_seconds, self.w)
        starts = np.arange(episode.n_decisions, dtype=np.int64) * self.interval
        # Each decision's isolated merge, followed over its cost window (+1 bin) first, and
        # those still perturbing the queue then over windows 4x longer each round, up to
        # the episode's end (bounded memory on long traces; one round on the shipped ones).
        length = np.minimum(horizon + 1, n_bins - starts)
        (drained, t_drain), excess = self._windows(
            starts, np.zeros(starts.size), self._prefmin[starts], length
        )
        span = 4 * (horizon + 1)
        while True:
            todo = np.flatnonzero(~drained & (length < n_bins - starts))
            if todo.size == 0:
                break
            length[todo] = np.minimum(span, n_bins - starts[todo])
            (d2, t2), e2 = self._windows(
                starts[todo], np.zeros(todo.size), self._prefmin[starts[todo]], length[todo]
            )
            drained[todo], t_drain[todo], excess[todo] = d2, t2, e2
            span *= 4
        drain = (drained, t_drain)
        #: Bins from a merge's start to its drain (or to the episode's end), per decision.
        self.drain_bins = drain[1]
        #: Extra violated requests of an isolated merge at each decision, exact.
        self.iso_excess = excess
        h_min_bins = p.h_min * self.interval
        self.episode_proven = bool(
            np.all(self.drain_bins <= h_min_bins) and np.array_equal(self.iso_excess, self.cost)
        )

    def matches(self, episode: core.Episode) -> bool:
        """Whether ``episode`` has this scorer's replay inputs (an episode rebuilt from the
        same seed does), so the scorer can be reused for it."""
        e = self.episode
        return episode is e or (
            episode.n_decisions == e.n_decisions
            and np.array_equal(episode.base_s, e.base_s)
            and np.array_equal(episode.req_bin, e.req_bin)
            and np.array_equal(episode.pressure_bin, e.pressure_bin)
        )

    def _windows(
        self,
        st: np.ndarray,
        off0: np.ndarray,
        min0: np.ndarray,
        length: np.ndarray,
        want_state: bool = False,
    ):
        """:meth:`_windows_block` over blocks of rows of at most ``_GRID_MAX`` grid cells."""
        r = st.size
        per = max(1, _GRID_MAX // max(1, int(length.max()) if r else 1))
        if r <= per:
            return self._windows_block(st, off0, min0, length, want_state)
        parts = [
            self._windows_block(
                st[i : i + per],
                off0[i : i + per],
                min0[i : i + per],
                length[i : i + per],
                want_state,
            )
            for i in range(0, r, per)
        ]
        drained = np.concatenate([q[0][0] for q in parts])
        t_drain = np.concatenate([q[0][1] for q in parts])
        excess = np.concatenate([q[1] for q in parts])
        if not want_state:
            return (drained, t_drain), excess
        return (
            (drained, t_drain),
            excess,
            (np.concatenate([q[2][0] for q in parts]), np.concatenate([q[2][1] for q in parts])),
        )

    def _windows_block(
        self,
        st: np.ndarray,
        off0: np.ndarray,
        min0: np.ndarray,
        length: np.ndarray,
        want_state: bool = False,
    ):
        """Replay windows ``[st, st + length)`` each holding one merge at ``st``, entering
        with running-sum offset ``off0`` and running minimum ``min0`` (the no-merge state:
        0 and ``prefmin[st]``).

        Returns ``((drained, t_drain), excess[, (offset, run)])``: whether and where (bins
        from ``st``; ``length`` when not) the backlog re-joined the no-merge backlog, the
        extra violations before that, and the state to carry into the next window.
        """
        return merge_window(
            self._q, self._base_bl, st, off0, min0, length, self.w, self.sidecar, want_state
        )

    def score(self, schedules: np.ndarray) -> Scores:
        """Exact and additive sync-excess (pp) of ``(K, M)`` schedules (decision indices)."""
        sch = np.asarray(schedules, dtype=np.int64)
        if sch.ndim != 2:
            raise ValueError(f"schedules must be a (K, M) array, got shape {sch.shape}")
        k, m = sch.shape
        if m == 0:
            return Scores(np.zeros(k), np.zeros(k), np.zeros(k, bool))
        if sch.min() < 0 or sch.max() >= self.episode.n_decisions:
            raise ValueError(
                f"schedule decisions must be in 0..{self.episode.n_decisions - 1}"
                f", got {int(sch.min())}..{int(sch.max())}"
            )
        additive = self.cost[sch].sum(axis=1) * self.pct
        if self.episode_proven:
            return Scores(self.iso_excess[sch].sum(axis=1) * self.pct, additive, np.zeros(k, bool))
        total = np.zeros(k)
        replayed = np.zeros(k, bool)
        carried = np.zeros(k, bool)
        c_off = np.zeros(k)
        c_run = np.zeros(k)
        starts = sch * self.interval
        for j in range(m):
            st = starts[:, j]
            nxt = starts[:, j + 1] if j + 1 < m else np.full(k, self.n_bins)
            iso = ~carried & (st + self.drain_bins[sch[:, j]] <= nxt)
            total[iso] += self.iso_excess[sch[iso, j]]
            rows = np.flatnonzero(~iso)
            carried[iso] = False
            if rows.size == 0:
                continue
            replayed[rows] = True
            st_r = st[rows]
            was = carried[rows]
            off0 = np.where(was, c_off[rows], 0.0)
            min0 = np.where(was, c_run[rows], self._prefmin[st_r])
            (drained, _), exc, (off1, run1) = self._windows(
                st_r, off0, min0, nxt[rows] - st_r, want_state=True
            )
            total[rows] += exc
            carried[rows] = ~drained
            c_off[rows], c_run[rows] = off1, run1
        return Scores(total * self.pct, additive, replayed)


def replay_many(
    episode: core.Episode,
    schedules: np.ndarray,
    params: core.EnvParams,
    sidecar: SidecarParams,
    scorer: EpisodeScorer | None = None,
) -> np.ndarray:
    """Exact sync-excess (percentage points) of many schedules at once.

    Args:
        schedules: int ``(K, M)`` decision indices, one schedule per row.
        scorer: an :class:`EpisodeScorer` of this episode to reuse (built when ``None``).

    Returns:
        float ``(K,)``: each schedule's violation % minus the no-merge violation %.
    """
    scorer = scorer or EpisodeScorer(episode, params, sidecar)
    return scorer.score(schedules).exact_pct


def replay_full(
    episode: core.Episode,
    schedules: np.ndarray,
    params: core.EnvParams,
    sidecar: SidecarParams,
    chunk: int = 256,
) -> np.ndarray:
    """Sync-excess (pp) of each schedule by replaying the whole episode through the queue
    (the slow reference for :func:`replay_many`)."""
    schedules = np.asarray(schedules, dtype=np.int64)
    k, m = schedules.shape
    n_bins = episode.pressure_bin.size
    base_viol = episode.baseline.violation_pct
    out = np.empty(k)
    if m == 0:
        out[:] = 0.0
        return out
    for lo in range(0, k, chunk):
        mask = core.sync_mask(schedules[lo : lo + chunk], n_bins, params)
        res = replay(
            episode.base_s,
            episode.req_bin,
            episode.pressure_bin,
            mask,
            sidecar,
            params.step_seconds,
        )
        out[lo : lo + mask.shape[0]] = res.violated.mean(axis=1) * 100.0 - base_viol
    return out


def envelope(
    episode: core.Episode,
    merges: int,
    draws: int,
    rng: np.random.Generator,
    params: core.EnvParams,
    sidecar: SidecarParams,
    counts: CompletionTable | None = None,
    exact: bool = True,
    scorer: EpisodeScorer | None = None,
) -> np.ndarray:
    """Sync-excess (pp) of ``draws`` matched-random schedules with exactly ``merges`` merges.

    With ``exact=True`` (the default) every draw is scored by the exact replay
    (:class:`EpisodeScorer`, the replay the agent and the oracle get too). ``exact=False``
    gives the sum of the merges' isolated costs (``episode.merge_cost``), which differs
    from the replay when merges interact (a merge starting before the previous one's
    backlog has drained).
    """
    sch = sample_uniform(
        episode.n_decisions, params.h_min, params.h_max, merges, draws, rng, counts=counts
    )
    if exact:
        return replay_many(episode, sch, params, sidecar, scorer=scorer)
    return episode.merge_cost[sch].sum(axis=1) * episode.pct_per_request


def _feasible_rows(sch: np.ndarray, n: int, h_min: int, h_max: int) -> np.ndarray:
    """Which rows of ``(K, M)`` schedules are feasible (:func:`schedules.is_feasible`)."""
    d = np.concatenate([np.zeros((sch.shape[0], 1), np.int64), sch], axis=1)
    gaps = np.diff(d, axis=1)
    return (
        np.all((gaps >= h_min) & (gaps <= h_max), axis=1)
        & (sch[:, -1] <= n - 1)
        & ((n - 1) - sch[:, -1] < h_max)
    )


def _neighbours(s: np.ndarray, n: int, h_min: int, h_max: int) -> np.ndarray:
    """Feasible schedules one move from ``s``: one merge moved anywhere between its
    neighbours, or every merge from the j-th on shifted by the same number of decisions."""
    m = s.size
    out = []
    for j in range(m):
        prev = s[j - 1] if j else 0
        pos = np.arange(prev + h_min, min(prev + h_max, n - 1) + 1)
        pos = pos[pos != s[j]]
        c = np.repeat(s[None, :], pos.size, axis=0)
        c[:, j] = pos
        out.append(c)
        delta = np.arange(-h_max, h_max + 1)
        delta = delta[delta != 0]
        c = np.repeat(s[None, :], delta.size, axis=0)
        c[:, j:] += delta[:, None]
        out.append(c)
    cand = np.concatenate(out)
    cand = cand[(cand.min(axis=1) >= 0) & (cand.max(axis=1) < n)]
    return cand[_feasible_rows(cand, n, h_min, h_max)]


#: Largest number of feasible schedules the oracle scores one by one (exact optimum).
ORACLE_ENUMERATE_MAX = 250_000


def enumerate_schedules(n: int, h_min: int, h_max: int, m: int, cap: int) -> np.ndarray | None:
    """Every feasible schedule with exactly ``m`` merges as an ``(K, m)`` array, or ``None``
    when there are more than ``cap`` (partial schedules are extended merge by merge, keeping
    only those that can still end feasibly)."""
    cur = np.zeros((1, 0), dtype=np.int64)
    last = np.zeros(1, dtype=np.int64)
    offs = np.arange(h_min, h_max + 1, dtype=np.int64)
    for k in range(m):
        left = m - k - 1  # merges still to place after this one
        nxt = last[:, None] + offs[None, :]
        ok = (nxt + left * h_min <= n - 1) & (nxt + left * h_max >= n - h_max)
        r, c = np.nonzero(ok)
        if r.size > cap:
            return None
        last = nxt[r, c]
        cur = np.concatenate([cur[r], last[:, None]], axis=1)
    return cur


def exact_local_search(
    scorer: EpisodeScorer, start: np.ndarray, max_rounds: int = 200
) -> tuple[np.ndarray, float, int]:
    """Best-improvement local search on the exact replay from ``start``.

    Every round scores all of the schedule's neighbours (:func:`_neighbours`: single merge
    moves and suffix shifts) by the exact replay (:meth:`EpisodeScorer.score`, batched) and
    moves to the best one while it lowers the exact sync-excess by more than 1e-12 pp.

    Returns:
        ``(schedule, exact_pct, rounds)``: a local optimum of the exact replay under these
        moves (no neighbour is better), not proven globally optimal.
    """
    p = scorer.params
    n = scorer.episode.n_decisions
    best = np.asarray(start, dtype=np.int64).copy()
    best_v = float(scorer.score(best[None, :]).exact_pct[0])
    rounds = 0
    while best.size and rounds < max_rounds:
        cand = _neighbours(best, n, p.h_min, p.h_max)
        if cand.size == 0:
            break
        v = scorer.score(cand).exact_pct
        i = int(np.argmin(v))
        if not v[i] < best_v - 1e-12:
            break
        best, best_v = cand[i].copy(), float(v[i])
        rounds += 1
    return best, best_v, rounds


def oracle_score(
    episode: core.Episode,
    merges: int,
    params: core.EnvParams,
    sidecar: SidecarParams,
    scorer: EpisodeScorer | None = None,
    enumerate_max: int = ORACLE_ENUMERATE_MAX,
) -> dict:
    """The offline oracle at exactly ``merges`` merges: the exact optimum of the additive
    cost (dynamic programme), replayed exactly; where merges can interact, the exact
    optimum by scoring every feasible schedule when there are at most ``enumerate_max``
    of them, else an exact local search (:func:`exact_local_search`) from it.

    Returns:
        ``{"schedule", "exact_pct", "additive_pct", "exact_optimum", "status",
        "additive_optimum_pct", "search_rounds"}``: the best exact schedule found and its
        exact and additive sync-excess. ``status`` is :data:`ORACLE_EXACT` when the episode
        is proven additive (every schedule's exact sync-excess equals its additive one,
        :attr:`EpisodeScorer.episode_proven`, so the additive optimum is the exact one),
        :data:`ORACLE_ENUMERATED` when every feasible schedule was scored, and
        :data:`ORACLE_BOUND` when the schedule is a local optimum of the exact replay,
        whose sync-excess is an upper bound on the exact optimum (no certified lower
        bound is computed); ``exact_optimum`` is False only then.
        ``additive_optimum_pct`` is the exact replay of the additive optimum itself.
    """
    scorer = scorer or EpisodeScorer(episode, params, sidecar)
    # Agents of a unit with the same number of merges share the oracle (one search).
    cache = scorer.__dict__.setdefault("_oracle_cache", {})
    key = (int(merges), int(enumerate_max))
    if key in cache:
        return {**cache[key], "schedule": cache[key]["schedule"].copy()}
    sched, _ = optimal_schedule(scorer.cost, params.h_min, params.h_max, merges)
    sc = scorer.score(sched[None, :])
    base = float(sc.exact_pct[0])
    rounds = 0
    best, best_v = sched, base
    status = ORACLE_EXACT
    if not scorer.episode_proven and sched.size:
        every = enumerate_schedules(
            scorer.episode.n_decisions,
            params.h_min,
            params.h_max,
            merges,
            enumerate_max,
        )
        if every is not None:
            v = scorer.score(every).exact_pct
            i = int(np.argmin(v))
            if v[i] < best_v:
                best, best_v = every[i].copy(), float(v[i])
            status = ORACLE_ENUMERATED
        else:
            best, best_v, rounds = exact_local_search(scorer, sched)
            status = ORACLE_BOUND
    out = {
        "schedule": best,
        "exact_pct": best_v,
        "additive_pct": float(scorer.cost[best].sum() * scorer.pct),
        "exact_optimum": status != ORACLE_BOUND,
        "status": status,
        "additive_optimum_pct": base,
        "search_rounds": rounds,
    }
    cache[key] = {**out, "schedule": best.copy()}
    return out


def oracle_excess(
    episode: core.Episode, merges: int, params: core.EnvParams, sidecar: SidecarParams
) -> tuple[float, np.ndarray]:
    """Exact sync-excess (pp) of the offline oracle's schedule at exactly ``merges`` merges
    (see :func:`oracle_score`)."""
    o = oracle_score(episode, merges, params, sidecar)
    return o["exact_pct"], o["schedule"]


#: Per-row scoring labels (results.csv ``scoring`` / ``oracle_schedule``).
SCORING_PROVEN = "additive (proven equal)"
SCORING_EXACT = "exact"
ORACLE_EXACT = "exact optimum"
ORACLE_ENUMERATED = "exact optimum (every feasible schedule scored)"
ORACLE_BOUND = (
    "upper bound (best exact schedule found: exact local search from the additive optimum)"
)


def score_episode(
    scorer: EpisodeScorer,
    agent_schedule,
    draws: int,
    rng: np.random.Generator,
    counts: CompletionTable | None = None,
) -> dict[str, Any]:
    """Agent, matched-random control and oracle of one episode, all by the same exact replay.

    The control is ``draws`` schedules drawn uniformly among the feasible schedules with
    the agent's number of merges; the oracle is the additive optimum at that budget.

    Returns:
        The report's scoring columns: ``sync_excess_pct`` and ``additive_excess_pct`` (the
        agent), ``matched_random_mean`` / ``_p05`` / ``_p95`` and
        ``matched_random_additive_mean``, ``oracle_same_budget_pct`` (exact replay) and
        ``oracle_additive_pct``, ``oracle_schedule`` (:data:`ORACLE_EXACT` when the episode
        is proven additive, else :data:`ORACLE_BOUND`), ``scoring``
        (:data:`SCORING_PROVEN` when every scored schedule's merges each started from the
        no-merge queue and their exact excess equals their isolated cost, else
        :data:`SCORING_EXACT`), ``replayed_schedules`` (how many needed a windowed replay)
        and ``additive_exact_gap_pp`` (the largest |exact - additive| over all of them).
    """
    ep, p = scorer.episode, scorer.params
    agent = np.asarray(agent_schedule, dtype=np.int64).reshape(1, -1)
    m = agent.shape[1]
    sch = sample_uniform(ep.n_decisions, p.h_min, p.h_max, m, draws, rng, counts=counts)
    a, c = scorer.score(agent), scorer.score(sch)
    orc = oracle_score(ep, m, p, scorer.sidecar, scorer=scorer)
    o = scorer.score(orc["schedule"][None, :])
    gaps = np.abs(np.concatenate([x.exact_pct - x.additive_pct for x in (a, c, o)]))
    used = np.concatenate([agent.ravel(), sch.ravel(), orc["schedule"]])
    replayed = int(a.replayed.sum() + c.replayed.sum() + o.replayed.sum())
    proven = replayed == 0 and bool(np.array_equal(scorer.iso_excess[used], scorer.cost[used]))
    return {
        "sync_excess_pct": float(a.exact_pct[0]),
        "additive_excess_pct": float(a.additive_pct[0]),
        "matched_random_mean": float(c.exact_pct.mean()),
        "matched_random_p05": float(np.percentile(c.exact_pct, 5)),
        "matched_random_p95": float(np.percentile(c.exact_pct, 95)),
        "matched_random_additive_mean": float(c.additive_pct.mean()),
        "oracle_same_budget_pct": float(o.exact_pct[0]),
        "oracle_additive_pct": float(o.additive_pct[0]),
        "oracle_schedule": orc["status"],
        "scoring": SCORING_PROVEN if proven else SCORING_EXACT,
        "replayed_schedules": replayed,
        "additive_exact_gap_pp": float(gaps.max()),
    }


def min_achievable_p(n: int, n_flip: int = N_FLIP) -> float:
    """The smallest p-value :func:`paired_test` can return on ``n`` paired units.

    The exact two-sided sign-flip test counts the observed sign pattern and its mirror
    image, so its p is at least ``2 / 2**n`` (0.0625 for 5 units); the Monte Carlo test
    (``n > 20``) counts the observed statistic among ``n_flip + 1``, so at least
    ``1 / (n_flip + 1)``. With no unit there is no test (``1.0``).
    """
    if n < 1:
        return 1.0
    exact = 2.0 / 2.0**n
    return exact if n <= EXACT_MAX_N else max(exact, 1.0 / (n_flip + 1))


def nonzero_units(diff: np.ndarray, tol: float = ZERO_TOL) -> int:
    """How many paired units can carry evidence in a sign-flip test: those whose
    difference is not zero (``|d| > tol``).

    A unit with a difference of exactly zero gives the same statistic under both signs, so
    every sign pattern is counted twice over it: with ``k`` non-zero units out of ``n`` the
    smallest achievable p is ``2 / 2**k``, not ``2 / 2**n``.
    """
    d = np.asarray(diff, dtype=np.float64)
    return int(np.count_nonzero(np.abs(d) > tol))


def units_needed(alpha: float = ALPHA, n_tests: int = 1, n_flip: int = N_FLIP) -> int:
    """The fewest independent units whose best achievable p, Holm-adjusted over
    ``n_tests`` tests (the smallest Holm-adjusted p is ``n_tests`` times the smallest raw
    p), is below ``alpha``: 6 for one test at 0.05 (2/2**5 = 0.0625 is not), 9 for eight.

    Raises:
        ValueError: when no number of units can reach ``alpha`` (Monte Carlo resolution).
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    for n in range(1, 64):
        if n_tests * min_achievable_p(n, n_flip) < alpha:
            return n
    raise ValueError(
        f"no number of units reaches alpha {alpha} with {n_tests} tests and "
        f"{n_flip} Monte Carlo sign patterns"
    )


def paired_test(
    diff: np.ndarray, rng: np.random.Generator, n_boot: int = 5000, n_flip: int = N_FLIP
) -> dict:
    """Two-sided sign-flip test of mean(diff) = 0 and a bootstrap 95 % CI of the mean.

    Exact (all ``2**n`` sign patterns) for ``n <= 20``, Monte Carlo with ``n_flip`` random
    patterns above (p then counts the observed statistic, so it is never 0). The result's
    ``nonzero`` counts the units whose difference is not zero (:func:`nonzero_units`;
    only they can carry evidence) and ``min_p`` is the smallest p this test could give on
    them (:func:`min_achievable_p` of ``nonzero``): when even that cannot reach the gate's
    alpha, the units are too few to tell a tie from a gain.
    """
    diff = np.asarray(diff, dtype=np.float64)
    n = diff.size
    if n == 0:
        return {
            "n": 0,
            "mean": float("nan"),
            "p_value": float("nan"),
            "ci_low": float("nan"),
            "ci_high": float("nan"),
            "min_p": 1.0,
            "nonzero": 0,
        }
    obs = abs(diff.mean())
    if n <= EXACT_MAX_N:
        p = _exact_sign_flip_p(diff, obs)
    else:
        signs = rng.choice([-1.0, 1.0], size=(n_flip, n))
        stats = np.abs(signs @ diff) / n
        p = float((np.sum(stats >= obs - 1e-12) + 1) / (n_flip + 1))
    boot = diff[rng.integers(0, n, size=(n_boot, n))].mean(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    k = nonzero_units(diff)
    return {
        "n": n,
        "mean": float(diff.mean()),
        "p_value": p,
        "ci_low": float(lo),
        "ci_high": float(hi),
        "min_p": min_achievable_p(k, n_flip),
        "nonzero": k,
    }


def _sign_sums(x: np.ndarray) -> np.ndarray:
    """``sum_i s_i x_i`` for all ``2**len(x)`` sign patterns ``s``."""
    signs = ((np.arange(2**x.size)[:, None] >> np.arange(x.size)) & 1) * 2 - 1
    return signs @ x


def _exact_sign_flip_p(diff: np.ndarray, obs: float) -> float:
    """Share of the ``2**n`` sign patterns whose ``|mean|`` is at least ``obs`` (less
    ``1e-12`` for rounding), counted without enumerating them: every pattern's sum is a sum
    of one of the ``2**(n//2)`` sign sums of the first half and one of the second half's,
    so for each first-half sum a binary search over the sorted second-half sums counts the
    patterns at or beyond ``+-n * (obs - 1e-12)`` (``O(2**(n/2) n)`` instead of
    ``O(2**n n)``: 1 M patterns for the report's 20 seeds)."""
    n = diff.size
    t = n * (obs - 1e-12)
    if t <= 0.0:
        return 1.0  # every pattern qualifies
    first = _sign_sums(diff[: n // 2])
    second = np.sort(_sign_sums(diff[n // 2 :]))
    upper = second.size - np.searchsorted(second, t - first, side="left")  # sum >= t
    lower = np.searchsorted(second, -t - first, side="right")  # sum <= -t
    return float((upper.sum() + lower.sum()) / 2**n)


def gate_verdict(
    calibration_verdict: str,
    mean_diff: float,
    p_value: float,
    alpha: float = ALPHA,
    *,
    n_units: int | None = None,
    n_nonzero: int | None = None,
    n_tests: int = 1,
    no_sync_violation_pct: float | None = None,
    saturation_pct: float = SATURATION_PCT,
) -> str:
    """The gate (docs/protocol.md): one of :data:`VERDICTS`.

    In order:

    1. ``no claim (no SLO effect)`` when the real sidecar showed no merge effect;
    2. ``no claim (saturated)`` when the replay's no-merge violation rate is above
       ``saturation_pct`` (see :data:`SATURATION_PCT`);
       then ``no claim (uncalibrated)`` when the effect sizes did not transfer, and
       ``no claim (calibration uncertain)`` when the measured interval of an effect size is
       too wide to decide the transfer;
    3. ``inconclusive (too few episodes)`` when the independent units that can carry
       evidence (``n_nonzero`` when given: a unit whose difference is exactly zero
       carries none; else ``n_units``) could not have reached ``alpha`` whatever the
       data: ``n_tests * min_achievable_p(n)`` (the smallest Holm-adjusted p over
       ``n_tests`` tests) is not below it;
    4. ``placement gain`` / ``worse than matched random`` when ``p_value`` (Holm-adjusted
       when the caller corrects) is below ``alpha``;
    5. otherwise ``tied with matched random``.

    Args:
        calibration_verdict: ``calibrated``, ``uncalibrated`` or ``no measurable SLO
            effect``.
        mean_diff: agent minus matched random, percentage points.
        p_value: the p-value the gate compares with ``alpha``.
        n_units: independent paired units behind ``p_value`` (``None``: not checked).
        n_nonzero: how many of them have a non-zero difference (:func:`nonzero_units`;
            ``None``: all of them).
        n_tests: size of the Holm family ``p_value`` was adjusted over (1 if raw).
        no_sync_violation_pct: mean violation % of the replay with no merges (``None``:
            not checked).
    """
    if calibration_verdict == "no measurable SLO effect":
        return "no claim (no SLO effect)"
    # Saturation before 'uncalibrated': a saturated replay's effect sizes collapse towards
    # 1, so it is also the likely reason for an 'uncalibrated' transfer verdict.
    if no_sync_violation_pct is not None and no_sync_violation_pct > saturation_pct:
        return "no claim (saturated)"
    if calibration_verdict == "uncalibrated":
        return "no claim (uncalibrated)"
    if calibration_verdict == "uncertain":  # the measured interval straddles the verdict
        return "no claim (calibration uncertain)"
    # Before the p-value: with these units a p below alpha is impossible anyway (a zero
    # difference carries no evidence, so only the non-zero units count).
    counts = [c for c in (n_units, n_nonzero) if c is not None]
    if counts and n_tests * min_achievable_p(min(counts)) >= alpha:
        return "inconclusive (too few episodes)"
    if np.isfinite(p_value) and p_value < alpha:
        return "placement gain" if mean_diff < 0 else "worse than matched random"
    return "tied with matched random"


@dataclass(frozen=True)
class _Draw:
    schedule: np.ndarray
    planned: frozenset[int]


class MatchedRandomDeferral(gym.Wrapper[Observation, Action, Observation, Action]):
    """The matched random deferral control as a Gymnasium wrapper.

    For an episode whose reference schedule has ``M`` merges, the wrapped env's merges are
    placed by a schedule drawn **uniformly at random among all feasible schedules with
    exactly M merges** (exact sampling by counting completions, see
    :func:`diloco_gym.sim.schedules.sample_uniform`); the actions passed to :meth:`step` are
    ignored. Same trace as the reference (same episode seed), draws seeded by
    ``(draw_seed, episode_seed)``.

    Args:
        env: a ``DiLoCoSync`` env (any wrappers).
        merges: ``M`` for every episode, or a mapping ``episode seed -> M`` (for example the
            reference agent's merges per seed).
        draw_seed: seed of the draws.
    """

    def __init__(self, env: gym.Env, merges: int | dict[int, int], draw_seed: int = 0) -> None:
        super().__init__(env)
        self.merges = merges
        self.draw_seed = int(draw_seed)
        self._draw: _Draw | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        base = cast("DiLoCoSyncEnv", self.env.unwrapped)
        ep_seed = int(info["episode_seed"])
        if isinstance(self.merges, dict):
            if ep_seed not in self.merges:
                raise KeyError(f"MatchedRandomDeferral: no merge count for episode seed {ep_seed}")
            m = int(self.merges[ep_seed])
        else:
            m = int(self.merges)
        p = base.params
        if base.merges:
            raise RuntimeError(
                "MatchedRandomDeferral needs an env that has not merged at "
                "reset (skip_forced starts at gap 0, so this cannot happen "
                "with DiLoCoSyncEnv)"
            )
        assert base.episode is not None  # set by the reset() above
        rng = np.random.default_rng([self.draw_seed, ep_seed])
        sched = sample_uniform(base.episode.n_decisions, p.h_min, p.h_max, m, 1, rng)[0]
        self._draw = _Draw(sched, frozenset(int(d) for d in sched))
        info["matched_schedule"] = sched.tolist()
        return obs, info

    def step(self, action: Any):
        if self._draw is None:
            raise RuntimeError("call reset() first")
        base = cast("DiLoCoSyncEnv", self.env.unwrapped)
        a = 1 if base.decision in self._draw.planned else 0
        obs, reward, terminated, truncated, info = self.env.step(a)
        if terminated or truncated:
            realised = info["episode_summary"]["merge_decisions"]
            if realised != self._draw.schedule.tolist():
                raise RuntimeError(
                    f"matched schedule {self._draw.schedule.tolist()} was not "
                    f"realised ({realised}); the env must use the default "
                    f"corridor semantics"
                )
        return obs, reward, terminated, truncated, info


def counts_for(n: int, params: core.EnvParams, m_max: int) -> CompletionTable:
    """Completion counts (log space) shared by all draws of an episode length (cache them
    per N)."""
    return completion_table(n, params.h_min, params.h_max, m_max)
