"""The compiled loops of the evaluation: the exact scorer's per-schedule replay and the
matched-random sampler's draws, compiled with numba (``cache=True``, one thread) as
:mod:`diloco_gym.sim.jit`; imported on first use (:func:`diloco_gym.sim.compiled_eval`).

They replace NumPy code whose cost was bookkeeping, not arithmetic:

* The scorer (:class:`diloco_gym.eval.scorer.EpisodeScorer`) followed every interacting
  merge of a batch of schedules over a grid as long as the batch's longest window, merge by
  merge, even where the merge's backlog re-joined the no-merge one after a few bins. Here
  each schedule is followed on its own and each window stops at its drain. The arithmetic
  is that of :func:`diloco_gym.sim.sidecar.merge_window` (the backlog of
  ``jit.merged_backlog_rows``, the drain test, the violation count of
  ``jit.merge_violations_rows``), operation for operation, so the scores are bit-identical
  (``tests/sim/test_jit_eval.py`` compares them).
* The sampler (:func:`diloco_gym.sim.schedules.sample_uniform`) rebuilt the weights of
  the next merge for every merge of every draw and budget, and gathered and compared each
  draw's cumulative row with its uniform in NumPy, once per merge. Here only the
  comparison is compiled: the weights, their exponentials and cumulative sums stay
  NumPy's (computed once per completion table for every position,
  :meth:`~diloco_gym.sim.schedules.CompletionTable.cumulative_weights`: the same values
  elementwise, hence the same picks), and the uniforms are drawn by the caller from the
  same generator in the same order.
* The certified lower bound's credits (:func:`diloco_gym.eval.lower_bound.pair_credits`)
  replayed the whole episode once per decision with that decision's merge, building each
  replay's masks, latencies and violation flags as arrays. Here each replay runs in one
  loop with the same arithmetic as :func:`diloco_gym.sim.sidecar.replay`, starting from
  the no-merge queue at the merge's start (the sums before it are the same), and counts
  the violations it adds by decision directly.
* The offline oracle's dynamic programme (:func:`diloco_gym.sim.schedules.optimal_schedule`)
  took each decision's best continuation as a minimum over a strided sliding window, in
  blocks of ``h_min`` decisions (NumPy); here one backward loop takes the same minima (the
  windows read only later decisions, already final), so the values are the same.
"""

from __future__ import annotations

import numpy as np

from diloco_gym.sim.jit_cache import njit

__all__ = [
    "window_rows",
    "score_rows",
    "pick_rows",
    "sample_rows",
    "credit_counts",
    "free_budget_values",
    "budget_values",
]


