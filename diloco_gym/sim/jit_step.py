"""The compiled decision step: the kernel's rules for one row of a batch of episodes, fused so
that one decision of an episode is one compiled call.

The rules (written once here, in the order the kernel documents them,
:mod:`diloco_gym.envs.kernel`):

* :func:`options_one`: the corridor and the exact merge budget's masks at a decision;
* :func:`forced_end_one`: where a run of forced deferrals ends;
* :func:`gain_one`: a merge's effective tokens and global loss decrease (the learner model);
* :func:`cost_of` and :func:`merge_row`: a merge's isolated cost (memoised per decision; a
  fleet's row sums its sites' costs, :func:`sites_cost`) and its gain (with the learners'
  stall of a fleet's syncs, :func:`stalled_work`), the state after it and the schedule
  recorded (:func:`merge_now`: both);
* :func:`advance_row`: the single-option decisions after a step or a reset;
* :func:`step_row`: one decision (the action taken, the merge, the owed terms, the advance,
  the reward and the mask of the next decision);
* :func:`step_rows`: :func:`step_row` of many rows, then their observations;
* :func:`masks_rows`: the feasible actions of rows;
* :func:`reset_advance`: a reset's advance and its owed terms.

A row's state and constants are columns of small 2D arrays (their rows are named in
:mod:`diloco_gym.sim.step_layout`); the env keeps them as
:class:`diloco_gym.envs.kernel.EnvState` and
:class:`~diloco_gym.envs.kernel.EpisodeBatch`, whose fields are views of these arrays, so
NumPy code and the compiled step read and write the same memory. The step takes the
parameters as two arrays, ``INT_PARAMS`` and ``FLOAT_PARAMS``, built by
:func:`diloco_gym.envs.kernel.step_params`.

The arithmetic is the kernel's, operation for operation (IEEE arithmetic in the same order,
the C library's ``pow``), so a compiled step is bit-identical to the step of diloco-gym 0.5
(``tests/sim/test_jit_step.py`` checks it against the kernel's array form).
"""

from __future__ import annotations

import numpy as np

from diloco_gym.sim.fleet import fragment_work_seconds
from diloco_gym.sim.jit import isolated_cost_one, loss_one, observe_range
from diloco_gym.sim.jit_cache import njit
from diloco_gym.sim.step_layout import NEED_COST

__all__ = [
    "options_one",
    "cost_of",
    "sites_cost",
    "stalled_work",
    "work_seconds",
    "reward_one",
    "forced_end_one",
    "gain_one",
    "gain_many",
    "merge_row",
    "merge_now",
    "advance_row",
    "step_row",
    "step_range",
    "observe_all",
    "step_rows",
    "options_many",
    "masks_rows",
    "reset_advance",
]


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
def gain_many(gap_s, tokens, thr_sum, fp, added, decrease):  # pragma: no cover - compiled
    """:func:`gain_one` of each ``(gap_s[k], tokens[k], thr_sum[k])`` into ``added[k]``,
    ``decrease[k]``."""
    for k in range(gap_s.size):
        added[k], decrease[k] = gain_one(gap_s[k], tokens[k], thr_sum[k], fp)
    return 0


@njit(cache=True)
def cost_of(
    i, ist, bi, ip, fp, qs, qd, qptr, qrbin, qbase, qm0, thr_in, thr_tail, prefmin, memo, buf
):  # pragma: no cover - compiled  # fmt: skip
    """The isolated cost of a merge now in row ``i``: ``memo[slot, d]``, else computed from the
    slot's cost queue and kept in the memo (a memo without columns: always computed), or NaN
    when the memo has none and there is no queue (``qs`` without columns: the env computes
    that cost itself and steps again, ``NEED_COST``)."""
    d = ist[0, i]
    slot = bi[1, i]
    if bi[3, i] > 1:
        return sites_cost(
            i, ist, bi, ip, fp, qs, qd, qptr, qrbin, qbase, qm0, thr_in, thr_tail, prefmin,
            memo, buf,
        )  # fmt: skip
    memo_ok = memo.shape[1] > 0
    c = memo[slot, d] if memo_ok else np.nan
    if c == c or qs.shape[1] == 0:
        return c
    pre = thr_in.shape[1] > 0
    ti = thr_in[slot] if pre else thr_in[0]
    tt = thr_tail[slot] if pre else thr_tail[0]
    c = isolated_cost_one(
        qs[slot], qd[slot], qptr[slot], qrbin[slot], qbase[slot], qm0[slot], ip[7], ti, tt,
        d * ip[4], prefmin[slot, d], ip[5], ip[6], fp[12], fp[13], fp[14], buf,
    )  # fmt: skip
    if memo_ok:
        memo[slot, d] = c
    return c


