"""A certified lower bound on the exact optimum of an episode at a budget, for episodes
where the oracle cannot score every schedule.

Why it holds. A merge only ever slows the sidecar: the slowdown per bin grows with the merge
mask, the Lindley backlog is monotone in the work it is fed, and a request's latency grows
with both, so a request violated under a schedule ``S`` is violated under every schedule
that contains ``S`` (and violated without merges stays violated). With ``V_d`` the requests
that one merge at decision ``d`` alone adds to the no-merge violations, every schedule
``S = (s_1 < ... < s_M)`` therefore has

    exact(S) = |violated(S) minus violated(no merge)| >= |union over k of V_{s_k}|
             >= sum over k of |V_{s_k} restricted to the requests arriving in A_k|

for any disjoint sets of requests ``A_k``. Here ``A_k`` is the requests arriving between
decision ``s_k`` and decision ``s_{k+1}`` (before ``s_2`` for the first merge, to the end
for the last), so each term depends only on a merge and the next one: the least total over
every feasible schedule with ``M`` merges is an exact dynamic programme over consecutive
pairs (the corridor as in :func:`~diloco_gym.sim.schedules.optimal_schedule`), and it is a
lower bound on every schedule's exact sync-excess, the optimum's included. Where merges do
not interact, ``V`` of a merge lies before the next merge and the bound is the additive
optimum, which is then exact.

The sets ``V_d`` come from one whole-episode replay per decision
(:func:`~diloco_gym.sim.sidecar.replay`, the replay the protocol's exact scorer is checked
against), in blocks that bound memory; each is run in compiled code
(:func:`diloco_gym.sim.jit_eval.credit_counts`, that replay's arithmetic operation for
operation) and counted by decision there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from diloco_gym.envs.episode import Episode
from diloco_gym.envs.params import EnvParams
from diloco_gym.sim import compiled_eval
from diloco_gym.sim.sidecar import SidecarParams, slowdown

__all__ = ["pair_credits", "scorer_credits", "lower_bound_pct", "chain_bound"]

#: Decisions replayed at once (rows of one replay; bounds memory on long episodes).
_BLOCK = 64


def pair_credits(
    episode: Episode,
    params: EnvParams,
    sidecar: SidecarParams,
    gaps: tuple[int, int] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per decision ``d``, the requests its merge alone adds to the violations, counted by
    the decision interval they arrive in.

    ``gaps``: the next merge's distances ``(lo, hi)`` in decisions that ``window`` covers
    (default the corridor's, ``(h_min, h_max)``).

    Returns:
        ``(before, window, tail)``: ``before[d]`` counts those arriving before decision
        ``d``; ``window[d, w]`` those arriving in decisions ``d .. d' - 1`` for the next
        merge at ``d' = d + lo + w`` (``w`` in ``0 .. hi - lo``; ``d'`` past the end
        counts to the end); ``tail[d]`` those arriving from ``d`` on. ``before[d] +
        tail[d]`` is the merge's isolated excess in requests.
    """
    n = episode.n_decisions
    n_bins = episode.pressure_bin.size
    lo_gap, hi_gap = (params.h_min, params.h_max) if gaps is None else gaps
    width = hi_gap - lo_gap + 1
    base = np.asarray(episode.baseline.violated, dtype=bool)
    before = np.zeros(n, dtype=np.int64)
    window = np.zeros((n, width), dtype=np.int64)
    tail = np.zeros(n, dtype=np.int64)
    # The replay's inputs that do not depend on the merge (as replay() computes them).
    base_s = np.ascontiguousarray(episode.base_s, dtype=np.float64)
    req_bin = np.ascontiguousarray(episode.req_bin, dtype=np.int64)
    work = np.bincount(req_bin, weights=base_s, minlength=n_bins).astype(np.float64)
    m0 = np.ascontiguousarray(slowdown(episode.pressure_bin, None, sidecar), dtype=np.float64)
    counts = np.empty((min(n, _BLOCK), n), dtype=np.int64)
    for lo in range(0, n, _BLOCK):
        rows = np.arange(lo, min(n, lo + _BLOCK))
        compiled_eval().credit_counts(
            rows, int(params.decision_interval), int(params.merge_steps), n, work, m0,
            sidecar.slots * params.step_seconds, 1.0 + sidecar.sync_slowdown, base_s,
            req_bin, sidecar.slots, sidecar.slo_s, base, counts,
        )  # fmt: skip
        counts_r = counts[: rows.size]
        cum = np.zeros((rows.size, n + 1), dtype=np.int64)
        np.cumsum(counts_r, axis=1, out=cum[:, 1:])
        at = cum[np.arange(rows.size), rows]  # arrivals before each row's own decision
        before[rows] = at
        tail[rows] = cum[:, n] - at
        nxt = np.minimum(rows[:, None] + lo_gap + np.arange(width)[None, :], n)
        window[rows] = np.take_along_axis(cum, nxt, axis=1) - at[:, None]
    return before, window, tail