@njit(cache=True)
def _window(
    s, d, base_bl, ptr, rbin, base, m0, m0_bins, thr_in, thr_tail, a, w, length, off0, min0,
    sigma1, slo_s, slots, buf, res,
):  # pragma: no cover - compiled  # fmt: skip
    """Follow one merge at bin ``a`` over at most ``length`` bins, entering with running-sum
    offset ``off0`` and running minimum ``min0``, until its drain (the first bin from ``w``
    on where its backlog equals the no-merge backlog ``base_bl``).

    ``res`` gets ``[drained, t_drain, excess, run]``: whether and where (``length`` when
    not) it drained, the requests in ``[a, a + t_drain)`` its backlog pushes over their
    threshold, and the running minimum at offset ``length - 1`` (only when it did not
    drain: the loop stops at the drain). ``buf`` (at least ``length``) holds the backlog.
    """
    da = d[a]
    dw = d[a + w] if length > w else 0.0
    run = min0
    t_drain = length
    drained = 0.0
    inner = min(w, length)
    # Inside the merge's window (no drain there), then after it up to the drain: two
    # loops, the same operations in the same order as one with the branch.
    for j in range(inner):
        g = s[a + j] + d[a + j]
        g -= da
        g += off0
        if g < run:
            run = g
        buf[j] = g - run
    for j in range(inner, length):
        g = s[a + j] + dw
        g -= da
        g += off0
        if g < run:
            run = g
        b = g - run
        buf[j] = b
        if b == base_bl[a + j]:
            drained = 1.0
            t_drain = j
            break
    lo = ptr[a]
    hi = ptr[a + t_drain]
    hits = 0
    if thr_in.size > 0:
        # Requests arrive in bin order (``ptr`` counts them by bin): those inside the
        # window first, then those after it.
        mid = ptr[a + min(w, t_drain)]
        for i in range(lo, mid):
            if buf[rbin[i] - a] > thr_in[i]:
                hits += 1
        for i in range(mid, hi):
            if buf[rbin[i] - a] > thr_tail[i]:
                hits += 1
    else:
        last = np.nan
        q = 0.0
        for i in range(lo, hi):
            j = rbin[i] - a
            slow = m0[rbin[i] // m0_bins]
            if j < w:
                slow = slow * sigma1
            if slow != last:
                last = slow
                q = slo_s / slow
            thr = (q - base[i]) * slots
            if buf[j] > thr:
                hits += 1
    res[0] = drained
    res[1] = t_drain
    res[2] = hits
    res[3] = run


@njit(cache=True)
def window_rows(
    s, d, base_bl, ptr, rbin, base, m0, m0_bins, thr_in, thr_tail, starts, off0, min0,
    lengths, w, sigma1, slo_s, slots, drained, t_drain, excess,
):  # pragma: no cover - compiled  # fmt: skip
    """:func:`_window` of merge ``k`` (start ``starts[k]``, ``lengths[k]`` bins) into
    ``drained[k]``, ``t_drain[k]`` and ``excess[k]``: what
    :func:`diloco_gym.sim.sidecar.merge_window` returns without the state."""
    n = starts.size
    top = 1
    for k in range(n):
        if lengths[k] > top:
            top = lengths[k]
    buf = np.empty(top)
    res = np.empty(4)
    for k in range(n):
        _window(
            s, d, base_bl, ptr, rbin, base, m0, m0_bins, thr_in, thr_tail, starts[k], w,
            lengths[k], off0[k], min0[k], sigma1, slo_s, slots, buf, res,
        )  # fmt: skip
        drained[k] = res[0] > 0.0
        t_drain[k] = np.int64(res[1])
        excess[k] = res[2]
    return 0


@njit(cache=True)
def _follow(
    row, j0, state, rec, interval, n_bins, drain_bins, iso_excess, s, d, base_bl, prefmin,
    ptr, rbin, base, m0, m0_bins, thr_in, thr_tail, w, sigma1, slo_s, slots, buf, res,
):  # pragma: no cover - compiled  # fmt: skip
    """Merges ``j0..`` of the schedule ``row`` from ``state`` (``[total, replayed,
    carried, offset, running minimum]`` before merge ``j0``), left in ``state`` after the
    last; ``rec`` (empty, or one row per merge) gets the state before each merge.

    A merge that starts from the no-merge state and drains before the next merge's start
    adds its isolated excess ``iso_excess``; any other is replayed (:func:`_window`) from
    the state carried from the previous merge (or the no-merge state) up to the next
    merge's start (the episode's end after the last), and carries its state on while it
    has not drained. The sums are taken in merge order, as the NumPy loop takes them."""
    m = row.size
    keep = rec.shape[0] > 0
    tot = state[0]
    rep = state[1] > 0.0
    carried = state[2] > 0.0
    c_off = state[3]
    c_run = state[4]
    for j in range(j0, m):
        if keep:
            rec[j, 0] = tot
            rec[j, 1] = 1.0 if rep else 0.0
            rec[j, 2] = 1.0 if carried else 0.0
            rec[j, 3] = c_off
            rec[j, 4] = c_run
        dec = row[j]
        st = dec * interval
        nxt = row[j + 1] * interval if j + 1 < m else n_bins
        if not carried and st + drain_bins[dec] <= nxt:
            tot += iso_excess[dec]
            continue
        rep = True
        off0 = c_off if carried else 0.0
        min0 = c_run if carried else prefmin[st]
        _window(
            s, d, base_bl, ptr, rbin, base, m0, m0_bins, thr_in, thr_tail, st, w, nxt - st,
            off0, min0, sigma1, slo_s, slots, buf, res,
        )  # fmt: skip
        tot += res[2]
        carried = not (res[0] > 0.0)
        c_off = off0 + (d[st + w] - d[st])
        c_run = res[3]
    state[0] = tot
    state[1] = 1.0 if rep else 0.0
    state[2] = 1.0 if carried else 0.0
    state[3] = c_off
    state[4] = c_run


@njit(cache=True)
def score_rows(
    sch, ref, interval, n_bins, drain_bins, iso_excess, s, d, base_bl, prefmin, ptr, rbin,
    base, m0, m0_bins, thr_in, thr_tail, w, sigma1, slo_s, slots, total, replayed,
):  # pragma: no cover - compiled  # fmt: skip
    """The exact extra violations (requests) of each schedule ``sch[r]`` (decision indices,
    strictly increasing) into ``total[r]``, and whether one of its merges was replayed
    into ``replayed[r]``: :meth:`EpisodeScorer.score`'s merge-by-merge rule
    (:func:`_follow`), a schedule at a time.

    ``ref`` (empty, or a schedule of as many merges): a schedule the rows share prefixes
    with (a local search's neighbours of its incumbent). It is followed once, keeping the
    state before each merge; a row whose first ``p`` merges are ``ref``'s starts from the
    state before merge ``p - 1`` (whose window, up to merge ``p``, is the first that can
    differ), which is the state it would reach itself: the same operations on the same
    values up to there."""
    k, m = sch.shape
    buf = np.empty(max(n_bins, 1))
    res = np.empty(4)
    state = np.zeros(5)
    use_ref = ref.size == m and m > 0
    rec = np.zeros((m if use_ref else 0, 5))
    if use_ref:
        _follow(
            ref, 0, state, rec, interval, n_bins, drain_bins, iso_excess, s, d, base_bl,
            prefmin, ptr, rbin, base, m0, m0_bins, thr_in, thr_tail, w, sigma1, slo_s, slots,
            buf, res,
        )  # fmt: skip
    none = np.zeros((0, 5))
    for r in range(k):
        row = sch[r]
        j0 = 0
        if use_ref:
            p = 0
            while p < m and row[p] == ref[p]:
                p += 1
            j0 = max(p - 1, 0)
        for c in range(5):
            state[c] = rec[j0, c] if use_ref else 0.0
        _follow(
            row, j0, state, none, interval, n_bins, drain_bins, iso_excess, s, d, base_bl,
            prefmin, ptr, rbin, base, m0, m0_bins, thr_in, thr_tail, w, sigma1, slo_s, slots,
            buf, res,
        )  # fmt: skip
        total[r] = state[0]
        replayed[r] = state[1] > 0.0
    return 0


@njit(cache=True)
def pick_rows(cw, cur, c_lo, u, h_min, out):  # pragma: no cover - compiled
    """One merge of every draw: ``u[i]`` (a uniform in [0, 1)) scaled by the total of the
    cumulative weights row ``cw[cur[i] - c_lo]``, then the number of entries of that row
    at or below it (the first index whose cumulative weight exceeds it), capped at the
    last index; ``cur[i]`` moves on by ``h_min`` plus that index and is written to
    ``out[i]``."""
    width = cw.shape[1]
    for i in range(cur.size):
        row = cur[i] - c_lo
        x = u[i] * cw[row, width - 1]
        pick = 0
        for c in range(width):
            if cw[row, c] <= x:
                pick += 1
        if pick > width - 1:
            pick = width - 1
        cur[i] = cur[i] + h_min + pick
        out[i] = cur[i]
    return 0


@njit(cache=True)
def sample_rows(table, u, m, h_min, out):  # pragma: no cover - compiled
    """``out[i]``: draw ``i`` of ``m`` merges from the cumulative weights ``table``
    (:meth:`diloco_gym.sim.schedules.CompletionTable.cumulative_weights`), merge ``j``
    picked by the uniform ``u[j, i]`` as :func:`pick_rows` picks it from the row of the
    previous merge with ``m - j`` merges left."""
    k = u.shape[1]
    width = table.shape[2]
    for i in range(k):
        cur = 0
        for j in range(m):
            row = table[m - j, cur]
            x = u[j, i] * row[width - 1]
            pick = 0
            for c in range(width):
                if row[c] <= x:
                    pick += 1
            if pick > width - 1:
                pick = width - 1
            cur = cur + h_min + pick
            out[i, j] = cur
    return 0


@njit(cache=True)
def credit_counts(
    decisions, interval, w, n, work, m0, cap, sigma1, base_s, req_bin, slots, slo_s,
    violated0, out,
):  # pragma: no cover - compiled  # fmt: skip
    """``out[r, c]``: the requests arriving in decision ``c`` that one merge at decision
    ``decisions[r]`` alone pushes over their SLO (violated with it, not in
    ``violated0``): the whole-episode replay of :func:`diloco_gym.sim.sidecar.replay` with
    that merge's mask, operation for operation.

    The queue's running sum and minimum are those of ``jit.lindley_rows`` over ``work -
    cap / m`` per bin (``m`` the no-merge slowdown ``m0``, times ``sigma1`` inside the
    merge's window, times 1.0 outside it as the mask's product gives), and a request's
    latency is ``(base + backlog / slots) * m`` of its bin. Before the merge's start the
    sums are those of the no-merge queue (computed once); requests there are decided from
    them as the replay decides them."""
    n_bins = work.size
    n_req = base_s.size
    s0 = np.empty(n_bins + 1)
    p0 = np.empty(n_bins + 1)
    run = 0.0
    low = 0.0
    s0[0] = 0.0
    p0[0] = 0.0
    for k in range(n_bins):
        run += work[k] - cap / (m0[k] * 1.0)
        if run < low:
            low = run
        s0[k + 1] = run
        p0[k + 1] = low
    backlog = np.empty(n_bins)
    mult = np.empty(n_bins)
    for r in range(decisions.size):
        for c in range(n):
            out[r, c] = 0
        a = min(decisions[r] * interval, n_bins)
        e = min(a + w, n_bins)
        run = s0[a]
        low = p0[a]
        for k in range(a, n_bins):
            mk = m0[k] * sigma1 if k < e else m0[k] * 1.0
            backlog[k] = run - low
            mult[k] = mk
            run += work[k] - cap / mk
            if run < low:
                low = run
        for j in range(n_req):
            k = req_bin[j]
            if k < a:
                mk = m0[k] * 1.0
                bl = s0[k] - p0[k]
            else:
                mk = mult[k]
                bl = backlog[k]
            if (base_s[j] + bl / slots) * mk > slo_s and not violated0[j]:
                c = min(k // interval, n - 1)
                out[r, c] += 1
    return 0


@njit(cache=True)
def _window_min(x, lo, hi):  # pragma: no cover - compiled
    """The least of ``x[lo:hi]`` (``inf`` when empty), as ``ndarray.min`` gives it (no NaN)."""
    best = np.inf
    for i in range(lo, hi):
        if x[i] < best:
            best = x[i]
    return best


@njit(cache=True)
def free_budget_values(cost, h_min, h_max, tail_from, g, val):  # pragma: no cover
    """The free-budget optimum's values: ``g[d]``, the least cost of finishing after a merge
    at decision ``d`` (``min(0, best)`` from ``tail_from`` on, where stopping is allowed,
    else ``best``, the least ``val`` over ``d + h_min .. d + h_max``), and ``val[d] =
    cost[d] + g[d]`` (``val`` is ``inf`` past the episode, ``n + h_max + 1`` long)."""
    n = cost.size
    for d in range(n - 1, -1, -1):
        best = _window_min(val, d + h_min, d + h_max + 1)
        gb = (0.0 if 0.0 <= best else best) if d >= tail_from else best
        g[d] = gb
        val[d] = cost[d] + gb
    return 0


@njit(cache=True)
def budget_values(cost, h_min, h_max, tail_from, g, ext):  # pragma: no cover - compiled
    """The exact-budget optimum's values ``g[j, d]``: the least cost of placing ``j`` more
    merges after a merge at ``d`` and finishing (``g[0]``: 0 from ``tail_from`` on, else
    ``inf``), the least of ``cost[d'] + g[j - 1, d']`` over ``d' = d + h_min .. d + h_max``
    (``ext``: scratch of ``n + h_max + 1``, ``inf`` past the episode)."""
    n = cost.size
    for d in range(n):
        g[0, d] = 0.0 if d >= tail_from else np.inf
    for i in range(n, ext.size):
        ext[i] = np.inf
    for j in range(1, g.shape[0]):
        for d in range(n):
            ext[d] = cost[d] + g[j - 1, d]
        for d in range(n):
            g[j, d] = _window_min(ext, d + h_min, d + h_max + 1)
    return 0
