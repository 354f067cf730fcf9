"""Merge schedules under the corridor: feasibility, counting, uniform sampling, exact optimum.

A schedule is the sorted decision indices ``d_1 < ... < d_M`` of an episode of ``N``
decisions (decision 0 is the episode start, treated as a merge). It is *feasible* when

* ``h_min <= d_k - d_{k-1} <= h_max`` for every merge (with ``d_0 = 0``), and
* no merge is left due at the end: ``(N - 1) - d_M < h_max``, i.e. ``d_M >= N - h_max``.

These are exactly the schedules an agent can produce in the environment, whose corridor
forbids a merge below ``h_min`` and forces one at ``h_max``.

All counts use ``F[m, d]``: the number of feasible completions with ``m`` more merges
after a merge at ``d``. Rows are rescaled to avoid overflow; only ratios within a row are
used for sampling, and ``F > 0`` is exact feasibility.
"""

from __future__ import annotations

import numpy as np

__all__ = ["is_feasible", "budget_range", "completion_counts", "sample_uniform",
           "optimal_schedule", "brute_force_schedules"]


def is_feasible(merges, n: int, h_min: int, h_max: int) -> bool:
    """Whether ``merges`` (decision indices) is a feasible schedule."""
    d = np.concatenate([[0], np.asarray(merges, dtype=np.int64)])
    if np.any(d[1:] >= n):
        return False
    gaps = np.diff(d)
    return bool(np.all((gaps >= h_min) & (gaps <= h_max)) and (n - 1) - d[-1] < h_max)


def _window_sum(row: np.ndarray, h_min: int, h_max: int) -> np.ndarray:
    """``out[d] = sum(row[d + h_min : d + h_max + 1])`` (indices past the end count 0)."""
    n = row.size
    padded = np.concatenate([row, np.zeros(h_max + 1)])
    c = np.concatenate([[0.0], np.cumsum(padded)])
    d = np.arange(n)
    out = c[d + h_max + 1] - c[d + h_min]
    # Exact zeros stay zero (a window of zeros adds nothing to the running sum), but
    # rounding can leave tiny negatives or positives next to large partial sums.
    nz = np.concatenate([[0], np.cumsum(padded > 0)])
    has = (nz[d + h_max + 1] - nz[d + h_min]) > 0
    return np.where(has, np.maximum(out, np.finfo(float).tiny), 0.0)


def completion_counts(n: int, h_min: int, h_max: int, m_max: int) -> np.ndarray:
    """``F[m, d]`` for ``m = 0..m_max``, each row scaled so its maximum is 1 (or all 0).

    ``F[m, 0] > 0`` iff an episode of ``n`` decisions has a feasible schedule with
    exactly ``m`` merges.
    """
    _check(n, h_min, h_max)
    f = np.zeros((m_max + 1, n))
    f[0] = (np.arange(n) >= n - h_max).astype(float)
    for m in range(1, m_max + 1):
        row = _window_sum(f[m - 1], h_min, h_max)
        top = row.max()
        f[m] = row / top if top > 0 else row
    return f


def budget_range(n: int, h_min: int, h_max: int) -> tuple[int, int]:
    """The smallest and largest feasible number of merges in ``n`` decisions."""
    _check(n, h_min, h_max)
    m_hi = (n - 1) // h_min
    f = completion_counts(n, h_min, h_max, m_hi)
    ok = np.flatnonzero(f[:, 0] > 0)
    return int(ok[0]), int(ok[-1])


def _check(n: int, h_min: int, h_max: int) -> None:
    if not (1 <= h_min <= h_max):
        raise ValueError(f"need 1 <= h_min <= h_max, got h_min={h_min}, h_max={h_max}")
    if n < 1:
        raise ValueError(f"need at least one decision, got n={n}")


def sample_uniform(n: int, h_min: int, h_max: int, m: int, k: int,
                   rng: np.random.Generator, counts: np.ndarray | None = None) -> np.ndarray:
    """Draw ``k`` schedules uniformly among all feasible schedules with exactly ``m`` merges.

    Exact: the next merge is drawn with probability proportional to the number of
    feasible completions from it (``F``), so every schedule has probability
    ``1 / F[m, 0]``.

    Returns:
        int array ``(k, m)`` of decision indices, each row sorted.

    Raises:
        ValueError: when no feasible schedule has ``m`` merges (the message gives the range).
    """
    f = counts if counts is not None else completion_counts(n, h_min, h_max, max(m, 0))
    if m < 0 or m >= f.shape[0] or f[m, 0] <= 0:
        lo, hi = budget_range(n, h_min, h_max)
        raise ValueError(f"no feasible schedule has {m} merges in {n} decisions "
                         f"(h_min={h_min}, h_max={h_max}); feasible budgets: {lo}..{hi}")
    out = np.empty((k, m), dtype=np.int64)
    cur = np.zeros(k, dtype=np.int64)
    width = h_max - h_min + 1
    offs = np.arange(width)
    for j in range(m):
        row = np.concatenate([f[m - 1 - j], np.zeros(h_max + 1)])
        w = row[cur[:, None] + h_min + offs[None, :]]  # (k, width)
        cw = np.cumsum(w, axis=1)
        u = rng.random(k) * cw[:, -1]
        pick = (cw <= u[:, None]).sum(axis=1)  # first index with cw > u
        pick = np.minimum(pick, width - 1)
        cur = cur + h_min + pick
        out[:, j] = cur
    return out


