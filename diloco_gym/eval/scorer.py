"""The exact scorer of the protocol: sync-excess of many merge schedules on one episode, by
the exact replay computed only where merges act (:class:`EpisodeScorer`)."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from diloco_gym.envs.episode import Episode
from diloco_gym.envs.params import EnvParams
from diloco_gym.sim import compiled_eval
from diloco_gym.sim.sidecar import (
    SidecarParams,
    cost_horizon,
    episode_cost_queue,
    merge_window,
    violation_threshold,
)

#: No reference schedule to resume from (:meth:`EpisodeScorer.score`'s ``around``).
_NO_REF = np.empty(0, dtype=np.int64)

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


def check_schedules(schedules: Any, n_decisions: int) -> np.ndarray:
    """``schedules`` as a ``(K, M)`` int64 array of decisions in ``0..n_decisions - 1``
    (a ``ValueError`` naming what is wrong otherwise)."""
    sch = np.asarray(schedules, dtype=np.int64)
    if sch.ndim != 2:
        raise ValueError(f"schedules must be a (K, M) array, got shape {sch.shape}")
    if sch.size and (sch.min() < 0 or sch.max() >= n_decisions):
        raise ValueError(
            f"schedule decisions must be in 0..{n_decisions - 1}"
            f", got {int(sch.min())}..{int(sch.max())}"
        )
    return sch


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

    def __init__(self, episode: Episode, params: EnvParams, sidecar: SidecarParams) -> None:
        p, sc = params, sidecar
        self.episode, self.params, self.sidecar = episode, params, sidecar
        self.interval = p.decision_interval
        self.w = p.merge_steps
        self.n_bins = n_bins = episode.pressure_bin.size
        self.pct = episode.pct_per_request
        self.cost = np.asarray(episode.merge_cost, dtype=np.float64)
        self._q, self.prefmin, self._base_bl = episode_cost_queue(
            episode.base_s,
            episode.req_bin,
            episode.pressure_bin,
            episode.baseline.violated,
            episode.queue,
            sc,
            p.step_seconds,
            self.w,
        )
        q = self._q
        slow = q.m0[0][q.rbin[0] // q.m0_bins]
        self._thresholds = (
            violation_threshold(slow * (1.0 + sc.sync_slowdown), q.base[0], sc),
            violation_threshold(slow, q.base[0], sc),
        )
        horizon = cost_horizon(sc, p.step_seconds, self.w)
        starts = np.arange(episode.n_decisions, dtype=np.int64) * self.interval
        # Each decision's isolated merge, followed over its cost window (+1 bin) first, and
        # those still perturbing the queue then over windows 4x longer each round, up to
        # the episode's end (bounded memory on long traces; one round on the shipped ones).
        length = np.minimum(horizon + 1, n_bins - starts)
        drained, t_drain, excess = self._isolated(starts, length)
        span = 4 * (horizon + 1)
        while True:
            todo = np.flatnonzero(~drained & (length < n_bins - starts))
            if todo.size == 0:
                break
            length[todo] = np.minimum(span, n_bins - starts[todo])
            d2, t2, e2 = self._isolated(starts[todo], length[todo])
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

    def matches(self, episode: Episode) -> bool:
        """Whether ``episode`` has this scorer's replay inputs (an episode rebuilt from the
        same seed does), so the scorer can be reused for it."""
        e = self.episode
        return episode is e or (
            episode.n_decisions == e.n_decisions
            and np.array_equal(episode.base_s, e.base_s)
            and np.array_equal(episode.req_bin, e.req_bin)
            and np.array_equal(episode.pressure_bin, e.pressure_bin)
        )

    def _isolated(
        self, starts: np.ndarray, length: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(drained, t_drain, excess)`` of a merge at each of ``starts`` from the
        no-merge state, followed over ``length`` bins or to its drain: what
        :meth:`windows` gives without the state, in compiled code
        (:func:`diloco_gym.sim.jit_eval.window_rows`)."""
        n = starts.size
        drained = np.empty(n, dtype=np.bool_)
        t_drain = np.empty(n, dtype=np.int64)
        excess = np.empty(n)
        st = np.ascontiguousarray(starts, dtype=np.int64)
        compiled_eval().window_rows(
            *self._queue_args(), st, np.zeros(n), np.ascontiguousarray(self.prefmin[st]),
            np.ascontiguousarray(length, dtype=np.int64), int(self.w), *self._slo_args(),
            drained, t_drain, excess,
        )  # fmt: skip
        return drained, t_drain, excess

    def windows(
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

    def score(self, schedules: np.ndarray, around: np.ndarray | None = None) -> Scores:
        """Exact and additive sync-excess (pp) of ``(K, M)`` schedules (decision indices).

        ``around``: a schedule of ``M`` merges that the rows share first merges with (a
        local search's incumbent): each row's replay then starts where it first differs
        from it, from the state ``around`` reaches there (the same scores, less work;
        ignored unless it is one strictly increasing schedule of ``M`` merges)."""
        sch = check_schedules(schedules, self.episode.n_decisions)
        k, m = sch.shape
        if m == 0:
            return Scores(np.zeros(k), np.zeros(k), np.zeros(k, bool))
        additive = self.cost[sch].sum(axis=1) * self.pct
        if self.episode_proven:
            return Scores(self.iso_excess[sch].sum(axis=1) * self.pct, additive, np.zeros(k, bool))
        if m == 1 or bool(np.all(sch[:, 1:] > sch[:, :-1])):
            ref = _NO_REF if around is None else np.asarray(around, dtype=np.int64).ravel()
            if ref.size != m or (m > 1 and not bool(np.all(ref[1:] > ref[:-1]))):
                ref = _NO_REF
            total, replayed = self._score_compiled(sch, ref)
            return Scores(total * self.pct, additive, replayed)
        total, replayed = self._score_grid(sch)
        return Scores(total * self.pct, additive, replayed)

    def _queue_args(self) -> tuple:
        """The episode's queue as the compiled windows read it: one row, with each
        request's SLO thresholds inside and after a merge window precomputed once
        (:func:`~diloco_gym.sim.sidecar.violation_threshold`, the arithmetic the loop
        would do per request and window: the same values)."""
        q = self._q
        thr_in, thr_tail = self._thresholds
        return (
            q.s[0], q.d[0], self._base_bl, q.ptr[0], q.rbin[0], q.base[0], q.m0[0],
            int(q.m0_bins), thr_in, thr_tail,
        )  # fmt: skip

    def _slo_args(self) -> tuple[float, float, float]:
        sc = self.sidecar
        return 1.0 + sc.sync_slowdown, sc.slo_s, float(sc.slots)

    def _score_compiled(
        self, sch: np.ndarray, ref: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Extra violations (requests) and the replayed flags of strictly increasing
        schedules, a schedule at a time in compiled code
        (:func:`diloco_gym.sim.jit_eval.score_rows`: the rule of :meth:`_score_grid`,
        each window followed only up to its drain; rows resumed from ``ref``'s states
        where they share its first merges)."""
        k = sch.shape[0]
        total = np.empty(k)
        replayed = np.empty(k, dtype=np.bool_)
        s, d, base_bl, ptr, rbin, base, m0, m0_bins, thr_in, thr_tail = self._queue_args()
        compiled_eval().score_rows(
            np.ascontiguousarray(sch), _NO_REF if ref is None else np.ascontiguousarray(ref),
            int(self.interval), int(self.n_bins),
            self.drain_bins, self.iso_excess, s, d, base_bl, self.prefmin, ptr, rbin,
            base, m0, m0_bins, thr_in, thr_tail, int(self.w), *self._slo_args(), total,
            replayed,
        )  # fmt: skip
        return total, replayed

    def _score_grid(self, sch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Extra violations (requests) and the replayed flags of any ``(K, M)``
        schedules, merge by merge over NumPy grids of the batch's windows
        (:meth:`windows`): the reference rule, used where a schedule repeats or reorders
        a decision."""

        def windows(dec, st, off0, min0, length):  # noqa: ANN001, ANN202 - grid_scores' callback
            return self.windows(st, off0, min0, length, want_state=True)

        return grid_scores(self, sch, windows)


def grid_scores(
    scorer: EpisodeScorer | MixedScorer, sch: np.ndarray, windows: Any
) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`EpisodeScorer.score`'s merge-by-merge rule over ``(K, M)`` schedules: a merge
    that starts from the no-merge state and drains before the next adds its isolated excess
    (``scorer.iso_excess``, drain from ``scorer.drain_bins``); the others are replayed by
    ``windows(decisions, starts, off0, min0, lengths)`` (:meth:`EpisodeScorer.windows`
    with its state) from the state carried from the merge before."""
    k, m = sch.shape
    total = np.zeros(k)
    replayed = np.zeros(k, bool)
    carried = np.zeros(k, bool)
    c_off = np.zeros(k)
    c_run = np.zeros(k)
    starts = sch * scorer.interval
    for j in range(m):
        st = starts[:, j]
        nxt = starts[:, j + 1] if j + 1 < m else np.full(k, scorer.n_bins)
        iso = ~carried & (st + scorer.drain_bins[sch[:, j]] <= nxt)
        total[iso] += scorer.iso_excess[sch[iso, j]]
        rows = np.flatnonzero(~iso)
        carried[iso] = False
        if rows.size == 0:
            continue
        replayed[rows] = True
        st_r = st[rows]
        was = carried[rows]
        off0 = np.where(was, c_off[rows], 0.0)
        min0 = np.where(was, c_run[rows], scorer.prefmin[st_r])
        (drained, _), exc, (off1, run1) = windows(sch[rows, j], st_r, off0, min0, nxt[rows] - st_r)
        total[rows] += exc
        carried[rows] = ~drained
        c_off[rows], c_run[rows] = off1, run1
    return total, replayed


class MixedScorer:
    """Exact sync-excess of many schedules on one episode whose merges differ by decision
    in window and slowdown (a fleet site with changing links): ``parts``, one
    :class:`EpisodeScorer` per kind of merge on the same requests, and ``kind`` (per
    decision, the index of its merge's part).

    A schedule is scored by :class:`EpisodeScorer`'s rule (:func:`grid_scores`), each merge
    followed with its own decision's part: its isolated excess and drain where it starts
    from the no-merge state and drains before the next merge, else its window replayed from
    the state carried from the merge before. The carried state is the queue's (the extra
    work a merge added, in seconds, and the running minimum), so it passes from a merge of
    one kind to one of another unchanged. ``episode_proven``: every decision's own merge
    drains within ``H_min`` and its exact excess equals its isolated cost, so every
    feasible schedule's exact sync-excess is the sum of its merges' isolated ones.
    """

    def __init__(self, parts: list[EpisodeScorer], kind: np.ndarray) -> None:
        first = parts[0]
        for sc in parts[1:]:
            if not first.matches(sc.episode) or sc.interval != first.interval:
                raise ValueError("a mixed scorer's parts must score one episode's requests")
        self.parts, self.kind = parts, np.asarray(kind, dtype=np.int64)
        self.episode, self.params, self.sidecar = first.episode, first.params, first.sidecar
        self.interval, self.n_bins, self.pct = first.interval, first.n_bins, first.pct
        self.prefmin = first.prefmin
        dec = np.arange(self.kind.size)

        def pick(name: str) -> np.ndarray:
            return np.stack([getattr(sc, name) for sc in parts])[self.kind, dec]

        self.cost = pick("cost")
        self.iso_excess = pick("iso_excess")
        self.drain_bins = pick("drain_bins")
        h_min_bins = self.params.h_min * self.interval
        self.episode_proven = bool(
            np.all(self.drain_bins <= h_min_bins) and np.array_equal(self.iso_excess, self.cost)
        )

    def score(self, schedules: np.ndarray, around: np.ndarray | None = None) -> Scores:
        """As :meth:`EpisodeScorer.score` (``around`` is accepted and not needed)."""
        sch = check_schedules(schedules, self.episode.n_decisions)
        k, m = sch.shape
        if m == 0:
            return Scores(np.zeros(k), np.zeros(k), np.zeros(k, bool))
        additive = self.cost[sch].sum(axis=1) * self.pct
        if self.episode_proven:
            return Scores(self.iso_excess[sch].sum(axis=1) * self.pct, additive, np.zeros(k, bool))
        total, replayed = grid_scores(self, sch, self._kind_windows)
        return Scores(total * self.pct, additive, replayed)

    def _kind_windows(self, dec, st, off0, min0, length):
        """Each row's window replayed by its decision's part (:func:`grid_scores`)."""
        kinds = self.kind[dec]
        drained = np.zeros(dec.size, bool)
        t_drain = np.zeros(dec.size, np.int64)
        exc, off1, run1 = np.zeros(dec.size), np.zeros(dec.size), np.zeros(dec.size)
        for k in np.unique(kinds):
            r = np.flatnonzero(kinds == k)
            (d, t), e, (o, u) = self.parts[int(k)].windows(
                st[r], off0[r], min0[r], length[r], want_state=True
            )
            drained[r], t_drain[r], exc[r], off1[r], run1[r] = d, t, e, o, u
        return (drained, t_drain), exc, (off1, run1)


def site_scorers(episode: Any, params: EnvParams, sidecars: list[SidecarParams]) -> list[Any]:
    """Each site's exact scorer on a fleet episode (a
    :class:`~diloco_gym.envs.fleet_sites.FleetEpisode`): an :class:`EpisodeScorer` per site
    with fixed links; with changing links a :class:`MixedScorer` per site, whose sync at
    decision ``d`` has the window and slowdown of the links' state at ``d`` (one
    :class:`EpisodeScorer` per state met)."""
    if episode.link_states is None:
        return [EpisodeScorer(e, params, sc) for e, sc in zip(episode.sites, sidecars, strict=True)]
    s = episode.setup
    variants = [episode.variant_at(d, s.default_option) for d in range(episode.n_decisions)]
    out: list[Any] = []
    for i in range(len(episode.sites)):
        # one part per distinct episode of the site: variants that differ only in other
        # sites' links give this site the same window and slowdown (the same episode copy)
        parts: list[EpisodeScorer] = []
        index: dict[int, int] = {}
        kind = np.empty(len(variants), dtype=np.int64)
        for d, v in enumerate(variants):
            e = episode.sites_of(v)[i]
            k = index.get(id(e))
            if k is None:
                k = index[id(e)] = len(parts)
                parts.append(EpisodeScorer(e, e.params, e.sidecar))
            kind[d] = k
        out.append(MixedScorer(parts, kind))
    return out
