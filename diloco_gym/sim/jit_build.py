"""The compiled episode builds: an episode's agent-independent arrays from its trace's arrays
(the exogenous features, the no-merge queue and its replay), the merge-cost queue rows the
vector env's bank keeps, and the replay of a schedule's slowdown. Part of the compiled rules
(:mod:`diloco_gym.sim.jit` re-exports every name here), with the same conventions: plain
loops compiled with numba (``cache=True``), the IEEE operations of diloco-gym 0.4.0's NumPy
kernel in the same order, so the results are bit-identical to it. Each rule is one helper
that every build calls: an episode's requests (:func:`requests_into`), its no-merge queue
(:func:`no_merge_queue_into`), a request's no-merge latency (:func:`latency_one`) and a
merge's lost capacity (:func:`lost_capacity_into`).
"""

from __future__ import annotations

import numpy as np

from diloco_gym.sim.jit_cache import njit

__all__ = [
    "lindley_rows",
    "replay_rows",
    "slowdown_one",
    "exo_row",
    "episode_exo",
    "requests_into",
    "no_merge_queue_into",
    "latency_one",
    "lost_capacity_into",
    "episode_core_range",
    "episode_core_rows",
    "cost_queue_range",
    "cost_queue_rows",
    "bank_rows",
]


# ------------------------------------------------------------------ episode builds
@njit(cache=True)
def lindley_rows(x, s, prefmin):  # pragma: no cover - compiled
    """The no-merge queue's running sums of rows ``x`` (work minus capacity per bin):
    ``s[r, 0] = 0``, ``s[r, k + 1] = s[r, k] + x[r, k]`` and its running minimum
    ``prefmin`` (what ``np.cumsum`` and ``np.minimum.accumulate`` give)."""
    for r in range(x.shape[0]):
        run = 0.0
        low = 0.0
        s[r, 0] = 0.0
        prefmin[r, 0] = 0.0
        for k in range(x.shape[1]):
            run += x[r, k]
            if run < low:
                low = run
            s[r, k + 1] = run
            prefmin[r, k + 1] = low
    return 0


@njit(cache=True)
def replay_rows(
    work, m, cap, base_s, req_bin, sync, slots, slo_s, latency, violated, active
):  # pragma: no cover - compiled  # fmt: skip
    """One replay per row of ``m`` (``(K, bins)``: each schedule's slowdown per bin): the
    queue of :func:`lindley_rows` over ``work - cap / m`` (``cap``: slots times the bin
    width), each request's latency ``(base + backlog / slots) * m`` of its bin, whether it
    exceeds ``slo_s``, and (where ``sync`` has rows, ``(K, bins)``) whether its bin's merge
    mask is nonzero; into the ``(K, requests)`` outputs."""
    n_bins = work.size
    x = np.empty((1, n_bins))
    s = np.empty((1, n_bins + 1))
    prefmin = np.empty((1, n_bins + 1))
    with_sync = sync.shape[0] > 0
    for r in range(m.shape[0]):
        for k in range(n_bins):
            x[0, k] = work[k] - cap / m[r, k]
        lindley_rows(x, s, prefmin)
        for j in range(base_s.size):
            k = req_bin[j]
            lat = latency_one(base_s[j], s[0, k], prefmin[0, k], slots, m[r, k])
            latency[r, j] = lat
            violated[r, j] = lat > slo_s
            active[r, j] = with_sync and sync[r, k] != 0.0
    return 0


@njit(cache=True)
def _ewma_into(x, alpha, norm, out):  # pragma: no cover - compiled
    """The bias-corrected EWMA of ``x`` (the first-order filter of :func:`iir1_rows` with
    ``b0 = alpha``, ``a1 = alpha - 1``, divided by ``norm``; ``out[0] = 0``)."""
    b0 = alpha
    a1 = alpha - 1.0
    z = 0.0
    for i in range(x.size):
        xn = x[i]
        yn = z + b0 * xn
        z = xn * 0.0 - yn * a1
        out[i] = yn / norm[i] if i > 0 else 0.0
    return 0