@njit(cache=True)
def sites_cost(
    i, ist, bi, ip, fp, qs, qd, qptr, qrbin, qbase, qm0, thr_in, thr_tail, prefmin, memo, buf
):  # pragma: no cover - compiled  # fmt: skip
    """The cost of a merge now in row ``i`` of a fleet of ``k = bi[3, i]`` sites: the sum,
    in site order from 0.0, of each site's isolated cost (queue slot ``slot * k + j`` of
    site ``j``). The memo holds ``k + 1`` rows per slot: the sum at row ``slot * (k + 1)``,
    then each site's own cost (the site episodes' memos); each is computed once. A memo
    without the sum and no queue: NaN (``NEED_COST``)."""
    d = ist[0, i]
    k = bi[3, i]
    row = bi[1, i] * (k + 1)
    c = memo[row, d]
    if c == c or qs.shape[1] == 0:
        return c
    pre = thr_in.shape[1] > 0
    total = 0.0
    for j in range(k):
        cj = memo[row + 1 + j, d]
        if cj != cj:
            q = bi[1, i] * k + j
            ti = thr_in[q] if pre else thr_in[0]
            tt = thr_tail[q] if pre else thr_tail[0]
            cj = isolated_cost_one(
                qs[q], qd[q], qptr[q], qrbin[q], qbase[q], qm0[q], ip[7], ti, tt, d * ip[4],
                prefmin[q, d], ip[5], ip[6], fp[12], fp[13], fp[14], buf,
            )  # fmt: skip
            memo[row + 1 + j, d] = cj
        total += cj
    memo[row, d] = total
    return total


@njit(cache=True)
def stalled_work(gap_s, stall_s, fp):  # pragma: no cover - compiled
    """Model v1's learner credit of a sync that stalls the learners ``stall_s`` seconds
    (each sync, this one's predecessor included), relative to the kernel's: the work of
    the compute seconds over that of the wall-clock gap
    (:func:`diloco_gym.sim.fleet.fragment_work_seconds` of one fragment, operation for
    operation)."""
    compute = gap_s - stall_s
    return work_seconds(compute, compute, fp[1], fp[2]) / work_seconds(gap_s, gap_s, fp[1], fp[2])


#: :func:`diloco_gym.sim.fleet.fragment_work_seconds` compiled (the same code, so the same
#: operations as the fleet env's Python credit).
work_seconds = njit(cache=True)(fragment_work_seconds)


@njit(cache=True)
def fragment_work(i, d, f, ist, stall_s, h_max, fp, sched_d):  # pragma: no cover - compiled
    """Model v1's learner credit of a sync of one of ``f`` fragments at decision ``d`` in
    row ``i``, relative to the kernel's (the fleet env's ``_set_learner_work``, operation
    for operation): :func:`work_seconds` of the compute seconds since the previous sync
    and of those since this fragment's own last sync (``f`` syncs back; before the
    episode, the fragments' syncs at ``-(f - 1 - k) * h_max``), each sync having stalled
    the learners ``stall_s`` seconds, over the work of the wall-clock gap. The row's
    earlier syncs are read from ``sched_d``."""
    n = ist[3, i]
    m = min(n, f)  # the schedule's entries in the last f syncs
    own_at = -(f - 1 - m) * h_max if m < f else sched_d[i, n - f]
    dec = fp[0]
    gap = (d - ist[1, i]) * dec
    compute_gap = gap - stall_s
    stalls = 0.0
    for _ in range(f):
        stalls += stall_s
    own = (d - own_at) * dec - stalls
    target = work_seconds(compute_gap, own, fp[1], fp[2])
    return target / work_seconds(gap, gap, fp[1], fp[2])


