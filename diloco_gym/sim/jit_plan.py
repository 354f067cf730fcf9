"""The causal planner's compiled dynamic programme
(:class:`diloco_gym.agents.planner.CausalPlanner`), compiled with numba (``cache=True``, one
thread) as :mod:`diloco_gym.sim.jit`; imported on first use
(:func:`diloco_gym.sim.compiled_plan`).

At every decision it is asked, the planner places its remaining merges on the expected cost
of each remaining decision by an exact budget DP: ``m_left`` passes of a sliding-window
minimum over the decisions left (:func:`plan_first`, a monotone deque per pass, so the work
is ``O(m_left * decisions left)``). The phase filter and the cost forecast are NumPy
(:mod:`diloco_gym.agents.planner`): a sealed agent's worker has no on-disk cache of
compiled code, so each compiled function it calls is compiled again in every run, and
this one is the only loop NumPy would run slowly.
"""

from __future__ import annotations

import numpy as np

from diloco_gym.sim.jit_cache import njit

__all__ = ["plan_first"]


@njit(cache=True)
def _window_min_deque(val, h_min, h_max, r, out, idx):  # pragma: no cover - compiled
    """``out[i] = min(val[i + h_min .. i + h_max])`` (``inf`` when the window is past
    ``r``) for ``i = -h_max .. r - 1`` stored at ``out[i + h_max]``, by a monotone deque."""
    head = 0
    tail = 0
    nxt = r - 1  # the next value to push, going backwards
    for i in range(r - 1, -h_max - 1, -1):
        lo = i + h_min
        hi = i + h_max
        while nxt >= lo and nxt >= 0:
            if nxt <= hi:
                v = val[nxt]
                while tail > head and val[idx[tail - 1]] >= v:
                    tail -= 1
                idx[tail] = nxt
                tail += 1
            nxt -= 1
        while tail > head and idx[head] > hi:
            head += 1
        out[i + h_max] = val[idx[head]] if tail > head else np.inf
    return 0


@njit(cache=True)
def plan_first(cost, gap, h_min, h_max, m_left, pace, early, scratch):  # pragma: no cover
    """The exact budget plan on ``cost`` (the expected cost of a merge at each decision from
    now to the episode's end, ``r = cost.size`` decisions), after a merge ``gap`` decisions
    ago with ``m_left`` merges to place: the offset from now of the plan's first merge, or
    -1 when no feasible plan exists (or no merge is left).

    Feasible plans are the env's: gaps in ``[h_min, h_max]`` between merges (from the last
    one), and the last merge less than ``h_max`` decisions before the episode's last
    decision. ``g[j, i]``: the least cost of ``j`` more merges after one at offset ``i``
    (``i >= -h_max``). The first merge's choice adds ``early`` per decision that its gap
    falls short of ``pace`` (0: none; the planner's early-merge penalty, docs/planner.md).
    Ties (to ``1e-9`` of the costs' scale) go to the first merge whose
    gap is nearest ``pace`` decisions (an even pace: a flat forecast then spreads the
    merges instead of spending them at once), and with ``pace <= 0`` to the earliest merge,
    as in :func:`diloco_gym.sim.schedules.optimal_schedule`. ``scratch``: float64, at least
    ``2 * (r + h_max + 1)`` (and an int64 deque is allocated here)."""
    r = cost.size
    if m_left <= 0 or r <= 0 or scratch.size < 2 * (r + h_max + 1) or gap < 0 or gap > h_max:
        return -1
    width = r + h_max
    g = scratch[:width]  # g[i + h_max]: the value after a merge at offset i
    val = scratch[width : width + r]
    idx = np.empty(r + 1, dtype=np.int64)
    # j = 0: done, if the tail after offset i is short enough: (r - 1) - i < h_max.
    for i in range(-h_max, r):
        g[i + h_max] = 0.0 if (r - 1) - i < h_max else np.inf
    for _ in range(m_left - 1):
        for i in range(r):
            val[i] = cost[i] + g[i + h_max]
        _window_min_deque(val, h_min, h_max, r, g, idx)
    # The first merge after the last one (offset -gap), on cost + g_(m_left - 1): the
    # earliest least value (the window minimum of g_(m_left) itself is not needed).
    lo = max(0, h_min - gap)
    hi = min(r - 1, h_max - gap)
    if hi < lo:
        return -1
    for i in range(lo, hi + 1):
        val[i] = cost[i] + g[i + h_max]
    best = np.inf
    arg = -1
    for i in range(lo, hi + 1):
        v = val[i] + early * max(0.0, pace - (i + gap))
        val[i] = v
        if v < best:
            best = v
            arg = i
    if arg < 0 or not np.isfinite(best):
        return -1
    if pace <= 0.0:
        return arg
    scale = 0.0
    for i in range(r):
        scale = max(scale, abs(cost[i]))
    tol = 1e-9 * max(scale * m_left, 1e-300)
    near = arg
    for i in range(lo, hi + 1):
        if val[i] <= best + tol and abs(i + gap - pace) < abs(near + gap - pace):
            near = i
    return near
