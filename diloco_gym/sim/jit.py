"""The compiled rules: the hot arithmetic of the sidecar queue and the learners, written once
as plain loops and compiled with numba (``@njit(cache=True)``, one thread).

Every function here is the single implementation of its rule; the NumPy-facing wrappers
(:mod:`diloco_gym.sim.sidecar`, :mod:`diloco_gym.envs.episode`, :mod:`diloco_gym.envs.kernel`)
only prepare arguments. The loops do the same IEEE operations in the same order as the
NumPy kernel of diloco-gym 0.4.0 did (elementwise arithmetic, sequential running sums and
minima, NumPy's pairwise order for sums over learners, the C library's ``pow``), so their
results are bit-identical to it (``tests/envs/test_compiled_equivalence.py``).

This module imports numba, so the package imports it lazily (on the first episode, not on
``import diloco_gym``). Compiled code is cached on disk (``cache=True`` through
:func:`diloco_gym.sim.jit_cache.njit`) in a per-user cache directory keyed by the package
version, never beside the installed sources (``NUMBA_CACHE_DIR`` overrides it), so a
read-only install works and a process after the first loads the machine code instead of
compiling it.
"""

from __future__ import annotations

import numpy as np

# The episode builds' rules live in jit_build (this module's size); they are part of the
# compiled rules' namespace, which callers reach through ``compiled()``.
from diloco_gym.sim.jit_build import (  # noqa: F401
    bank_rows,
    cost_queue_range,
    cost_queue_rows,
    episode_core_range,
    episode_core_rows,
    lindley_rows,
    replay_rows,
    slowdown_one,
)
from diloco_gym.sim.jit_cache import njit

__all__ = [
    "sum_first_axis",
    "merged_backlog_rows",
    "isolated_cost_one",
    "isolated_costs",
    "merge_violations_rows",
    "learner_block",
    "loss_one",
]