def scorer_credits(
    scorer: Any, gaps: tuple[int, int] | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`pair_credits` of the episode an exact scorer scores: an
    :class:`~diloco_gym.eval.scorer.EpisodeScorer`'s, or a
    :class:`~diloco_gym.eval.scorer.MixedScorer`'s (a fleet site with changing links:
    ``parts`` and ``kind``), whose merge at ``d`` has the window and slowdown of its own
    part, so each decision's credits come from its part's replay. The premise holds as for
    one kind of merge: each merge only adds work, so a request violated under a schedule
    stays violated under one that contains it."""
    parts = getattr(scorer, "parts", None)
    if parts is None:
        return pair_credits(scorer.episode, scorer.params, scorer.sidecar, gaps)
    each = [pair_credits(p.episode, p.params, p.sidecar, gaps) for p in parts]
    kind = np.asarray(scorer.kind, dtype=np.int64)
    d = np.arange(kind.size)
    before, window, tail = (np.stack([c[i] for c in each])[kind, d] for i in range(3))
    return before, window, tail


def lower_bound_pct(
    episode: Episode,
    merges: int,
    params: EnvParams,
    sidecar: SidecarParams,
    credits: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> float:
    """The certified lower bound (pp) on the exact sync-excess of every feasible schedule
    with exactly ``merges`` merges (see the module docstring).

    Raises:
        ValueError: when no feasible schedule has ``merges`` merges.
    """
    n, lo_h, hi_h = episode.n_decisions, params.h_min, params.h_max
    if merges == 0:
        return 0.0
    credits = credits if credits is not None else pair_credits(episode, params, sidecar)
    # the corridor: the first merge within [H_min, H_max] of the start, each next one
    # H_min to H_max later, the last within H_max of the end
    positions = [(lo_h, hi_h)] + [(0, n - 1)] * (merges - 1)
    positions[-1] = (max(positions[-1][0], n - hi_h), positions[-1][1])
    total = chain_bound(credits, lo_h, positions, [(lo_h, hi_h)] * (merges - 1))
    if not np.isfinite(total):
        raise ValueError(f"no feasible schedule has {merges} merges in {n} decisions")
    return float(total * episode.pct_per_request)


def chain_bound(
    credits: tuple[np.ndarray, np.ndarray, np.ndarray],
    gap_lo: int,
    positions: list[tuple[int, int]],
    gaps: list[tuple[int, int]],
) -> float:
    """The least pair-credit total, in requests, over every schedule of ``len(positions)``
    merges whose ``i``-th merge lies in ``positions[i]`` (decisions, inclusive) and whose
    next one follows it by a distance in ``gaps[i]`` (inclusive): the module's bound for
    schedules that keep to those ranges, which need not be a corridor's (a site's syncs on
    a fleet with per-site timing: :func:`diloco_gym.eval.fleet_rounds.rounds_lower_bound`).
    ``credits``: :func:`pair_credits` with ``gaps=(gap_lo, hi)`` covering every range of
    ``gaps``. ``inf`` when no schedule keeps to the ranges; 0 for no merge."""
    before, window, tail = credits
    n = before.size
    r = len(positions)
    if r == 0:
        return 0.0
    d = np.arange(n)

    def allowed(i: int) -> np.ndarray:
        a, b = positions[i]
        return (d >= max(a, 0)) & (d <= min(b, n - 1))

    edge = window.astype(np.float64)  # once: each step reads a view of its columns
    g = np.where(allowed(r - 1), tail, np.inf).astype(np.float64)  # the last merge at d
    for i in range(r - 2, -1, -1):
        a, b = gaps[i]
        nxt = d[:, None] + np.arange(a, b + 1)[None, :]
        nxt_g = np.where(nxt < n, g[np.minimum(nxt, n - 1)], np.inf)
        best = (edge[:, a - gap_lo : b - gap_lo + 1] + nxt_g).min(axis=1)
        g = np.where(allowed(i), best, np.inf)
    return float((before + g).min())
