"""The compiled decision step: the kernel's rules for one row of a batch of episodes, fused so
that one decision of an episode is one compiled call.

The rules (written once here, in the order the kernel documents them,
:mod:`diloco_gym.envs.kernel`):

* :func:`options_one`: the corridor and the exact merge budget's masks at a decision;
* :func:`forced_end_one`: where a run of forced deferrals ends;
* :func:`gain_one`: a merge's effective tokens and global loss decrease (the learner model);
* :func:`merge_row`: a merge (its isolated cost, memoised per decision, its gain and the state
  after it, and the schedule recorded);
* :func:`advance_row`: the single-option decisions after a step or a reset;
* :func:`step_row`: one decision (the action taken, the merge, the owed terms, the advance,
  the reward and the mask of the next decision);
* :func:`step_rows`: :func:`step_row` of many rows, then their observations;
* :func:`masks_rows`: the feasible actions of rows;
* :func:`reset_advance`: a reset's advance and its owed terms.

A row's state and constants are columns of small 2D arrays (see :data:`STATE_INT` and
friends); the env keeps them as :class:`diloco_gym.envs.kernel.EnvState` and
:class:`~diloco_gym.envs.kernel.EpisodeBatch`, whose fields are views of these arrays, so
NumPy code and the compiled step read and write the same memory. The step takes the
parameters as two arrays, :data:`INT_PARAMS` and :data:`FLOAT_PARAMS`, built by
:func:`diloco_gym.envs.kernel.step_params`.

The arithmetic is the kernel's, operation for operation (IEEE arithmetic in the same order,
the C library's ``pow``), so a compiled step is bit-identical to the step of diloco-gym 0.5
(``tests/sim/test_jit_step.py`` checks it against the kernel's array form).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from diloco_gym.sim.jit import isolated_cost_one, loss_one, observe_range

__all__ = [
    "STATE_INT",
    "STATE_FLOAT",
    "BATCH_INT",
    "BATCH_FLOAT",
    "INT_PARAMS",
    "FLOAT_PARAMS",
    "STEP_OUT_INT",
    "STEP_OUT_FLOAT",
    "options_one",
    "forced_end_one",
    "gain_one",
    "merge_row",
    "advance_row",
    "step_row",
    "step_range",
    "observe_all",
    "step_rows",
    "masks_rows",
    "reset_advance",
]

#: rows of the state's int64 array and float64 array (one column per episode).
STATE_INT = ("d", "last", "m_left", "n_merges")
STATE_FLOAT = (
    "tokens", "excess_sum", "excess_requests", "progress_sum", "pend_excess", "pend_progress",
)  # fmt: skip
#: rows of the episode constants' int64 and float64 arrays.
BATCH_INT = ("n", "slot", "seed")
BATCH_FLOAT = ("pct", "scale", "max_merges", "thr_sum", "credit")
#: the step's integer and float parameters, in their array order.
INT_PARAMS = (
    "h_min", "h_max", "budget", "skip_forced", "decision_interval", "merge_bins", "horizon",
    "m0_bins",
)  # fmt: skip
FLOAT_PARAMS = (
    "decision_seconds", "drift_s", "merge_overhead_s", "loss_floor", "loss_scale",
    "tokens_scale", "loss_exponent", "loss_clip", "tokens_clip", "staleness_clip_s",
    "excess_weight", "progress_weight", "sigma1", "slo_s", "slots",
)  # fmt: skip
#: per-row outputs of a step: ints and floats.
STEP_OUT_INT = ("merged", "overridden", "truncated", "can_defer", "can_merge", "error")
STEP_OUT_FLOAT = ("excess", "progress", "reward")


@njit(cache=True)
def options_one(d, last, m_left, n, h_min, h_max, budget, reach, prefix):  # pragma: no cover
    """``(can_merge, can_defer)`` at decision ``d < n``: merge iff the gap is ``>= H_min``,
    defer iff it is ``< H_max``; with a budget (``budget >= 0``) a merge must also leave a
    feasible completion (``reach``) and a deferral a feasible next merge (``prefix``, the
    running count of ``reach``), or, with no merges left, a safe tail."""
    gap = d - last
    can_merge = gap >= h_min
    can_defer = gap < h_max
    if budget < 0:
        return can_merge, can_defer
    m1 = max(m_left - 1, 0)
    can_merge = can_merge and m_left > 0 and reach[m1, min(d, n - 1)]
    lo_c = min(max(d + 1, last + h_min), n)
    hi_c = min(max(min(last + h_max, n - 1) + 1, 0), n)
    if m_left > 0:
        ok = prefix[m1, max(hi_c, lo_c)] - prefix[m1, lo_c] > 0
    else:
        ok = reach[0, min(last, n - 1)]
    return can_merge, can_defer and ok


@njit(cache=True)
def forced_end_one(d, last, n, m_left, h_min, budget, nxt):  # pragma: no cover - compiled
    """The first decision after a forced deferral at ``d`` at which the options can differ
    (or ``n``): ``H_min`` after the last merge below it; with a budget, the next decision
    from which the remaining merges can be placed (``nxt``), or the end with none left."""
    if d - last < h_min:
        return min(n, last + h_min)
    if budget < 0:
        return d + 1
    if m_left > 0:
        return nxt[max(m_left - 1, 0), min(d + 1, n)]
    return n


@njit(cache=True)
def gain_one(gap_s, tokens, thr_sum, fp):  # pragma: no cover - compiled
    """``(effective_tokens, loss_decrease)`` of a merge after ``gap_s`` seconds with
    ``tokens`` in the global model: the drift-discounted tokens of the learners (throughput
    sum ``thr_sum``) and the loss power law before and after them."""
    overhead = fp[2]
    if overhead != 0.0:
        eff = 1.0 / (1.0 + gap_s / fp[1] + overhead / gap_s)
    else:
        eff = 1.0 / (1.0 + gap_s / fp[1])
    added = eff * gap_s * thr_sum
    before = loss_one(tokens, fp[3], fp[4], fp[5], fp[6])
    after = loss_one(tokens + added, fp[3], fp[4], fp[5], fp[6])
    return added, before - after


@njit(cache=True)
def merge_row(
    i, ist, fst, bi, bf, ip, fp, qs, qd, qptr, qrbin, qbase, qm0, thr_in, thr_tail, prefmin,
    memo, sched_d, sched_c, buf,
):  # pragma: no cover - compiled  # fmt: skip
    """Merge now in row ``i``: its isolated cost (``memo[slot, d]``, computed from the slot's
    cost queue when NaN and kept; a memo without columns: always computed), the learners'
    gain, and the state after it; the merge is recorded in ``sched_d``/``sched_c`` when they
    have columns. Returns ``(excess term,
    gain)``: the cost times the reward scale, and the loss decrease times the credit."""
    d = ist[0, i]
    slot = bi[1, i]
    added, gain = gain_one((d - ist[1, i]) * fp[0], fst[0, i], bf[3, i], fp)
    gain = gain * bf[4, i]
    fst[0, i] = fst[0, i] + added
    memo_ok = memo.shape[1] > 0
    c = memo[slot, d] if memo_ok else np.nan
    if c != c:
        a = d * ip[4]
        pre = thr_in.shape[1] > 0
        ti = thr_in[slot] if pre else thr_in[0]
        tt = thr_tail[slot] if pre else thr_tail[0]
        c = isolated_cost_one(
            qs[slot], qd[slot], qptr[slot], qrbin[slot], qbase[slot], qm0[slot], ip[7], ti, tt,
            a, prefmin[slot, d], ip[5], ip[6], fp[12], fp[13], fp[14], buf,
        )  # fmt: skip
        if memo_ok:
            memo[slot, d] = c
    k = ist[3, i]
    if sched_d.shape[1] > 0:
        sched_d[i, k] = d
        sched_c[i, k] = c
    ist[1, i] = d
    ist[2, i] = ist[2, i] - 1
    ist[3, i] = k + 1
    fst[1, i] = fst[1, i] + c * bf[0, i]
    fst[2, i] = fst[2, i] + c
    fst[3, i] = fst[3, i] + gain
    return c * bf[1, i], gain


@njit(cache=True)
def advance_row(
    i, ist, fst, bi, bf, ip, fp, reach, prefix, nxt, qs, qd, qptr, qrbin, qbase, qm0, thr_in,
    thr_tail, prefmin, memo, sched_d, sched_c, buf,
):  # pragma: no cover - compiled  # fmt: skip
    """Apply the single-option decisions of row ``i`` until it has a real choice or its
    episode ends. Returns ``(excess, progress, error)``: the merges' terms, and 1 when a
    decision had no feasible action (impossible with a validated budget)."""
    ex = 0.0
    pr = 0.0
    n = bi[0, i]
    d = ist[0, i]
    while d < n:
        can_merge, can_defer = options_one(
            d, ist[1, i], ist[2, i], n, ip[0], ip[1], ip[2], reach, prefix
        )
        if can_merge and can_defer:
            break
        if not can_merge and not can_defer:
            return ex, pr, 1
        if can_merge:
            e, g = merge_row(
                i, ist, fst, bi, bf, ip, fp, qs, qd, qptr, qrbin, qbase, qm0, thr_in, thr_tail,
                prefmin, memo, sched_d, sched_c, buf,
            )  # fmt: skip
            ex += e
            pr += g
            d += 1
        else:
            d = forced_end_one(d, ist[1, i], n, ist[2, i], ip[0], ip[2], nxt)
        ist[0, i] = d
    return ex, pr, 0


@njit(cache=True)
def step_row(
    i, want, ist, fst, bi, bf, ip, fp, reach, prefix, nxt, qs, qd, qptr, qrbin, qbase, qm0,
    thr_in, thr_tail, prefmin, memo, sched_d, sched_c, buf, oi, of,
):  # pragma: no cover - compiled  # fmt: skip
    """One decision of row ``i`` (``want``: the agent asks to merge): the action taken (a
    merge when asked and allowed or when deferring is not allowed), its merge, the terms
    owed since the reset, the next decision, the forced decisions after it
    (``skip_forced``), the reward and the mask at the next decision, into ``oi[i]``
    (:data:`STEP_OUT_INT`) and ``of[i]`` (:data:`STEP_OUT_FLOAT`)."""
    n = bi[0, i]
    d = ist[0, i]
    can_merge, can_defer = options_one(
        d, ist[1, i], ist[2, i], n, ip[0], ip[1], ip[2], reach, prefix
    )
    merge = (want and can_merge) or not can_defer
    ex = 0.0
    pr = 0.0
    if merge:
        ex, pr = merge_row(
            i, ist, fst, bi, bf, ip, fp, qs, qd, qptr, qrbin, qbase, qm0, thr_in, thr_tail,
            prefmin, memo, sched_d, sched_c, buf,
        )  # fmt: skip
    ex += fst[4, i]
    pr += fst[5, i]
    fst[4, i] = 0.0
    fst[5, i] = 0.0
    ist[0, i] = d + 1
    err = 0
    if ip[3]:
        e2, p2, err = advance_row(
            i, ist, fst, bi, bf, ip, fp, reach, prefix, nxt, qs, qd, qptr, qrbin, qbase, qm0,
            thr_in, thr_tail, prefmin, memo, sched_d, sched_c, buf,
        )  # fmt: skip
        ex += e2
        pr += p2
    d = ist[0, i]
    oi[i, 0] = merge
    oi[i, 1] = merge != want
    oi[i, 2] = d >= n
    if d < n:
        can_merge, can_defer = options_one(
            d, ist[1, i], ist[2, i], n, ip[0], ip[1], ip[2], reach, prefix
        )
        oi[i, 3] = can_defer
        oi[i, 4] = can_merge
    else:
        oi[i, 3] = 1
        oi[i, 4] = 1
    oi[i, 5] = err
    of[i, 0] = ex
    of[i, 1] = pr
    of[i, 2] = -fp[10] * ex + fp[11] * pr


@njit(cache=True)
def step_range(
    rows, want, ist, fst, bi, bf, ip, fp, reach, prefix, nxt, qs, qd, qptr, qrbin, qbase, qm0,
    thr_in, thr_tail, prefmin, memo, sched_d, sched_c, oi, of, k0, k1,
):  # pragma: no cover - compiled  # fmt: skip
    """:func:`step_row` of rows ``rows[k]`` for ``k0 <= k < k1`` (``want[k]``), with a scratch
    buffer of its own. Returns the first of them whose step had no feasible action, or -1."""
    buf = np.empty(max(ip[6], 1))
    bad = -1
    for k in range(k0, k1):
        i = rows[k]
        step_row(
            i, want[k], ist, fst, bi, bf, ip, fp, reach, prefix, nxt, qs, qd, qptr, qrbin,
            qbase, qm0, thr_in, thr_tail, prefmin, memo, sched_d, sched_c, buf, oi, of,
        )  # fmt: skip
        if oi[i, 5] and bad < 0:
            bad = i
    return bad


@njit(cache=True)
def observe_all(ist, fst, bi, bf, thr, ip, fp, exo, obs):  # pragma: no cover - compiled
    """The observation of every row into ``obs`` (:func:`diloco_gym.sim.jit.observe_range`
    on the state's and the batch's arrays) when ``obs`` has rows."""
    if obs.shape[0] > 0:
        observe_range(
            ist[0], ist[1], bi[0], ist[3], ist[2], bi[1], fst[0], thr, bf[2], exo, ip[0],
            ip[1], fp[0], ip[2], fp[3], fp[4], fp[5], fp[6], fp[7], fp[8], fp[9], obs, 0,
            obs.shape[0],
        )  # fmt: skip
    return 0


@njit(cache=True)
def step_rows(
    rows, want, ist, fst, bi, bf, thr, ip, fp, reach, prefix, nxt, qs, qd, qptr, qrbin, qbase,
    qm0, thr_in, thr_tail, prefmin, memo, sched_d, sched_c, oi, of, exo, obs,
):  # pragma: no cover - compiled  # fmt: skip
    """:func:`step_row` of each row in ``rows`` (``want[k]`` for ``rows[k]``), then, when
    ``obs`` has rows, the observation of every row into it (:func:`observe_all`). Returns
    the first row whose step had no feasible action, or -1."""
    bad = step_range(
        rows, want, ist, fst, bi, bf, ip, fp, reach, prefix, nxt, qs, qd, qptr, qrbin, qbase,
        qm0, thr_in, thr_tail, prefmin, memo, sched_d, sched_c, oi, of, 0, rows.size,
    )  # fmt: skip
    observe_all(ist, fst, bi, bf, thr, ip, fp, exo, obs)
    return bad


@njit(cache=True)
def masks_rows(rows, ist, bi, ip, reach, prefix, out):  # pragma: no cover - compiled
    """``out[i] = (can_defer, can_merge)`` of each row ``i`` in ``rows`` (:func:`options_one`);
    a row whose episode has ended allows both."""
    for k in range(rows.size):
        i = rows[k]
        n = bi[0, i]
        d = ist[0, i]
        if d >= n:
            out[i, 0] = True
            out[i, 1] = True
            continue
        can_merge, can_defer = options_one(
            d, ist[1, i], ist[2, i], n, ip[0], ip[1], ip[2], reach, prefix
        )
        out[i, 0] = can_defer
        out[i, 1] = can_merge
    return 0


@njit(cache=True)
def reset_advance(
    rows, ist, fst, bi, bf, ip, fp, reach, prefix, nxt, qs, qd, qptr, qrbin, qbase, qm0,
    thr_in, thr_tail, prefmin, memo, sched_d, sched_c,
):  # pragma: no cover - compiled  # fmt: skip
    """The forced decisions at the start of the episodes of ``rows`` (:func:`advance_row`),
    their terms owed to the first step (``pend_excess``, ``pend_progress``). Returns the first
    row where a decision had no feasible action, or -1."""
    buf = np.empty(max(ip[6], 1))
    bad = -1
    for k in range(rows.size):
        i = rows[k]
        ex, pr, err = advance_row(
            i, ist, fst, bi, bf, ip, fp, reach, prefix, nxt, qs, qd, qptr, qrbin, qbase, qm0,
            thr_in, thr_tail, prefmin, memo, sched_d, sched_c, buf,
        )  # fmt: skip
        fst[4, i] = ex
        fst[5, i] = pr
        if err and bad < 0:
            bad = i
    return bad