@njit(cache=True)
def merge_row(i, c, ist, fst, bi, bf, ip, fp, sched_d, sched_c):  # pragma: no cover - compiled
    """Merge now in row ``i`` at isolated cost ``c``: the learners' gain and the state after
    it; the merge is recorded in ``sched_d``/``sched_c`` when they have columns. Returns
    ``(excess term, gain)``: the cost times the reward scale, and the loss decrease times
    the credit."""
    d = ist[0, i]
    gap_s = (d - ist[1, i]) * fp[0]
    thr_sum = bf[3, i]
    if bi[4, i] > 1:  # a fragment's sync: model v1's fragment credit (the fleet env's)
        thr_sum = thr_sum * fragment_work(i, d, bi[4, i], ist, bf[5, i], ip[1], fp, sched_d)
    elif bf[5, i] != 0.0:  # syncs stall the learners: model v1's credit (the fleet env's)
        thr_sum = thr_sum * stalled_work(gap_s, bf[5, i], fp)
    added, gain = gain_one(gap_s, fst[0, i], thr_sum, fp)
    gain = gain * bf[4, i]
    fst[0, i] = fst[0, i] + added
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
def merge_now(
    i, ist, fst, bi, bf, ip, fp, qs, qd, qptr, qrbin, qbase, qm0, thr_in, thr_tail, prefmin,
    memo, sched_d, sched_c, buf,
):  # pragma: no cover - compiled  # fmt: skip
    """A merge now in row ``i`` (:func:`cost_of`, then :func:`merge_row`) when its cost is
    known: ``(True, excess term, gain)``; ``(False, 0, 0)`` and nothing changed when not."""
    c = cost_of(
        i, ist, bi, ip, fp, qs, qd, qptr, qrbin, qbase, qm0, thr_in, thr_tail, prefmin, memo,
        buf,
    )  # fmt: skip
    if c != c:
        return False, 0.0, 0.0
    e, g = merge_row(i, c, ist, fst, bi, bf, ip, fp, sched_d, sched_c)
    return True, e, g