@njit(cache=True)
def _clip(v, lo, hi):  # pragma: no cover - compiled
    """``np.clip(v, lo, hi)`` as NumPy computes it (see :func:`_clip01`)."""
    v = v if v > lo else lo
    return v if v < hi else hi


@njit(cache=True)
def exo_row(
    arr, t_dec, dec_s, fa, fb, norm_f, norm_b, net, ckpt, capacity, rate_norm, exo, pdec
):  # pragma: no cover - compiled
    """One episode's exogenous features (``exo``, float32, the first ``exo.shape[0]``
    decisions) and fleet pressure per decision (``pdec``) from its sorted arrivals: the
    request rate of the interval before each decision, its EWMAs (forecast ``fa``,
    baseline ``fb``), the serving pressure, the squashed rates and the trend."""
    m = t_dec.size
    rate = np.empty(m)
    prev = 0
    j = 0
    for d in range(m):
        while j < arr.size and arr[j] < t_dec[d]:
            j += 1
        rate[d] = 0.0 if d == 0 else (j - prev) / dec_s
        prev = j
    fc = np.empty(m)
    bl = np.empty(m)
    _ewma_into(rate, fa, norm_f, fc)
    _ewma_into(rate, fb, norm_b, bl)
    n = exo.shape[0]
    for d in range(m):
        serving = min(1.0, fc[d] / capacity)
        hi = net[d] if net[d] >= serving else serving
        pdec[d] = hi if hi >= ckpt[d] else ckpt[d]
        if d < n:
            row = exo[d]
            row[0] = net[d]
            row[1] = serving
            row[2] = ckpt[d]
            row[3] = rate[d] / (rate[d] + rate_norm)
            row[4] = fc[d] / (fc[d] + rate_norm)
            row[5] = bl[d] / (bl[d] + rate_norm)
            row[6] = _clip((fc[d] - bl[d]) / rate_norm, -1.0, 1.0)
    return 0


@njit(cache=True)
def episode_exo(
    arr, network, checkpoint, e, p_idx, t_dec, dec_s, fa, fb, norm_f, norm_b, capacity,
    rate_norm, net, ckpt, exo, pdec,
):  # pragma: no cover - compiled  # fmt: skip
    """Episode ``e``'s exogenous features and pressure per decision (:func:`exo_row` of its
    sorted arrivals ``arr``), its network and checkpoint pressure read at ``p_idx`` per
    decision into the scratch ``net``/``ckpt`` (left at zero when ``network`` has no
    columns: no pressure)."""
    if network.shape[1] > 0:
        for d in range(t_dec.size):
            net[d] = network[e, p_idx[d]]
            ckpt[d] = checkpoint[e, p_idx[d]]
    exo_row(
        arr, t_dec, dec_s, fa, fb, norm_f, norm_b, net, ckpt, capacity, rate_norm, exo, pdec
    )  # fmt: skip
    return 0


@njit(cache=True)
def slowdown_one(p, gain):  # pragma: no cover - compiled
    """A bin's no-merge slowdown at pressure ``p``, ``1 + gain * p**2`` (the rule of
    :func:`diloco_gym.sim.sidecar.slowdown`, the same operations)."""
    return 1.0 + gain * (p * p)


@njit(cache=True)
def latency_one(base, s_k, prefmin_k, slots, m_k):  # pragma: no cover - compiled
    """A request's latency: its service time plus the queue's backlog ``s_k - prefmin_k``
    of its bin shared over ``slots``, times the bin's slowdown ``m_k``."""
    return (base + (s_k - prefmin_k) / slots) * m_k


@njit(cache=True)
def requests_into(
    arrivals, prompt, output, lo, hi, ttft_ms, prefill_ms, decode_ms, step_s, n_bins, base_s,
    req_bin, at, work,
):  # pragma: no cover - compiled  # fmt: skip
    """Requests ``lo <= i < hi``: the service time (seconds, from the prompt and output
    tokens) into ``base_s[at + i - lo]``, the arrival's bin (the last bin at most) into
    ``req_bin[at + i - lo]``, and the service time added to ``work`` of its bin."""
    for i in range(lo, hi):
        b = (ttft_ms + prefill_ms * prompt[i] + decode_ms * output[i]) / 1000.0
        k = min(np.int64(arrivals[i] / step_s), n_bins - 1)
        base_s[at + i - lo] = b
        req_bin[at + i - lo] = k
        work[k] += b
    return 0


