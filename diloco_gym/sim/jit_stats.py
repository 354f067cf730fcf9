"""The compiled order statistics: linear-interpolation percentiles bit-identical to
NumPy's default ``np.percentile`` from selections instead of a full partition (the
episode summary's latency percentiles), and a schedule's exact replay with its summary
statistics in one call (:func:`replay_summary_one`, an env's episode summary). Compiled
with numba (``cache=True``) as :mod:`diloco_gym.sim.jit`; imported on first use."""

from __future__ import annotations

import numpy as np

from diloco_gym.sim.jit import replay_rows, slowdown_one
from diloco_gym.sim.jit_cache import njit

__all__ = ["percentiles_linear", "replay_summary_one", "replay_counts_sites"]


@njit(cache=True)
def _select(a, lo, hi, k):  # pragma: no cover - compiled
    """Reorder ``a[lo:hi + 1]`` so that ``a[k]`` holds the value of its sorted position,
    with no larger value before it and no smaller one after it (Hoare's selection with a
    median-of-three pivot; no NaN in ``a``)."""
    while hi > lo:
        mid = (lo + hi) // 2
        x, y, z = a[lo], a[mid], a[hi]
        if x > y:
            x, y = y, x
        if y > z:
            y = x if x > z else z
        pivot = y
        i = lo
        j = hi
        while i <= j:
            while a[i] < pivot:
                i += 1
            while a[j] > pivot:
                j -= 1
            if i <= j:
                t = a[i]
                a[i] = a[j]
                a[j] = t
                i += 1
                j -= 1
        if k <= j:
            hi = j
        elif k >= i:
            lo = i
        else:
            return


@njit(cache=True)
def percentiles_linear(x, q, out):  # pragma: no cover - compiled
    """``out[j]``: the linear-interpolation quantile ``q[j]`` (a fraction in [0, 1]) of the
    non-empty 1-D ``x``, bit-identical to ``np.percentile(x, 100 * q[j])``: the same virtual
    index ``(n - 1) * q``, the same neighbours (both the largest value from index ``n - 1``
    on, the lower one then counted as ``-1``) and the same interpolation (from the lower
    value below a weight of 0.5, from the upper one from 0.5 on). NaN when ``x`` holds a
    NaN. ``x`` is left as it is; the order statistics come from selections on a copy (the
    upper neighbour as the smallest value after the lower one)."""
    n = x.size
    for i in range(n):
        if np.isnan(x[i]):
            out[:] = np.nan
            return 0
    a = x.copy()
    last = -1  # a[last] is in its sorted place, nothing smaller after it
    for j in np.argsort(q):
        vi = (n - 1) * q[j]
        if vi >= n - 1:
            prev = -1.0
            lo_i = n - 1
            hi_i = n - 1
        else:
            prev = np.floor(vi)
            lo_i = int(prev)
            hi_i = lo_i + 1
        if lo_i > last:
            _select(a, last + 1, n - 1, lo_i)
            last = lo_i
        lo_v = a[lo_i]
        hi_v = lo_v
        if hi_i > lo_i:  # the next order statistic: the smallest value after lo_i
            hi_v = a[hi_i]
            for i in range(hi_i + 1, n):
                if a[i] < hi_v:
                    hi_v = a[i]
        gamma = vi - prev
        diff = hi_v - lo_v
        if gamma >= 0.5:
            out[j] = hi_v - diff * (1.0 - gamma)
        else:
            out[j] = lo_v + diff * gamma
    return 0