@njit(cache=True)
def advance_row(
    i, ist, fst, bi, bf, ip, fp, reach, prefix, nxt, qs, qd, qptr, qrbin, qbase, qm0, thr_in,
    thr_tail, prefmin, memo, sched_d, sched_c, buf, ex, pr,
):  # pragma: no cover - compiled  # fmt: skip
    """Apply the single-option decisions of row ``i`` until it has a real choice or its
    episode ends, adding the merges' terms to ``ex`` and ``pr``. Returns ``(ex, pr, status)``:
    0 done; 1 a decision had no feasible action (impossible with a validated budget);
    ``NEED_COST`` a merge's cost is unknown (the row stops before that merge)."""
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
            done, e, g = merge_now(
                i, ist, fst, bi, bf, ip, fp, qs, qd, qptr, qrbin, qbase, qm0, thr_in, thr_tail,
                prefmin, memo, sched_d, sched_c, buf,
            )  # fmt: skip
            if not done:
                return ex, pr, NEED_COST
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
    (:data:`~diloco_gym.sim.step_layout.STEP_OUT_INT`) and ``of[i]`` (``STEP_OUT_FLOAT``).

    A merge whose cost is unknown (:func:`cost_of`) stops the step before it with status
    ``NEED_COST`` and its decision in ``oi[i, 7]``; once the env has put the cost in the
    memo, the same call resumes the step where it stopped (``oi[i, 6]``: in the forced
    decisions, with the terms so far in ``of[i, 3:7]``)."""
    n = bi[0, i]
    if oi[i, 6] == 0:
        d = ist[0, i]
        can_merge, can_defer = options_one(
            d, ist[1, i], ist[2, i], n, ip[0], ip[1], ip[2], reach, prefix
        )
        merge = (want and can_merge) or not can_defer
        ex = 0.0
        pr = 0.0
        if merge:
            done, ex, pr = merge_now(
                i, ist, fst, bi, bf, ip, fp, qs, qd, qptr, qrbin, qbase, qm0, thr_in, thr_tail,
                prefmin, memo, sched_d, sched_c, buf,
            )  # fmt: skip
            if not done:
                oi[i, 5] = NEED_COST
                oi[i, 7] = d
                return
        ex += fst[4, i]
        pr += fst[5, i]
        fst[4, i] = 0.0
        fst[5, i] = 0.0
        ist[0, i] = d + 1
        oi[i, 0] = merge
        oi[i, 1] = merge != want
        e2 = 0.0
        p2 = 0.0
    else:
        ex, pr, e2, p2 = of[i, 3], of[i, 4], of[i, 5], of[i, 6]
    err = 0
    if ip[3]:
        e2, p2, err = advance_row(
            i, ist, fst, bi, bf, ip, fp, reach, prefix, nxt, qs, qd, qptr, qrbin, qbase, qm0,
            thr_in, thr_tail, prefmin, memo, sched_d, sched_c, buf, e2, p2,
        )  # fmt: skip
        if err == NEED_COST:
            oi[i, 5] = NEED_COST
            oi[i, 6] = 1
            oi[i, 7] = ist[0, i]
            of[i, 3], of[i, 4], of[i, 5], of[i, 6] = ex, pr, e2, p2
            return
        ex += e2
        pr += p2
    oi[i, 6] = 0
    d = ist[0, i]
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
    of[i, 2] = reward_one(ex, pr, fp)


@njit(cache=True)
def reward_one(ex, pr, fp):  # pragma: no cover - compiled
    """``-excess_weight * ex + progress_weight * pr``: the reward of the terms paid."""
    return -fp[10] * ex + fp[11] * pr


@njit(cache=True)
def touch_merge_rows(
    rows, want, ist, bi, ip, qs, qd, qptr, qrbin, qbase, k0, k1
):  # pragma: no cover - compiled  # fmt: skip
    """Read the first value of each cost-queue row a merge asked for in rows ``rows[k]``
    (``k0 <= k < k1``, ``want[k]``) would read, all rows first: the loads are independent,
    so their cache misses overlap, where the merges one by one would wait for each in turn
    (a software prefetch; nothing is written). Returns their sum, which the caller
    compares with a value it never has, so that the loads are kept."""
    acc = 0.0
    if qs.shape[1] == 0:
        return acc
    for k in range(k0, k1):
        if want[k]:
            i = rows[k]
            slot = bi[1, i]
            a = ist[0, i] * ip[4]
            if ist[0, i] < bi[0, i] and a < qs.shape[1]:
                acc += qs[slot, a] + qd[slot, a]
                lo = qptr[slot, a]
                if lo < qbase.shape[1]:
                    acc += qbase[slot, lo] + qrbin[slot, lo]
    return acc


@njit(cache=True)
def step_range(
    rows, want, ist, fst, bi, bf, ip, fp, reach, prefix, nxt, qs, qd, qptr, qrbin, qbase, qm0,
    thr_in, thr_tail, prefmin, memo, sched_d, sched_c, oi, of, k0, k1,
):  # pragma: no cover - compiled  # fmt: skip
    """:func:`step_row` of rows ``rows[k]`` for ``k0 <= k < k1`` (``want[k]``), with a scratch
    buffer of its own. Returns the first of them whose step had no feasible action, or -1."""
    buf = np.empty(max(ip[6], 1))
    if (
        k1 - k0 > 1
        and touch_merge_rows(rows, want, ist, bi, ip, qs, qd, qptr, qrbin, qbase, k0, k1) == 1e300
    ):
        buf[0] = 0.0  # never: the touches' sum only keeps their loads from being dropped
    bad = -1
    for k in range(k0, k1):
        i = rows[k]
        step_row(
            i, want[k], ist, fst, bi, bf, ip, fp, reach, prefix, nxt, qs, qd, qptr, qrbin,
            qbase, qm0, thr_in, thr_tail, prefmin, memo, sched_d, sched_c, buf, oi, of,
        )  # fmt: skip
        if oi[i, 5] == 1 and bad < 0:
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
def options_many(
    d, last, m_left, n, h_min, h_max, budget, reach, prefix, can_merge, can_defer
):  # pragma: no cover - compiled
    """:func:`options_one` of each ``(d[k], last[k], m_left[k])`` into ``can_merge[k]``,
    ``can_defer[k]`` (one episode length ``n``)."""
    for k in range(d.size):
        can_merge[k], can_defer[k] = options_one(
            d[k], last[k], m_left[k], n, h_min, h_max, budget, reach, prefix
        )
    return 0


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
    their terms owed to the first step (``pend_excess``, ``pend_progress``, which hold the
    terms so far: 0 at a reset). Returns -1 when done; the first row where a decision had no
    feasible action; or ``-2 - row`` when a merge's cost is unknown (``NEED_COST``; the
    row stops before that merge, and the same call resumes it once the cost is in the
    memo)."""
    buf = np.empty(max(ip[6], 1))
    bad = -1
    status = 0
    for k in range(rows.size):
        i = rows[k]
        ex, pr, err = advance_row(
            i, ist, fst, bi, bf, ip, fp, reach, prefix, nxt, qs, qd, qptr, qrbin, qbase, qm0,
            thr_in, thr_tail, prefmin, memo, sched_d, sched_c, buf, fst[4, i], fst[5, i],
        )  # fmt: skip
        fst[4, i] = ex
        fst[5, i] = pr
        if err and bad < 0:
            bad = i
            status = err
    return bad if status == 1 or bad < 0 else -2 - bad