@njit(cache=True)
def no_merge_queue_into(work, m0, cap_s, x, s, prefmin):  # pragma: no cover - compiled
    """The no-merge queue of one episode: ``x[0] = work - cap_s / m0`` per bin (the work
    arriving minus the capacity left by the slowdown ``m0``; ``cap_s`` = slots times the bin
    width), then its running sums ``s[0]`` and minima ``prefmin[0]``
    (:func:`lindley_rows`; ``s`` and ``prefmin`` are ``(1, bins + 1)``)."""
    prev = np.nan
    cap = 0.0
    for k in range(work.size):
        if m0[k] != prev:  # the slowdown is constant over a decision: divide once
            prev = m0[k]
            cap = cap_s / prev
        x[0, k] = work[k] - cap
    lindley_rows(x, s, prefmin)
    return 0


@njit(cache=True)
def episode_core_range(
    arrivals, prompt, output, offsets, network, checkpoint, p_idx, t_dec, dec_s, di, fa, fb,
    norm_f, norm_b, capacity, rate_norm, ttft_ms, prefill_ms, decode_ms, gain, step_s, cap_s,
    slots, slo_s, exo, pdec, pbin, m0, s, prefmin, base_s, req_bin, flat_bin, latency,
    violated, e0, e1,
):  # pragma: no cover - compiled  # fmt: skip
    """The agent-independent arrays of episodes ``e0 <= e < e1`` (requests
    ``offsets[e]:offsets[e + 1]`` of the concatenated per-request arrays, sorted arrivals;
    ``network``/``checkpoint`` ``(B, samples)`` pressure, read at ``p_idx`` per decision,
    or ``(B, 0)`` for none): the exogenous features (:func:`exo_row`), the pressure and
    no-merge slowdown per bin, each request's service time and bin
    (:func:`requests_into`), the no-merge queue (:func:`no_merge_queue_into`; ``cap_s`` =
    ``slots * step_s``) and its latencies and SLO violations (``latency > slo_s``), as
    ``diloco_gym.envs.episode.episode_core_batch`` documents them."""
    m = t_dec.size
    n_bins = pbin.shape[1]
    net = np.zeros(m)
    ckpt = np.zeros(m)
    work = np.zeros(n_bins)
    x = np.empty((1, n_bins))
    for e in range(e0, e1):
        lo = offsets[e]
        hi = offsets[e + 1]
        episode_exo(
            arrivals[lo:hi], network, checkpoint, e, p_idx, t_dec, dec_s, fa, fb, norm_f,
            norm_b, capacity, rate_norm, net, ckpt, exo[e], pdec[e],
        )  # fmt: skip
        for k in range(n_bins):
            p = pdec[e, k // di]
            pbin[e, k] = p
            m0[e, k] = slowdown_one(p, gain)
            work[k] = 0.0
        requests_into(
            arrivals, prompt, output, lo, hi, ttft_ms, prefill_ms, decode_ms, step_s, n_bins,
            base_s, req_bin, lo, work,
        )  # fmt: skip
        for i in range(lo, hi):
            flat_bin[i] = e * n_bins + req_bin[i]
        no_merge_queue_into(work, m0[e], cap_s, x, s[e : e + 1], prefmin[e : e + 1])
        for i in range(lo, hi):
            k = req_bin[i]
            lat = latency_one(base_s[i], s[e, k], prefmin[e, k], slots, m0[e, k])
            latency[i] = lat
            violated[i] = lat > slo_s
    return 0


@njit(cache=True)
def episode_core_rows(
    arrivals, prompt, output, offsets, network, checkpoint, p_idx, t_dec, dec_s, di, fa, fb,
    norm_f, norm_b, capacity, rate_norm, ttft_ms, prefill_ms, decode_ms, gain, step_s, cap_s,
    slots, slo_s, exo, pdec, pbin, m0, s, prefmin, base_s, req_bin, flat_bin, latency,
    violated,
):  # pragma: no cover - compiled  # fmt: skip
    """:func:`episode_core_range` of every episode."""
    return episode_core_range(
        arrivals, prompt, output, offsets, network, checkpoint, p_idx, t_dec, dec_s, di, fa,
        fb, norm_f, norm_b, capacity, rate_norm, ttft_ms, prefill_ms, decode_ms, gain, step_s,
        cap_s, slots, slo_s, exo, pdec, pbin, m0, s, prefmin, base_s, req_bin, flat_bin,
        latency, violated, 0, offsets.size - 1,
    )  # fmt: skip


@njit(cache=True)
def cost_row_into(
    req_bin, base_s, violated, lo, hi, n_bins, width, w, seen, ptr, rbin, base
):  # pragma: no cover - compiled  # fmt: skip
    """One episode's cost-queue requests (``lo <= i < hi`` of the per-request arrays, any
    order): the request pointer per bin ``ptr`` (written over ``width`` bins), and the
    requests' bins ``rbin`` and service times ``base`` in bin order (stable: a counting
    sort with ``seen``, scratch of ``n_bins``), ``-inf`` for one already violated without a
    merge (a merge cannot add it again), padded with 0 and ``-inf`` to ``w`` positions."""
    for k in range(n_bins):
        seen[k] = 0
    for i in range(lo, hi):
        seen[req_bin[i]] += 1
    ptr[0] = 0
    run = 0
    for k in range(n_bins):
        run += seen[k]
        ptr[k + 1] = run
        seen[k] = ptr[k]  # next free position of bin k
    for k in range(n_bins + 1, width):
        ptr[k] = hi - lo
    for i in range(lo, hi):
        k = req_bin[i]
        j = seen[k]
        seen[k] += 1
        rbin[j] = k
        base[j] = -np.inf if violated[i] else base_s[i]
    for j in range(hi - lo, w):
        rbin[j] = 0
        base[j] = -np.inf
    return 0


@njit(cache=True)
def lost_capacity_into(m0, s, cap_s, lost_frac, width, s_out, d_out):  # pragma: no cover
    """One episode's running sum ``s`` (``bins + 1``) and cumulative lost capacity
    (``cap_s / m0 * lost_frac`` per bin: what a merge takes, ``lost_frac = sync_slowdown /
    (1 + sync_slowdown)``) into ``s_out`` and ``d_out``, both padded to ``width`` by
    repeating their last value."""
    n_bins = m0.size
    for k in range(width):
        s_out[k] = s[min(k, n_bins)]
    acc = 0.0
    d_out[0] = 0.0
    prev = np.nan
    lost = 0.0
    for k in range(n_bins):
        if m0[k] != prev:  # the same slowdown, the same lost capacity: divide once
            prev = m0[k]
            lost = cap_s / prev * lost_frac
        acc += lost
        d_out[k + 1] = acc
    for k in range(n_bins + 1, width):
        d_out[k] = acc
    return 0


@njit(cache=True)
def cost_queue_range(
    base_s, req_bin, violated, offsets, m0, s, cap_s, lost_frac, m0_bins, out_rows, width, w,
    s_out, d_out, ptr, rbin, base, m0_kept, e0, e1,
):  # pragma: no cover - compiled  # fmt: skip
    """The cost queue rows of episodes ``e0 <= e < e1`` (requests
    ``offsets[e]:offsets[e + 1]`` of the concatenated per-request arrays, any order): the
    request pointer and the requests in bin order (:func:`cost_row_into`), the running sum
    ``s[e]`` and the cumulative lost capacity (:func:`lost_capacity_into`), and ``m0``
    every ``m0_bins`` bins. Episode ``e`` goes to row ``out_rows[e]`` of the outputs (a
    bank's arrays, wider than needed: ``s``, ``d`` and ``ptr`` are written over ``width``
    bins, the requests over ``w`` positions)."""
    n_bins = m0.shape[1]
    seen = np.empty(n_bins, dtype=np.int64)
    for e in range(e0, e1):
        o = out_rows[e]
        cost_row_into(
            req_bin, base_s, violated, offsets[e], offsets[e + 1], n_bins, width, w, seen,
            ptr[o], rbin[o], base[o],
        )  # fmt: skip
        lost_capacity_into(m0[e], s[e], cap_s, lost_frac, width, s_out[o], d_out[o])
        for g in range(-(-n_bins // m0_bins)):
            m0_kept[o, g] = m0[e, g * m0_bins]
    return 0


@njit(cache=True)
def cost_queue_rows(
    base_s, req_bin, violated, offsets, m0, s, cap_s, lost_frac, m0_bins, out_rows, width, w,
    s_out, d_out, ptr, rbin, base, m0_kept,
):  # pragma: no cover - compiled  # fmt: skip
    """:func:`cost_queue_range` of every episode."""
    return cost_queue_range(
        base_s, req_bin, violated, offsets, m0, s, cap_s, lost_frac, m0_bins, out_rows, width,
        w, s_out, d_out, ptr, rbin, base, m0_kept, 0, offsets.size - 1,
    )  # fmt: skip


@njit(cache=True)
def bank_rows(
    arrivals, prompt, output, offsets, network, checkpoint, p_idx, t_dec, dec_s, di, fa, fb,
    norm_f, norm_b, capacity, rate_norm, ttft_ms, prefill_ms, decode_ms, gain, step_s, cap_s,
    slots, slo_s, lost_frac, n, n_bins, out_rows, width, w, exo, s_out, d_out, ptr, rbin,
    base, m0_kept, prefmin_out,
):  # pragma: no cover - compiled  # fmt: skip
    """The vector env's bank rows of episodes ``e`` (as :func:`episode_core_range` takes
    them), written straight into bank row ``out_rows[e]``: the exogenous features of the
    first ``n`` decisions (``exo``), the cost queue (:func:`cost_row_into`,
    :func:`lost_capacity_into`, the slowdown every ``di`` bins into ``m0_kept``) and the
    no-merge running minimum at each decision (``prefmin_out``). The rules are those of
    :func:`episode_core_range` then :func:`cost_queue_range`, in the same order, so the
    rows are bit for bit theirs; what only a single env's episode keeps (per-request
    latencies, the pressure per bin) is not written."""
    m = t_dec.size
    net = np.zeros(m)
    ckpt = np.zeros(m)
    pdec = np.empty(m)
    work = np.empty(n_bins)
    m0 = np.empty(n_bins)
    x = np.empty((1, n_bins))
    s = np.empty((1, n_bins + 1))
    pm = np.empty((1, n_bins + 1))
    seen = np.empty(n_bins, dtype=np.int64)
    base_t = np.empty(max(w, 1))
    bin_t = np.empty(max(w, 1), dtype=np.int64)
    viol_t = np.empty(max(w, 1), dtype=np.bool_)
    for e in range(offsets.size - 1):
        lo = offsets[e]
        hi = offsets[e + 1]
        o = out_rows[e]
        episode_exo(
            arrivals[lo:hi], network, checkpoint, e, p_idx, t_dec, dec_s, fa, fb, norm_f,
            norm_b, capacity, rate_norm, net, ckpt, exo[o, :n], pdec,
        )  # fmt: skip
        for k in range(n_bins):
            m0[k] = slowdown_one(pdec[k // di], gain)
            work[k] = 0.0
        requests_into(
            arrivals, prompt, output, lo, hi, ttft_ms, prefill_ms, decode_ms, step_s, n_bins,
            base_t, bin_t, 0, work,
        )  # fmt: skip
        no_merge_queue_into(work, m0, cap_s, x, s, pm)
        for j in range(hi - lo):
            k = bin_t[j]
            viol_t[j] = latency_one(base_t[j], s[0, k], pm[0, k], slots, m0[k]) > slo_s
        cost_row_into(
            bin_t, base_t, viol_t, 0, hi - lo, n_bins, width, w, seen, ptr[o], rbin[o], base[o]
        )  # fmt: skip
        lost_capacity_into(m0, s[0], cap_s, lost_frac, width, s_out[o], d_out[o])
        for g in range(-(-n_bins // di)):
            m0_kept[o, g] = m0[g * di]
        for j in range(n):
            prefmin_out[o, j] = pm[0, j * di]
    return 0