def optimal_schedule(cost: np.ndarray, h_min: int, h_max: int,
                     m: int | None = None) -> tuple[np.ndarray, float]:
    """The feasible schedule of least total ``cost`` (exact dynamic programme).

    ``g[d]`` is the least cost of finishing the episode after a merge at ``d``:
    ``g[d] = min(0 if d >= n - h_max else inf, min_{d' in [d+h_min, d+h_max]} cost[d'] + g[d'])``
    (with an exact budget, ``g`` gains a merges-left index). The free-budget recursion runs
    backwards in blocks of ``h_min`` decisions, each block depending only on later ones,
    so the work is ``O(n * (h_max - h_min))`` in vectorised numpy.

    Args:
        cost: cost of a merge at each decision, shape ``(n,)``.
        h_min, h_max: corridor in decisions.
        m: exact number of merges, or ``None`` for the free-budget optimum.

    Returns:
        ``(merges, total_cost)``. With an exact budget ties go to the earliest decision;
        with a free budget to stopping, then to the latest decision (fewer merges).
    """
    cost = np.asarray(cost, dtype=np.float64)
    n = cost.size
    _check(n, h_min, h_max)
    if np.any(~np.isfinite(cost)):
        raise ValueError("cost must be finite")
    tail_ok = np.arange(n) >= n - h_max
    width = h_max - h_min + 1

    if m is None:
        g = np.full(n, np.inf)
        val = np.full(n + h_max + 1, np.inf)  # val[d] = cost[d] + g[d], inf-padded
        win = np.lib.stride_tricks.sliding_window_view(val[h_min:], width)
        d_hi = n
        while d_hi > 0:
            d_lo = max(0, d_hi - h_min)
            best = win[d_lo:d_hi].min(axis=1)
            gb = np.where(tail_ok[d_lo:d_hi], np.minimum(0.0, best), best)
            g[d_lo:d_hi] = gb
            val[d_lo:d_hi] = cost[d_lo:d_hi] + gb
            d_hi = d_lo
        if not np.isfinite(g[0]):
            raise ValueError(f"no feasible schedule in {n} decisions")
        merges = []
        cur = 0
        while True:
            seg = val[cur + h_min: cur + h_max + 1]
            best = seg.min() if seg.size else np.inf
            if tail_ok[cur] and best >= 0.0:
                break
            # Among equally cheap continuations take the latest: fewer merges on ties.
            cur = cur + h_min + (seg.size - 1 - int(np.argmin(seg[::-1])))
            merges.append(cur)
        return np.asarray(merges, dtype=np.int64), float(g[0])

    if m < 0:
        raise ValueError(f"m must be >= 0, got {m}")
    if n * (m + 1) > 60_000_000:
        raise ValueError(f"an exact budget of m={m} over {n} decisions needs too much memory; "
                         f"use m=None (free budget) or a shorter trace")
    g = np.empty((m + 1, n))
    g[0] = np.where(tail_ok, 0.0, np.inf)
    ext = np.full(n + h_max + 1, np.inf)
    win = np.lib.stride_tricks.sliding_window_view(ext[h_min:], width)
    for j in range(1, m + 1):
        ext[:n] = cost + g[j - 1]
        g[j] = win[:n].min(axis=1)
    if not np.isfinite(g[m, 0]):
        lo, hi = budget_range(n, h_min, h_max)
        raise ValueError(f"no feasible schedule has {m} merges in {n} decisions; "
                         f"feasible budgets: {lo}..{hi}")
    merges = np.empty(m, dtype=np.int64)
    cur = 0
    for j in range(m, 0, -1):
        seg = cost[cur + h_min: cur + h_max + 1] + g[j - 1][cur + h_min: cur + h_max + 1]
        cur = cur + h_min + int(np.argmin(seg))
        merges[m - j] = cur
    return merges, float(g[m, 0])


def brute_force_schedules(n: int, h_min: int, h_max: int, m: int | None = None):
    """Every feasible schedule (for tests on tiny instances), as a list of tuples."""
    out = []

    def rec(last: int, acc: list[int]) -> None:
        if (n - 1) - last < h_max and (m is None or len(acc) == m):
            out.append(tuple(acc))
        if m is not None and len(acc) >= m:
            return
        for d in range(last + h_min, min(last + h_max, n - 1) + 1):
            rec(d, acc + [d])

    rec(0, [])
    return out