@njit(cache=True)
def _replay_one(
    base_s, req_bin, pressure_bin, starts, w, gain, sync_slowdown, cap, slots, slo_s, latency,
    violated, active,
):  # pragma: no cover - compiled  # fmt: skip
    """The exact replay of one schedule into ``latency``, ``violated`` and ``active``
    (``(1, requests)`` each): the merge windows of the merges starting at bins ``starts``
    (``w`` bins each, cut at the last bin), the slowdown per bin (``(1 + gain * P**2) * (1 +
    sync_slowdown * mask)``), the work per bin (``np.bincount`` of ``base_s`` by
    ``req_bin``: summed in request order), then the queue and latencies of
    :func:`diloco_gym.sim.jit.replay_rows`. Returns the violated and the merge-active
    request counts."""
    n_bins = pressure_bin.size
    sync = np.zeros((1, n_bins))
    for k in range(starts.size):
        for j in range(starts[k], min(starts[k] + w, n_bins)):
            sync[0, j] = 1.0
    m = np.empty((1, n_bins))
    work = np.zeros(n_bins)
    for k in range(n_bins):
        m[0, k] = slowdown_one(pressure_bin[k], gain) * (1.0 + sync_slowdown * sync[0, k])
    for i in range(req_bin.size):
        work[req_bin[i]] += base_s[i]
    replay_rows(work, m, cap, base_s, req_bin, sync, slots, slo_s, latency, violated, active)
    hits = 0
    busy = 0
    for i in range(req_bin.size):
        hits += violated[0, i]
        busy += active[0, i]
    return hits, busy


@njit(cache=True)
def replay_summary_one(
    base_s, req_bin, pressure_bin, starts, w, gain, sync_slowdown, cap, slots, slo_s, q, out
):  # pragma: no cover - compiled  # fmt: skip
    """The exact replay of one schedule (:func:`_replay_one`) and its summary statistics,
    in one pass: into ``out`` the violated and the merge-active request counts and the
    linear-interpolation percentiles ``q`` (fractions) of the latencies in milliseconds
    (:func:`percentiles_linear` of ``latency * 1000``; NaN without requests). The same
    operations in the same order as ``diloco_gym.envs.schedule.replay_schedule`` and
    ``ReplayResult.summary``, so every value is bit-identical to theirs."""
    n = req_bin.size
    latency = np.empty((1, n))
    violated = np.empty((1, n), dtype=np.bool_)
    active = np.empty((1, n), dtype=np.bool_)
    hits, busy = _replay_one(
        base_s, req_bin, pressure_bin, starts, w, gain, sync_slowdown, cap, slots, slo_s,
        latency, violated, active,
    )  # fmt: skip
    out[0] = hits
    out[1] = busy
    if q.size == 0:
        return 0
    for i in range(n):
        latency[0, i] = latency[0, i] * 1000.0
    if n == 0:
        out[2:] = np.nan
    else:
        percentiles_linear(latency[0], q, out[2:])
    return 0


@njit(cache=True)
def replay_counts_sites(
    base_s, req_bin, pressure_bin, starts, w, gain, sync_slowdown, cap, slots, slo_s, out
):  # pragma: no cover - compiled  # fmt: skip
    """:func:`_replay_one` of one schedule (merges at bins ``starts``) at each site ``i``
    of a fleet: its requests ``base_s[i]`` and ``req_bin[i]``, its ``pressure_bin[i]`` and
    its sidecar's values at ``[i]`` of the other arrays; the violated and the merge-active
    request counts into ``out[i]``. Returns -1, or the first site with a request past its
    last bin or a merge start outside its bins (which this does not replay)."""
    for i in range(len(base_s)):
        n_bins = pressure_bin[i].size
        for k in range(starts.size):
            if starts[k] < 0 or starts[k] > n_bins:
                return i
        rb = req_bin[i]
        for j in range(rb.size):
            if rb[j] >= n_bins:
                return i
        n = rb.size
        hits, busy = _replay_one(
            base_s[i], rb, pressure_bin[i], starts, w, gain[i], sync_slowdown[i], cap[i],
            slots[i], slo_s[i], np.empty((1, n)), np.empty((1, n), dtype=np.bool_),
            np.empty((1, n), dtype=np.bool_),
        )  # fmt: skip
        out[i, 0] = hits
        out[i, 1] = busy
    return -1