# ------------------------------------------------------------------ sums over learners
@njit(cache=True)
def _block_sum(x, lo, n):  # pragma: no cover - compiled
    """``x[lo:lo + n].sum()`` for ``n <= 128`` in NumPy's order: sequential below 8
    values, else 8 accumulators combined as a tree, then the rest sequentially."""
    if n < 8:
        res = 0.0
        for i in range(n):
            res += x[lo + i]
        return res
    r0 = x[lo]
    r1 = x[lo + 1]
    r2 = x[lo + 2]
    r3 = x[lo + 3]
    r4 = x[lo + 4]
    r5 = x[lo + 5]
    r6 = x[lo + 6]
    r7 = x[lo + 7]
    i = 8
    while i < n - n % 8:
        r0 += x[lo + i]
        r1 += x[lo + i + 1]
        r2 += x[lo + i + 2]
        r3 += x[lo + i + 3]
        r4 += x[lo + i + 4]
        r5 += x[lo + i + 5]
        r6 += x[lo + i + 6]
        r7 += x[lo + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for j in range(i, n):
        res += x[lo + j]
    return res


@njit(cache=True)
def _pairwise(x, lo, n):  # pragma: no cover - compiled
    """``x[lo:lo + n].sum()`` in NumPy's pairwise order (``pairwise_sum`` in NumPy's
    ``umath`` loops: :func:`_block_sum` up to 128 values, above that the sum of two halves,
    the first rounded down to a multiple of 8). Written with an explicit stack: numba's
    on-disk cache does not support recursive functions."""
    if n <= 128:
        return _block_sum(x, lo, n)
    s_lo = np.empty(64, dtype=np.int64)
    s_n = np.empty(64, dtype=np.int64)
    s_state = np.zeros(64, dtype=np.int64)
    vals = np.empty(64)
    sp = 1
    nv = 0
    s_lo[0] = lo
    s_n[0] = n
    while sp > 0:
        i = sp - 1
        a = s_lo[i]
        m = s_n[i]
        half = m // 2
        half -= half % 8
        if m <= 128:
            vals[nv] = _block_sum(x, a, m)
            nv += 1
            sp -= 1
        elif s_state[i] == 0:
            s_state[i] = 1
            s_lo[sp], s_n[sp], s_state[sp] = a, half, 0
            sp += 1
        elif s_state[i] == 1:
            s_state[i] = 2
            s_lo[sp], s_n[sp], s_state[sp] = a + half, m - half, 0
            sp += 1
        else:
            vals[nv - 2] = vals[nv - 2] + vals[nv - 1]
            nv -= 1
            sp -= 1
    return vals[0]


@njit(cache=True)
def sum_first_axis(x):  # pragma: no cover - compiled
    """Sum of a 1-D array in NumPy's pairwise order (what ``np.sum`` gives on it)."""
    return _pairwise(x, 0, x.size)


# ------------------------------------------------------------------ the merge's queue
@njit(cache=True)
def _backlog_into(s, d, a, w, length, min0, off0, out):  # pragma: no cover - compiled
    """The queue's backlog over ``length`` bins from a merge at bin ``a`` of one row (``s``
    its running sum, ``d`` its cumulative lost capacity), into ``out[:length]``; returns
    the running minimum at each bin in place of nothing (the last one is returned).

    The running sum with the merge is ``S_k + D_min(k, a + w) - D_a (+ off0)``; the backlog
    is that minus its running minimum, which enters at ``min0``.
    """
    da = d[a]
    dw = d[a + w] if length > w else 0.0
    run = min0
    for j in range(length):
        if j < w:
            g = s[a + j] + d[a + j]
        else:
            g = s[a + j] + dw
        g -= da
        g += off0
        if g < run:
            run = g
        out[j] = g - run
    return run


@njit(cache=True)
def merged_backlog_rows(
    s, d, rows, starts, min0, off0, w, length, ends, out, run_ends
):  # pragma: no cover - compiled
    """:func:`_backlog_into` for merges ``k`` (row ``rows[k]``, start ``starts[k]``) into
    ``out[k, :length]``; ``run_ends[k]`` gets the running minimum at offset ``ends[k]``
    (``ends`` may be empty)."""
    m = starts.size
    has_ends = ends.size > 0
    for k in range(m):
        r = rows[k]
        a = starts[k]
        sr = s[r]
        dr = d[r]
        da = dr[a]
        dw = dr[a + w] if length > w else 0.0
        run = min0[k]
        o = off0[k]
        e = ends[k] if has_ends else -1
        for j in range(length):
            if j < w:
                g = sr[a + j] + dr[a + j]
            else:
                g = sr[a + j] + dw
            g -= da
            g += o
            if g < run:
                run = g
            out[k, j] = g - run
            if j == e:
                run_ends[k] = run
    return 0


@njit(cache=True)
def _count(
    ptr, rbin, base, m0, m0_bins, thr_in, thr_tail, a, w, length, bl, sigma1, slo_s, slots
):  # pragma: no cover - compiled
    """Requests of one row arriving in bins ``[a, a + length)`` whose backlog under the
    merge (``bl``, from offset 0) exceeds their SLO threshold ``(slo / m - base) * slots``,
    ``m`` the no-merge slowdown times ``sigma1`` (= ``1 + sync_slowdown``) inside the
    window ``[a, a + w)``. ``thr_in``/``thr_tail``: precomputed thresholds (empty: computed
    here from ``m0``, kept every ``m0_bins`` bins, and ``base``)."""
    lo = ptr[a]
    hi = ptr[a + length]
    pre = thr_in.size > 0
    hits = 0
    last = np.nan
    q = 0.0
    for i in range(lo, hi):
        j = rbin[i] - a
        if pre:
            thr = thr_in[i] if j < w else thr_tail[i]
        else:
            slow = m0[rbin[i] // m0_bins]
            if j < w:
                slow = slow * sigma1
            if slow != last:  # the slowdown changes every few bins: divide once per value
                last = slow
                q = slo_s / slow
            thr = (q - base[i]) * slots
        if bl[j] > thr:
            hits += 1
    return hits


@njit(cache=True)
def merge_violations_rows(
    ptr, rbin, base, m0, m0_bins, thr_in, thr_tail, rows, starts, bl, w, lengths, sigma1,
    slo_s, slots, out,
):  # pragma: no cover - compiled  # fmt: skip
    """:func:`_count` of merges ``k`` with backlog ``bl[k]`` over ``lengths[k]`` bins."""
    pre = thr_in.shape[1] > 0
    for k in range(starts.size):
        r = rows[k]
        ti = thr_in[r] if pre else thr_in[0]
        tt = thr_tail[r] if pre else thr_tail[0]
        out[k] = _count(
            ptr[r], rbin[r], base[r], m0[r], m0_bins, ti, tt, starts[k], w, lengths[k], bl[k],
            sigma1, slo_s, slots,
        )  # fmt: skip
    return 0


@njit(cache=True)
def isolated_cost_one(
    s, d, ptr, rbin, base, m0, m0_bins, thr_in, thr_tail, a, min0, w, h, sigma1, slo_s, slots,
    buf,
):  # pragma: no cover - compiled  # fmt: skip
    """The isolated cost of one merge at bin ``a`` of one row: its backlog over the cost
    horizon ``h`` (:func:`_backlog_into`, from the no-merge minimum ``min0``) and the
    requests it pushes over their SLO (:func:`_count`). ``buf``: scratch of >= ``h``."""
    _backlog_into(s, d, a, w, h, min0, 0.0, buf)
    return _count(
        ptr, rbin, base, m0, m0_bins, thr_in, thr_tail, a, w, h, buf, sigma1, slo_s, slots
    )


@njit(cache=True)
def isolated_range(
    s, d, ptr, rbin, base, m0, m0_bins, thr_in, thr_tail, rows, starts, min0, w, h, sigma1,
    slo_s, slots, out, k0, k1,
):  # pragma: no cover - compiled  # fmt: skip
    """:func:`isolated_cost_one` of merges ``k0 <= k < k1`` (row ``rows[k]``, start
    ``starts[k]``) into ``out[k]``, with a scratch buffer of its own."""
    buf = np.empty(max(h, 1))
    pre = thr_in.shape[1] > 0
    for k in range(k0, k1):
        r = rows[k]
        ti = thr_in[r] if pre else thr_in[0]
        tt = thr_tail[r] if pre else thr_tail[0]
        out[k] = isolated_cost_one(
            s[r], d[r], ptr[r], rbin[r], base[r], m0[r], m0_bins, ti, tt, starts[k], min0[k],
            w, h, sigma1, slo_s, slots, buf,
        )  # fmt: skip
    return 0


@njit(cache=True)
def isolated_costs(
    s, d, ptr, rbin, base, m0, m0_bins, thr_in, thr_tail, rows, starts, min0, w, h, sigma1,
    slo_s, slots, out,
):  # pragma: no cover - compiled  # fmt: skip
    """:func:`isolated_cost_one` of merges ``k`` (row ``rows[k]``, start ``starts[k]``)."""
    return isolated_range(
        s, d, ptr, rbin, base, m0, m0_bins, thr_in, thr_tail, rows, starts, min0, w, h,
        sigma1, slo_s, slots, out, 0, starts.size,
    )  # fmt: skip


# ------------------------------------------------------------------ the learners
@njit(cache=True)
def _clip01(v):  # pragma: no cover - compiled
    """``np.clip(v, 0.0, 1.0)`` as NumPy computes it (``max`` then ``min``, the second
    operand on ties, so ``-0.0`` becomes ``0.0``)."""
    v = v if v > 0.0 else 0.0
    return v if v < 1.0 else 1.0


@njit(cache=True)
def loss_one(tokens, floor, scale, tokens_scale, exponent):  # pragma: no cover - compiled
    """``floor + scale * (1 + tokens / tokens_scale) ** -exponent`` (the loss power law)."""
    return floor + scale * (1.0 + tokens / tokens_scale) ** (-exponent)


@njit(cache=True)
def loss_rows(tokens, floor, scale, tokens_scale, exponent, out):  # pragma: no cover
    """:func:`loss_one` of each value of ``tokens`` (1-D) into ``out``."""
    for i in range(tokens.size):
        out[i] = loss_one(tokens[i], floor, scale, tokens_scale, exponent)
    return 0


@njit(cache=True)
def learner_row(
    gap, tok, thr, floor, scale, tokens_scale, exponent, loss_clip, tokens_clip,
    staleness_clip_s, lp, tk, out,
):  # pragma: no cover - compiled  # fmt: skip
    """The learner block of one observation: after ``gap`` seconds since the last merge with
    ``tok`` tokens in the global model and learner throughputs ``thr`` (ascending), mean and
    minimum clipped loss progress, mean and minimum clipped tokens, and clipped staleness,
    into ``out[:5]`` (float32); ``lp``, ``tk``: scratch of ``thr.size``."""
    k = thr.size
    now = loss_one(tok, floor, scale, tokens_scale, exponent)
    for i in range(k):
        tau = thr[i] * gap
        x = ((tau + tok) / tokens_scale + 1.0) ** (-exponent)
        x = x * scale + floor
        lp[i] = _clip01((now - x) / loss_clip)
        tk[i] = _clip01(tau / tokens_clip)
    out[0] = _pairwise(lp, 0, k) / k
    out[1] = lp[0]
    out[2] = _pairwise(tk, 0, k) / k
    out[3] = tk[0]
    out[4] = _clip01(gap / staleness_clip_s)


@njit(cache=True)
def learner_block(
    gaps_s, tokens, thr, floor, scale, tokens_scale, exponent, loss_clip, tokens_clip,
    staleness_clip_s, out,
):  # pragma: no cover - compiled  # fmt: skip
    """:func:`learner_row` of rows ``b`` (``gaps_s[b]``, ``tokens[b]``, ``thr[b]``) into
    ``out[b, :5]``."""
    k = thr.shape[1]
    lp = np.empty(k)
    tk = np.empty(k)
    for b in range(gaps_s.size):
        learner_row(
            gaps_s[b], tokens[b], thr[b], floor, scale, tokens_scale, exponent, loss_clip,
            tokens_clip, staleness_clip_s, lp, tk, out[b],
        )  # fmt: skip
    return 0


# ------------------------------------------------------------------ the observation
@njit(cache=True)
def observe_range(
    d, last, n, n_merges, m_left, slot, tokens, thr, max_merges, exo, h_min, h_max,
    decision_seconds, budget, floor, scale, tokens_scale, exponent, loss_clip, tokens_clip,
    staleness_clip_s, out, b0, b1,
):  # pragma: no cover - compiled  # fmt: skip
    """The observation of rows ``b0 <= b < b1`` into ``out[b]`` (float32, the order of
    ``observation.OBS_FEATURES``): gap and corridor, the learner block (:func:`learner_block`), the
    exogenous block of the episode in bank slot ``slot[b]`` at decision ``min(d, n - 1)``,
    merges so far over ``max_merges``, the fraction of decisions left and the merge budget
    left (``budget`` < 0: no budget, the feature is 1; 0: it is 0). The terminal
    observation (``d == n``) repeats the last decision's exogenous features."""
    lp = np.empty(thr.shape[1])
    tk = np.empty(thr.shape[1])
    for b in range(b0, b1):
        nb = n[b]
        dc = min(d[b], nb)
        gap = dc - last[b]
        row = out[b]
        row[0] = min(1.0, gap / h_max)
        row[1] = 1.0 if gap >= h_min else 0.0
        learner_row(
            min(gap, h_max) * decision_seconds, tokens[b], thr[b], floor, scale,
            tokens_scale, exponent, loss_clip, tokens_clip, staleness_clip_s, lp, tk,
            row[2:7],
        )  # fmt: skip
        e = exo[slot[b], min(d[b], nb - 1)]
        for j in range(7):
            row[7 + j] = e[j]
        row[14] = min(1.0, n_merges[b] / max_merges[b])
        row[15] = (nb - dc) / nb
        if budget > 0:
            row[16] = m_left[b] / budget
        else:
            row[16] = 0.0 if budget == 0 else 1.0
    return 0


@njit(cache=True)
def observe_rows(
    d, last, n, n_merges, m_left, slot, tokens, thr, max_merges, exo, h_min, h_max,
    decision_seconds, budget, floor, scale, tokens_scale, exponent, loss_clip, tokens_clip,
    staleness_clip_s, out,
):  # pragma: no cover - compiled  # fmt: skip
    """The observation of rows ``b`` into ``out[b]`` (:func:`observe_range` of all rows)."""
    return observe_range(
        d, last, n, n_merges, m_left, slot, tokens, thr, max_merges, exo, h_min, h_max,
        decision_seconds, budget, floor, scale, tokens_scale, exponent, loss_clip, tokens_clip,
        staleness_clip_s, out, 0, d.size,
    )  # fmt: skip


# ------------------------------------------------------------------ causal filters
@njit(cache=True)
def iir1_rows(b0, a1, x, out):  # pragma: no cover - compiled
    """The first-order IIR filter ``y[n] = b0 * x[n] - a1 * y[n - 1]`` (``y[-1] = 0``) of
    each row of ``x`` into ``out``: ``scipy.signal.lfilter([b0], [1, a1], x, axis=-1)``
    with the same operations in the same order as scipy's direct form II transposed loop
    (``y = z + b0 * x``; ``z = x * 0.0 - y * a1``), so the values are bit-identical to it
    (checked in ``tests/sim/test_jit.py``). Used for the AR(1) pressure series and the
    rate EWMAs of an episode build."""
    for r in range(x.shape[0]):
        z = 0.0
        for n in range(x.shape[1]):
            xn = x[r, n]
            yn = z + b0 * xn
            z = xn * 0.0 - yn * a1
            out[r, n] = yn
    return 0


# ------------------------------------------------------------------ synthetic traces
@njit(cache=True)
def lift_sorted(t, onsets, ramp, burst, out):  # pragma: no cover - compiled
    """The burst level at the sorted times ``t`` into ``out``: the largest over bursts of 1
    on the plateau ``[onset, onset + burst)`` and, when ``ramp`` is not 0, the ramp
    ``(t - (onset - ramp)) / ramp`` on ``[onset - ramp, onset)``; 0 elsewhere."""
    for i in range(t.size):
        out[i] = 0.0
    for k in range(onsets.size):
        onset = onsets[k]
        lo = onset - ramp
        r0 = np.searchsorted(t, lo)
        p0 = np.searchsorted(t, onset)
        p1 = np.searchsorted(t, onset + burst)
        for i in range(p0, p1):
            out[i] = 1.0
        if ramp != 0.0:
            for i in range(r0, p0):
                v = (t[i] - lo) / ramp
                if out[i] < v:
                    out[i] = v
    return 0


@njit(cache=True)
def slice_counts(
    t, widths, onsets, bursts, quiet, lift_rps, ramp, burst, cum
):  # pragma: no cover - compiled
    """The cumulative expected arrivals of a window's rate slices into ``cum`` (``cum[0] =
    0``; slice ``k`` has rate ``quiet``, plus ``lift_rps`` times the burst level at its
    centre ``t[k]`` when ``bursts``, over ``widths[k]`` seconds); returns the total."""
    lift = np.empty(t.size)
    if bursts:
        lift_sorted(t, onsets, ramp, burst, lift)
    cum[0] = 0.0
    run = 0.0
    for k in range(t.size):
        rate = quiet + lift_rps * lift[k] if bursts else quiet
        run += rate * widths[k]
        cum[k + 1] = run
    return run


@njit(cache=True)
def _interp_sorted(x, xp, fp, cap, out):  # pragma: no cover - compiled
    """``np.minimum(np.interp(x, xp, fp), cap)`` for ascending ``x`` (NumPy's interpolation
    arithmetic: the slope of the segment times the offset from its left end, plus its left
    value; the end values outside ``xp``)."""
    n = xp.size
    j = 0
    for i in range(x.size):
        v = x[i]
        while j < n and xp[j] <= v:
            j += 1
        j0 = j - 1  # xp[j0] <= v < xp[j0 + 1]
        if j0 < 0:
            y = fp[0]
        elif j0 >= n - 1 or xp[j0] == v:
            y = fp[min(j0, n - 1)]
        else:
            slope = (fp[j0 + 1] - fp[j0]) / (xp[j0 + 1] - xp[j0])
            y = slope * (v - xp[j0]) + fp[j0]
            if np.isnan(y):
                y = slope * (v - xp[j0 + 1]) + fp[j0 + 1]
                if np.isnan(y) and fp[j0] == fp[j0 + 1]:
                    y = fp[j0]
        out[i] = y if y <= cap else cap
    return 0


@njit(cache=True)
def _pressure_row(
    noise, scale, scale0, rho, mean, spike_u, spike_p, length, level, out
):  # pragma: no cover - compiled
    """One pressure series into ``out``: the AR(1) filter (:func:`iir1_rows`' operations,
    ``b0 = 1``, ``a1 = -rho``) of ``noise * scale`` (its first sample also times
    ``scale0``) plus ``mean``, raised to ``level`` for ``length`` samples from every
    sample whose ``spike_u`` is below ``spike_p``, clipped to ``[0, 1]``."""
    n = noise.size
    a1 = -rho
    z = 0.0
    for i in range(n):
        xn = noise[i] * scale
        if i == 0:
            xn = xn * scale0
        yn = z + 1.0 * xn
        z = xn * 0.0 - yn * a1
        out[i] = yn + mean
    for i in range(n):
        if spike_u[i] < spike_p:
            for j in range(i, min(i + length, n)):
                if out[j] < level:
                    out[j] = level
    for i in range(n):
        out[i] = _clip01(out[i])
    return 0


@njit(cache=True)
def synthetic_rows(
    points, offsets, cum, edges, cap, token_u, prompt_table, output_table, token_bits,
    noise, spike_u, scale, scale0, rho, means, spike_p, length, level, arrivals, prompt,
    output, pressure,
):  # pragma: no cover - compiled  # fmt: skip
    """Synthetic traces ``e`` from their random draws: the arrival times of the unit-rate
    points ``points[offsets[e]:offsets[e + 1]]`` mapped through the cumulative expected
    count ``cum[e]`` (time rescaling, :func:`_interp_sorted` onto ``edges``, below
    ``cap``), each request's tokens from its uniform (the top and the low ``token_bits``
    bits of ``token_u * 2**(2 * token_bits)`` index the two quantile tables), and the two
    pressure series of ``noise[e]`` (:func:`_pressure_row`, row ``r`` around
    ``means[r]``). Per-request outputs are the episodes' requests concatenated."""
    full = float(1 << (2 * token_bits))
    low = (1 << token_bits) - 1
    for e in range(offsets.size - 1):
        lo = offsets[e]
        hi = offsets[e + 1]
        _interp_sorted(points[lo:hi], cum[e], edges, cap, arrivals[lo:hi])
        for i in range(lo, hi):
            idx = np.int64(token_u[i] * full)
            prompt[i] = prompt_table[idx >> token_bits]
            output[i] = output_table[idx & low]
        for r in range(2):
            _pressure_row(
                noise[e, r], scale, scale0, rho, means[r], spike_u[e, r], spike_p, length,
                level, pressure[e, r],
            )  # fmt: skip
    return 0
