"""The offline oracle at a fixed merge budget: the additive optimum (a dynamic programme,
:func:`~diloco_gym.sim.schedules.optimal_schedule`) replayed exactly, then, where merges can
interact, the exact optimum by enumerating every feasible schedule, or an exact local search
when there are too many (:func:`oracle_score`)."""

from __future__ import annotations

import numpy as np

from diloco_gym.envs.episode import Episode
from diloco_gym.envs.params import EnvParams
from diloco_gym.eval.scorer import EpisodeScorer, MixedScorer
from diloco_gym.sim.schedules import optimal_schedule
from diloco_gym.sim.sidecar import SidecarParams

#: Oracle labels (results.csv ``oracle_schedule``).
ORACLE_EXACT = "exact optimum"
ORACLE_ENUMERATED = "exact optimum (every feasible schedule scored)"
ORACLE_BOUND = (
    "upper bound (best exact schedule found: exact local search from the additive optimum)"
)


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
    only those that can still end feasibly; their number is counted first, so a budget with
    too many is refused without building any)."""
    if _too_many(n, h_min, h_max, m, cap):
        return None
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


def _too_many(n: int, h_min: int, h_max: int, m: int, cap: int) -> bool:
    """Whether :func:`enumerate_schedules` would hold more than ``cap`` partial schedules
    after some merge. After the ``k``-th merge it holds the prefixes that end at a decision
    from which the remaining merges can still end feasibly; ``kept[x]`` counts those ending
    at ``x`` (the kept prefixes of one merge fewer, extended by a gap in ``[h_min,
    h_max]``, then those that cannot end feasibly dropped), in integers: every count is at
    most ``(h_max - h_min + 1) * cap`` until one exceeds ``cap``."""
    x = np.arange(n, dtype=np.int64)
    kept = np.zeros(n, dtype=np.int64)
    kept[0] = 1
    for k in range(m):
        left = m - k - 1
        total = np.concatenate([[0], np.cumsum(kept)])
        # kept[x] <- the sum of kept[x - g] over the gaps g in [h_min, h_max]
        kept = total[np.clip(x - h_min + 1, 0, n)] - total[np.clip(x - h_max, 0, n)]
        kept[~((x + left * h_min <= n - 1) & (x + left * h_max >= n - h_max))] = 0
        if int(kept.sum()) > cap:
            return True
    return False


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
        v = scorer.score(cand, around=best).exact_pct  # neighbours share best's first merges
        i = int(np.argmin(v))
        if not v[i] < best_v - 1e-12:
            break
        best, best_v = cand[i].copy(), float(v[i])
        rounds += 1
    return best, best_v, rounds


def oracle_score(
    episode: Episode,
    merges: int,
    params: EnvParams,
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
        whose sync-excess is an upper bound on the exact optimum; ``exact_optimum`` is
        False only then. ``lower_bound_pct`` is a certified lower bound on the exact
        optimum (:func:`diloco_gym.eval.lower_bound.lower_bound_pct`) when the status is
        :data:`ORACLE_BOUND`, else the optimum itself: the optimum lies in
        ``[lower_bound_pct, exact_pct]``. ``additive_optimum_pct`` is the exact replay of
        the additive optimum itself.
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
        "lower_bound_pct": _certified_lower(scorer, merges, best_v)
        if status == ORACLE_BOUND
        else best_v,
        "additive_pct": float(scorer.cost[best].sum() * scorer.pct),
        "exact_optimum": status != ORACLE_BOUND,
        "status": status,
        "additive_optimum_pct": base,
        "search_rounds": rounds,
    }
    cache[key] = {**out, "schedule": best.copy()}
    return out


def _certified_lower(scorer: EpisodeScorer, merges: int, best_v: float) -> float:
    """The certified lower bound of :mod:`diloco_gym.eval.lower_bound` for this episode and
    budget (its per-decision credits computed once per scorer), checked against the best
    exact schedule found: a bound above a scored schedule would disprove the proof.

    On a fleet (a scorer of ``sites``, each an :class:`EpisodeScorer`) the bound is the
    sites' bounds weighted by their requests: the least fleet excess of any schedule is at
    least the sum of each site's least excess, each at least its bound. A one-site fleet's
    bound is its site's, the single host's. With changing links a site's merges differ in
    window by decision (a :class:`~diloco_gym.eval.scorer.MixedScorer`): each decision's
    credits are its own merge's (:func:`~diloco_gym.eval.lower_bound.scorer_credits`)."""
    sites = getattr(scorer, "sites", None)
    if isinstance(scorer.episode, Episode):
        lower = _site_lower(scorer, merges)
    elif sites and all(isinstance(s, EpisodeScorer | MixedScorer) for s in sites):
        if len(sites) == 1:
            lower = _site_lower(sites[0], merges)
        else:
            lower = 0.0
            for site, n in zip(sites, scorer.n_requests, strict=True):
                lower += _site_lower(site, merges) * float(n) / scorer.total
    else:
        return float("nan")
    if lower > best_v + 1e-9:
        raise RuntimeError(
            f"the certified lower bound {lower:.6f} pp is above a scored schedule's "
            f"{best_v:.6f} pp at {merges} merges: the bound's monotonicity premise fails"
        )
    return lower


def _site_lower(scorer: EpisodeScorer | MixedScorer, merges: int) -> float:
    """One episode's certified lower bound (pp of its requests) at ``merges`` merges."""
    from diloco_gym.eval.lower_bound import lower_bound_pct, scorer_credits

    credits = scorer.__dict__.get("_pair_credits")
    if credits is None:
        credits = scorer_credits(scorer)
        scorer.__dict__["_pair_credits"] = credits
    return lower_bound_pct(scorer.episode, merges, scorer.params, scorer.sidecar, credits=credits)


def oracle_excess(
    episode: Episode, merges: int, params: EnvParams, sidecar: SidecarParams
) -> tuple[float, np.ndarray]:
    """Exact sync-excess (pp) of the offline oracle's schedule at exactly ``merges`` merges
    (see :func:`oracle_score`)."""
    o = oracle_score(episode, merges, params, sidecar)
    return o["exact_pct"], o["schedule"]
