"""Serving-sidecar latency and SLO model.

The sidecar is a fluid queue on the training-step grid (bins of ``bin_s`` seconds).

Formulas (all times in seconds unless a name says ``_ms``):

* Nominal service time of request *i* (an idle server, no pressure, no merge)::

      base_i = (ttft_ms + prefill_ms_per_token * prompt_i + decode_ms_per_token * output_i) / 1000

* Slowdown multiplier of bin *k* (pressure ``P_k`` in [0, 1], ``sync_k`` = 1 inside a merge)::

      m_k = (1 + pressure_gain * P_k**2) * (1 + sync_slowdown * sync_k)

* Work and capacity: each request brings ``base_i`` seconds of nominal work; the server
  clears ``slots * bin_s / m_k`` seconds of nominal work per bin (``slots`` requests are
  served in parallel at full speed).
* Backlog (Lindley recursion, nominal work-seconds at the start of bin *k*)::

      B_0 = 0,  B_{k+1} = max(0, B_k + work_k - capacity_k)

  computed in closed form as ``B_k = S_k - min_{u<=k} S_u`` with ``S`` the running sum of
  ``work - capacity``, so a replay is a handful of vectorised numpy passes.
* Latency of request *i* arriving in bin *k*: ``(base_i + B_k / slots) * m_k``; it violates
  its SLO when latency exceeds ``slo_ms / 1000``.

So a merge during a burst (arrivals near capacity) builds a backlog that outlasts its own
window, while a merge in a quiet period only stretches the requests it overlaps.

Sync-excess of a schedule = violation rate of its replay minus the violation rate of the
same replay with no merges (percentage points of requests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from diloco_gym.sim import compiled, compiled_rows, percentiles
from diloco_gym.sim.sidecar_bounds import check_sidecar_fields

__all__ = [
    "CostQueue",
    "IsolatedMergeCost",
    "SidecarParams",
    "ReplayResult",
    "base_latency_s",
    "queue",
    "no_merge_queue",
    "slowdown",
    "replay",
    "pct_of",
    "cost_queue",
    "cost_queue_into",
    "episode_cost_queue",
    "cost_horizon",
    "isolated_merge_costs",
    "queue_thresholds",
    "merged_backlog",
    "merge_violations",
    "merge_window",
    "merge_costs",
    "violation_threshold",
    "effect_sizes",
    "percentile",
]


@dataclass(frozen=True)
class SidecarParams:
    """Parameters of the sidecar latency model.

    Attributes:
        ttft_ms: fixed per-request overhead (scheduling, first token), ms.
        prefill_ms_per_token: prompt processing cost, ms per prompt token.
        decode_ms_per_token: generation cost, ms per output token.
        slots: requests served in parallel at full speed (server concurrency).
        sync_slowdown: fractional slowdown of service while a merge is active
            (0.5 means everything takes 1.5x as long).
        pressure_gain: latency multiplier per unit of squared fleet pressure (convex: high
            pressure hurts disproportionately; 0 = pressure is harmless).
        slo_ms: per-request latency SLO, ms.
        serving_capacity_rps: request rate at which serving pressure reaches 1.
        high_pressure: pressure threshold of the "high pressure" class (effect sizes).
        tail_s: how long after a merge window its backlog is followed when the per-merge
            cost is computed in isolation (the realised replay follows it to the end).
    """

    ttft_ms: float = 50.0
    prefill_ms_per_token: float = 0.05
    decode_ms_per_token: float = 6.0
    slots: float = 16.0
    sync_slowdown: float = 0.5
    pressure_gain: float = 0.0
    slo_ms: float = 1000.0
    serving_capacity_rps: float = 20.0
    high_pressure: float = 0.6
    tail_s: float = 12.0

    def __post_init__(self) -> None:
        check_sidecar_fields(self)  # finite, >= 0, at most SIDECAR_MAX (sidecar_bounds.py)

    @property
    def slo_s(self) -> float:
        return self.slo_ms / 1000.0


def base_latency_s(
    prompt_tokens: np.ndarray, output_tokens: np.ndarray, p: SidecarParams
) -> np.ndarray:
    """Nominal service time per request, seconds."""
    return (
        p.ttft_ms + p.prefill_ms_per_token * prompt_tokens + p.decode_ms_per_token * output_tokens
    ) / 1000.0


def slowdown(pressure_bin: np.ndarray, sync_bin: np.ndarray | None, p: SidecarParams):
    """Slowdown multiplier per bin, ``(1 + pressure_gain * P**2) * (1 + sync_slowdown * sync)``.

    ``sync_bin`` is ``None`` for no merges; it may carry leading batch axes (one merge mask
    per schedule), which the result then has too.
    """
    m = 1.0 + p.pressure_gain * pressure_bin**2
    if sync_bin is not None:
        m = m * (1.0 + p.sync_slowdown * sync_bin)
    return m


def queue(
    work: np.ndarray, m: np.ndarray, p: SidecarParams, bin_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """The Lindley recursion in closed form, along the last axis.

    ``S_k = sum_{j<k} (work_j - capacity_j)`` with ``capacity_j = slots * bin_s / m_j``, and
    its running minimum; the backlog at the start of bin ``k`` is ``S_k - min_{u<=k} S_u``.
    Leading axes are independent queues (episodes or schedules), each computed exactly as a
    queue of its own (cumulative sums and minima run along the last axis only).

    Args:
        work: ``(..., bins)`` nominal work-seconds arriving per bin.
        m: ``(..., bins)`` slowdown per bin (:func:`slowdown`), broadcast with ``work``.

    Returns:
        ``(S, prefmin)``, each ``(..., bins + 1)``.
    """
    x = work - p.slots * bin_s / m
    rows = np.ascontiguousarray(x.reshape(-1, x.shape[-1]), dtype=np.float64)
    s = np.empty((rows.shape[0], rows.shape[1] + 1))
    prefmin = np.empty_like(s)
    compiled().lindley_rows(rows, s, prefmin)  # sequential sums and minima, as cumsum's
    shape = x.shape[:-1] + (x.shape[-1] + 1,)
    return s.reshape(shape), prefmin.reshape(shape)


def no_merge_queue(
    base_s: np.ndarray,
    req_bin: np.ndarray,
    pressure_bin: np.ndarray,
    p: SidecarParams,
    bin_s: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(m0, S, prefmin)`` of one episode's queue without merges (:func:`queue`)."""
    m0 = slowdown(pressure_bin, None, p)
    work = np.bincount(req_bin, weights=base_s, minlength=pressure_bin.size)
    s, prefmin = queue(work, m0, p, bin_s)
    return m0, s, prefmin


SUMMARY_Q = (50, 95, 99)  #: the latency percentiles of a replay's (an episode's) summary


@dataclass(frozen=True)
class ReplayResult:
    """Per-request outcome of one replay.

    Attributes:
        latency_s: latency per request, seconds.
        violated: SLO violated per request.
        sync_active: the request arrived inside a merge window.
        pressure: fleet pressure at the request's arrival.
    """

    latency_s: np.ndarray
    violated: np.ndarray
    sync_active: np.ndarray
    pressure: np.ndarray

    @property
    def violation_pct(self) -> float:
        return pct_of(int(np.count_nonzero(self.violated)), self.violated.size)

    def summary(self) -> dict:
        """Violation %, latency percentiles (ms) and sync-active fraction."""
        lat_ms = self.latency_s * 1000.0
        n = lat_ms.size
        p50, p95, p99 = percentiles(lat_ms, SUMMARY_Q)  # one selection for the three
        violated = int(np.count_nonzero(self.violated))
        active = self.sync_active
        return {
            "requests": int(n),
            "violated": violated,
            "violation_pct": pct_of(violated, self.violated.size),
            "p50_ms": p50,
            "p95_ms": p95,
            "p99_ms": p99,
            "sync_active_frac": int(np.count_nonzero(active)) / active.size if n else 0.0,
        }


def pct_of(count: int, n: int) -> float:
    """``100 * mean`` of a boolean mask with ``count`` of its ``n`` values set (0 when
    empty), a replay's violation percentage: ``count / n`` is the mean NumPy computes (its
    sum of 0/1 is exact, then one division)."""
    return 100.0 * (count / n) if n else 0.0


def percentile(x: np.ndarray, q: float) -> float:
    """Linear-interpolation percentile (the reference's convention); NaN when empty."""
    return percentiles(x, (q,))[0]


def replay(
    base_s: np.ndarray, req_bin: np.ndarray, pressure_bin: np.ndarray,
    sync_bin: np.ndarray | None, p: SidecarParams, bin_s: float,
) -> ReplayResult:  # fmt: skip
    """Replay requests through the queue with the given merge mask.

    Args:
        base_s: nominal service time per request (:func:`base_latency_s`).
        req_bin: bin index of each request's arrival.
        pressure_bin: fleet pressure per bin, in [0, 1].
        sync_bin: 1 where a merge is active (per bin), or ``None`` for no merges. A
            ``(K, bins)`` array replays K schedules at once: ``latency_s``, ``violated``
            and ``sync_active`` are then ``(K, requests)``.
        p: sidecar parameters.
        bin_s: bin width, seconds.
    """
    m = slowdown(pressure_bin, sync_bin, p)
    work = np.bincount(req_bin, weights=base_s, minlength=pressure_bin.size)
    if work.size != m.shape[-1]:
        raise ValueError(f"req_bin reaches bin {work.size - 1} of {m.shape[-1]} bins")
    # compiled, per schedule: queue()'s sums, then each request's (base + backlog / slots)
    # * m of its bin, its SLO flag and its merge flag (jit.replay_rows)
    rows = np.ascontiguousarray(m.reshape(-1, m.shape[-1]), dtype=np.float64)
    latency = np.empty((rows.shape[0], req_bin.size))
    violated, active = np.empty(latency.shape, bool), np.empty(latency.shape, bool)
    sync = np.zeros((0, 0))  # no merges: no row
    if sync_bin is not None:
        sync = sync_bin if sync_bin.shape == m.shape else np.broadcast_to(sync_bin, m.shape)
        sync = np.ascontiguousarray(sync.reshape(rows.shape), dtype=np.float64)
    compiled().replay_rows(
        work, rows, p.slots * bin_s, np.ascontiguousarray(base_s, dtype=np.float64),
        np.ascontiguousarray(req_bin), sync, float(p.slots), float(p.slo_s),
        latency, violated, active,
    )  # fmt: skip
    out = m.shape[:-1] + (req_bin.size,)
    take = np.take(pressure_bin, req_bin)
    return ReplayResult(latency.reshape(out), violated.reshape(out), active.reshape(out), take)


#: Candidates per block in :func:`merge_costs` (bounds memory on day-long traces).
_COST_BLOCK = 4096
#: Request/candidate pairs per block in :func:`merge_costs`, roughly (bounds memory too).
_PAIR_CHUNK = 1 << 18


def padded(x: np.ndarray, size: int) -> np.ndarray:
    """``x`` extended to ``size`` along its last axis by repeating its last value (index
    clipping, as a copy)."""
    n = x.shape[-1]
    if size <= n:
        return x
    out = np.empty(x.shape[:-1] + (size,), dtype=x.dtype)
    out[..., :n] = x
    out[..., n:] = x[..., -1:]
    return out


def violation_threshold(slow: np.ndarray, base_s: np.ndarray, p: SidecarParams) -> np.ndarray:
    """Backlog (work-seconds) above which a request violates its SLO under slowdown ``slow``:
    ``(base + B / slots) * m > slo``  <=>  ``B > (slo / m - base) * slots`` (``+inf`` for a
    ``base_s`` of ``-inf``: a request that can never be counted)."""
    return (p.slo_s / slow - base_s) * p.slots


def cost_horizon(p: SidecarParams, bin_s: float, merge_bins: int) -> int:
    """Bins over which a merge's isolated cost is counted: its window and ``tail_s`` after."""
    return int(merge_bins) + int(round(p.tail_s / bin_s))


class CostQueue(NamedTuple):
    """The no-merge queue of one or more episodes (rows), as merge costing reads it.

    Built by :func:`cost_queue`; read by :func:`merged_backlog`, :func:`merge_violations`
    and :func:`isolated_merge_costs`. The vector env keeps one row per env (its episode
    bank); a single episode is a batch of one.

    Attributes:
        s: ``(R, L)`` running sum ``S`` of the no-merge queue (:func:`queue`), padded past
            the episode's end by repeating its last value (index clipping), so a cost
            horizon from any start fits.
        d: ``(R, L)`` cumulative capacity a merge removes (``D_k``, the sum over bins
            ``j < k`` of ``cap_j * sync_slowdown / (1 + sync_slowdown)``;
            :func:`diloco_gym.sim.jit.cost_queue_rows`), padded alike.
        ptr: ``(R, L)`` int: ``ptr[r, k]`` = number of row ``r``'s requests in bins ``< k``.
        rbin: ``(R, W)`` int: each row's request bins, in bin order (``W`` >= its count).
        base: ``(R, W)`` their nominal service time, ``-inf`` for a request already over its
            SLO without a merge (a merge cannot add it again, so it is never counted).
        m0: ``(R, G)`` the no-merge slowdown per group of ``m0_bins`` bins.
        m0_bins: bins per ``m0`` entry (1; an episode's pressure is constant over a
            decision, so the vector env keeps one per decision).
        thr_in / thr_tail: optionally ``(R, W)``, each request's threshold inside a merge
            window and after it (:func:`violation_threshold` of ``m0`` with and without the
            merge's slowdown), precomputed for a queue that costs many merges one by one;
            ``None``: computed from ``m0`` and ``base`` when needed (less memory).
    """

    s: np.ndarray
    d: np.ndarray
    ptr: np.ndarray
    rbin: np.ndarray
    base: np.ndarray
    m0: np.ndarray
    m0_bins: int = 1
    thr_in: np.ndarray | None = None
    thr_tail: np.ndarray | None = None


def cost_queue(
    base_s: np.ndarray,
    req_bin: np.ndarray,
    violated0: np.ndarray,
    m0: np.ndarray,
    s: np.ndarray,
    p: SidecarParams,
    bin_s: float,
    size: int,
    counts: np.ndarray | None = None,
    m0_bins: int = 1,
    thresholds: bool = False,
) -> CostQueue:
    """The :class:`CostQueue` of ``B`` episodes.

    Args:
        base_s / req_bin / violated0: per request, the episodes' requests concatenated
            (``counts[e]`` of episode ``e``; ``None``: one episode), any order within each.
        m0: ``(B, bins)`` no-merge slowdown; ``s``: ``(B, bins + 1)`` its running sum
            (:func:`queue`).
        size: bins to hold (at least the last start plus a horizon plus one).
        m0_bins: keep ``m0`` every ``m0_bins`` bins (when it is constant over such groups).
        thresholds: also precompute each request's thresholds (``thr_in``, ``thr_tail``).
    """
    b, n_bins = m0.shape
    if counts is None:
        counts = np.array([req_bin.size], dtype=np.int64)
    width = max(int(size), n_bins + 1)
    w = int(counts.max()) if counts.size else 0
    q = CostQueue(
        np.empty((b, width)),
        np.empty((b, width)),
        np.empty((b, width), dtype=np.int32),
        np.zeros((b, w), dtype=np.int32),
        np.full((b, w), -np.inf),
        np.empty((b, -(-n_bins // m0_bins))),
        m0_bins,
    )
    cost_queue_into(q, np.arange(b), base_s, req_bin, violated0, m0, s, p, bin_s, width, counts)
    if thresholds:
        thr_in, thr_tail = queue_thresholds(q.m0, q.rbin, q.base, m0_bins, p)
        q = q._replace(thr_in=thr_in, thr_tail=thr_tail)
    return q


def queue_thresholds(
    m0: np.ndarray, rbin: np.ndarray, base: np.ndarray, m0_bins: int, p: SidecarParams
) -> tuple[np.ndarray, np.ndarray]:
    """``(thr_in, thr_tail)``: a cost queue's requests' violation thresholds inside a
    merge's window and after it (:func:`violation_threshold` at each request's no-merge
    slowdown ``m0[rbin // m0_bins]``, times ``1 + sync_slowdown`` inside), for one row or
    rows along the last axis: the operations the compiled count does when it computes
    them itself (``+inf`` for a request of service time ``-inf``)."""
    slow = np.take_along_axis(m0, rbin // m0_bins, axis=-1)
    return (
        violation_threshold(slow * (1.0 + p.sync_slowdown), base, p),
        violation_threshold(slow, base, p),
    )


def episode_cost_queue(
    base_s: np.ndarray,
    req_bin: np.ndarray,
    pressure_bin: np.ndarray,
    violated0: np.ndarray,
    no_merge: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
    p: SidecarParams,
    bin_s: float,
    merge_bins: int,
) -> tuple[CostQueue, np.ndarray, np.ndarray]:
    """One episode's whole-episode :class:`CostQueue`, as the exact replay reads it.

    ``no_merge`` is the episode's ``(m0, S, prefmin)`` (:func:`no_merge_queue`; computed
    when ``None``). The queue holds ``2 * (bins + 1) + merge_bins`` bins: windows of one
    block share a length (the longest), so one starting near the end reads up to ``bins``
    past it (padding: index clipping; masked out after its length).

    Returns:
        ``(q, prefmin, backlog)``: the queue, the no-merge running minimum padded to its
        size, and the no-merge backlog ``q.s[0] - prefmin`` (as :func:`replay`'s).
    """
    m0, s, prefmin = no_merge or no_merge_queue(base_s, req_bin, pressure_bin, p, bin_s)
    size = 2 * (pressure_bin.size + 1) + merge_bins
    q = cost_queue(base_s, req_bin, violated0, m0[None, :], s[None, :], p, bin_s, size)
    pm = padded(prefmin, size)
    return q, pm, q.s[0] - pm


def cost_queue_into(
    q: CostQueue,
    rows: np.ndarray,
    base_s: np.ndarray,
    req_bin: np.ndarray,
    violated0: np.ndarray,
    m0: np.ndarray,
    s: np.ndarray,
    p: SidecarParams,
    bin_s: float,
    width: int,
    counts: np.ndarray,
    parallel: bool = False,
) -> None:
    """:func:`cost_queue` of ``B`` episodes written into rows ``rows`` of an existing
    :class:`CostQueue` ``q`` (the vector env's bank: arrays at least ``width`` bins and
    ``counts.max()`` requests wide), in one compiled call
    (:func:`diloco_gym.sim.jit.cost_queue_rows`; ``parallel``: its parallel variant when
    :func:`diloco_gym.sim.jit_parallel.parallel_ok`, the same result)."""
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    compiled_rows("cost_queue_rows", parallel, counts.size, 2)(
        np.ascontiguousarray(base_s, dtype=np.float64),
        np.ascontiguousarray(req_bin, dtype=np.int64),
        np.ascontiguousarray(violated0, dtype=bool),
        offsets,
        np.ascontiguousarray(m0, dtype=np.float64),
        np.ascontiguousarray(s, dtype=np.float64),
        p.slots * bin_s,
        p.sync_slowdown / (1.0 + p.sync_slowdown),
        int(q.m0_bins),
        np.ascontiguousarray(rows, dtype=np.int64),
        int(width),
        int(counts.max()) if counts.size else 0,
        q.s,
        q.d,
        q.ptr,
        q.rbin,
        q.base,
        q.m0,
    )


def merged_backlog(
    q: CostQueue,
    rows: np.ndarray,
    starts: np.ndarray,
    min0: np.ndarray,
    merge_bins: int,
    length: int,
    off0: np.ndarray | None = None,
    ends: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """The queue's backlog with one merge in ``[start, start + merge_bins)`` of each row.

    The running sum with the merge is ``S_k + D_min(k, end) - D_start`` (the merge removes
    capacity only inside its window); the backlog is that minus its running minimum, which
    enters the window at ``min0`` (the no-merge ``prefmin[start]``, or a state carried from
    an earlier merge, whose capacity offset is ``off0``).

    Args:
        rows / starts: the merge of each column: its row of ``q`` and start bin.
        min0: running minimum of the queue entering each window.
        length: bins to follow from each start.
        ends: optionally an offset per merge at which to report the running minimum (the
            state to carry into a later window).

    Returns:
        ``(backlog, run_at_ends)``: offset-major ``(length, M)`` backlog (work-seconds) and
        the running minimum at ``ends`` (``None`` without ``ends``).
    """
    jit = compiled()
    m = starts.size
    out = np.empty((m, length))
    run_ends = np.empty(m)
    jit.merged_backlog_rows(
        q.s,
        q.d,
        np.asarray(rows, dtype=np.int64),
        np.asarray(starts, dtype=np.int64),
        np.broadcast_to(np.asarray(min0, dtype=np.float64), (m,)),
        np.zeros(m) if off0 is None else np.broadcast_to(np.asarray(off0, np.float64), (m,)),
        int(merge_bins),
        int(length),
        _EMPTY_I if ends is None else np.broadcast_to(np.asarray(ends, np.int64), (m,)),
        out,
        run_ends,
    )
    return out.T, None if ends is None else run_ends


_EMPTY_I = np.empty(0, dtype=np.int64)
_NO_THR = np.empty((1, 0))


def _thresholds(q: CostQueue) -> tuple[np.ndarray, np.ndarray]:
    """The queue's precomputed thresholds, or empty ones (computed in the loop)."""
    if q.thr_in is not None and q.thr_tail is not None:
        return q.thr_in, q.thr_tail
    return _NO_THR, _NO_THR


def merge_violations(
    q: CostQueue,
    rows: np.ndarray,
    starts: np.ndarray,
    backlog: np.ndarray,
    merge_bins: int,
    p: SidecarParams,
    lengths,
) -> np.ndarray:
    """Requests that a merge's backlog (:func:`merged_backlog`) pushes over their SLO.

    Counts, for each merge, the requests of its row arriving in ``[start, start + lengths)``
    (not already violating without a merge) whose backlog exceeds their threshold
    (:func:`violation_threshold`, with the merge's slowdown inside its window).

    Returns:
        float ``(M,)`` counts.
    """
    jit = compiled()
    m = starts.size
    thr_in, thr_tail = _thresholds(q)
    bl = np.ascontiguousarray(np.asarray(backlog).T)  # merge-major
    out = np.empty(m)
    jit.merge_violations_rows(
        q.ptr,
        q.rbin,
        q.base,
        q.m0,
        int(q.m0_bins),
        thr_in,
        thr_tail,
        np.asarray(rows, dtype=np.int64),
        np.asarray(starts, dtype=np.int64),
        bl,
        int(merge_bins),
        np.broadcast_to(np.asarray(lengths, dtype=np.int64), (m,)),
        1.0 + p.sync_slowdown,
        p.slo_s,
        float(p.slots),
        out,
    )
    return out


def merge_window(
    q: CostQueue,
    base_backlog: np.ndarray,
    starts: np.ndarray,
    off0: np.ndarray,
    min0: np.ndarray,
    lengths: np.ndarray,
    merge_bins: int,
    p: SidecarParams,
    want_state: bool = False,
):
    """Follow one merge per window ``[start, start + length)`` of a one-row queue ``q``,
    entering with running-sum offset ``off0`` and running minimum ``min0`` (the no-merge
    state: 0 and ``prefmin[start]``; or the state an earlier merge left).

    The merge's *drain* is the first bin after its window where its backlog equals the
    no-merge backlog ``base_backlog`` (the queue has emptied: from there on the replay is
    the no-merge one). This is the one rule of the exact replay's per-merge accounting:
    the protocol's scorer and the env's exact reward both count through it.

    Returns:
        ``((drained, t_drain), excess[, (offset, run)])``: whether and where (bins from
        the start; ``length`` when not) the backlog drained, the extra violations
        (:func:`merge_violations`) before that, and the state to carry into a window that
        starts at ``start + length``.
    """
    r = starts.size
    t_max = int(lengths.max()) if r else 0
    t = np.arange(t_max)
    rows = np.zeros(r, dtype=np.int64)
    last = np.maximum(lengths - 1, 0)
    bl, run_last = merged_backlog(
        q, rows, starts, min0, merge_bins, t_max, off0, ends=last if want_state else None
    )
    inside = t[:, None] < lengths
    eq = (bl == base_backlog[t[:, None] + starts]) & (t[:, None] >= merge_bins) & inside
    drained = eq.any(axis=0)
    t_drain = np.where(drained, eq.argmax(axis=0), lengths)
    # Requests (not violated without merges) between the start and the drain.
    excess = merge_violations(q, rows, starts, bl, merge_bins, p, t_drain)
    if not want_state:
        return (drained, t_drain), excess
    end = starts + merge_bins
    state = (off0 + (q.d[0][end] - q.d[0][starts]), run_last)
    return (drained, t_drain), excess, state


def isolated_merge_costs(
    q: CostQueue,
    rows: np.ndarray,
    starts: np.ndarray,
    min0: np.ndarray,
    merge_bins: int,
    p: SidecarParams,
    bin_s: float,
) -> np.ndarray:
    """The isolated cost of merges: extra SLO violations (requests) of a merge starting at
    bin ``starts[k]`` of row ``rows[k]``, alone against the no-merge replay.

    Its window ``[s, s + merge_bins)`` slows service, and the backlog it leaves is followed
    for ``tail_s`` seconds afterwards (:func:`cost_horizon`). Because merges are at least
    ``H_min`` apart, the sum over a schedule's merges approximates its sync-excess;
    :func:`replay` gives the exact figure (the test suite bounds the difference). This is
    the one merge-cost rule: the envs, the episode's full cost table (:func:`merge_costs`)
    and the protocol's scorer all count through it.

    Args:
        min0: ``prefmin`` of each row's no-merge queue at each start.
    """
    m = starts.size
    thr_in, thr_tail = _thresholds(q)
    out = np.empty(m)
    compiled().isolated_costs(
        q.s,
        q.d,
        q.ptr,
        q.rbin,
        q.base,
        q.m0,
        int(q.m0_bins),
        thr_in,
        thr_tail,
        np.asarray(rows, dtype=np.int64),
        np.asarray(starts, dtype=np.int64),
        np.broadcast_to(np.asarray(min0, dtype=np.float64), (m,)),
        int(merge_bins),
        cost_horizon(p, bin_s, merge_bins),
        1.0 + p.sync_slowdown,
        p.slo_s,
        float(p.slots),
        out,
    )
    return out


def merge_costs(
    base_s: np.ndarray,
    req_bin: np.ndarray,
    pressure_bin: np.ndarray,
    p: SidecarParams,
    bin_s: float,
    starts: np.ndarray,
    merge_bins: int,
    violated0: np.ndarray,
) -> np.ndarray:
    """Isolated cost (:func:`isolated_merge_costs`) of a merge at each of ``starts``.

    Candidates are costed in blocks (memory stays bounded on day-long traces).

    Args:
        starts: candidate start bins, equally spaced, ``>= 0``.

    Returns:
        float array, one cost per start (number of requests, >= 0).
    """
    starts = np.asarray(starts, dtype=np.int64)
    n_c = starts.size
    if n_c == 0 or req_bin.size == 0:
        return np.zeros(n_c)
    if n_c > 1:
        stride = int(starts[1] - starts[0])
        if stride < 1 or not np.all(np.diff(starts) == stride):
            raise ValueError("merge_costs needs equally spaced candidate starts")
    if int(starts[0]) < 0:
        raise ValueError("merge_costs needs candidate starts >= 0")
    h = cost_horizon(p, bin_s, merge_bins)
    m0, s, prefmin = no_merge_queue(base_s, req_bin, pressure_bin, p, bin_s)
    size = int(starts[-1]) + h + 1
    q = cost_queue(
        base_s, req_bin, violated0, m0[None, :], s[None, :], p, bin_s, size, thresholds=True
    )
    prefmin = padded(prefmin, size)
    per_start = max(1.0, req_bin.size * h / max(1, pressure_bin.size))  # pairs, roughly
    block = max(1, min(_COST_BLOCK, int(_PAIR_CHUNK / per_start)))
    out = np.empty(n_c)
    rows = np.zeros(min(block, n_c), dtype=np.int64)
    for a in range(0, n_c, block):
        st = starts[a : a + block]
        out[a : a + st.size] = isolated_merge_costs(
            q, rows[: st.size], st, prefmin[st], merge_bins, p, bin_s
        )
    return out


class IsolatedMergeCost:
    """The isolated cost of one merge at a time (:func:`isolated_merge_costs` on a batch of
    one): the no-merge queue is prepared once (``O(bins)``), then a merge costs
    ``O(horizon)``. ``cost_at(s)`` equals ``merge_costs(...)`` at start ``s``. The requests'
    thresholds are computed in the count, not beforehand: an episode costs a few dozen
    merges, fewer requests than a precomputation over all of them reads."""

    def __init__(
        self,
        base_s: np.ndarray,
        req_bin: np.ndarray,
        pressure_bin: np.ndarray,
        p: SidecarParams,
        bin_s: float,
        merge_bins: int,
        violated0: np.ndarray,
        queue: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """``queue``: optionally ``(m0, S, prefmin)`` of the no-merge queue, unpadded, as
        :func:`diloco_gym.envs.episode.episode_core` computed them (:func:`no_merge_queue`), so
        that they are not computed twice."""
        self.p, self.bin_s = p, bin_s
        self.merge_bins = int(merge_bins)
        self.horizon = cost_horizon(p, bin_s, self.merge_bins)
        size = pressure_bin.size + 1 + self.horizon  # past the end: S[n_bins], as there
        m0, s, prefmin = queue or no_merge_queue(base_s, req_bin, pressure_bin, p, bin_s)
        self.queue = cost_queue(base_s, req_bin, violated0, m0[None, :], s[None, :], p, bin_s, size)
        self.prefmin = padded(prefmin, size)

    def rows(self, decision_bins: int, n: int) -> tuple:
        """The queue as a one-row bank for the compiled step
        (:func:`diloco_gym.sim.jit_step.merge_row`): ``(s, d, ptr, rbin, base, m0, thr_in,
        thr_tail, prefmin)``, each ``(1, ...)``, ``prefmin`` at the first bin of each of the
        ``n`` decisions of ``decision_bins`` bins, then the queue's ``m0_bins``."""
        q = self.queue
        pre = np.ascontiguousarray(self.prefmin[: n * decision_bins : decision_bins])[None]
        return (q.s, q.d, q.ptr, q.rbin, q.base, q.m0, _NO_THR, _NO_THR, pre, int(q.m0_bins))

    def cost_at(self, start: int) -> float:
        """Extra violated requests of a merge starting at bin ``start``."""
        s0, q, p = int(start), self.queue, self.p
        return float(
            compiled().isolated_cost_one(
                q.s[0],
                q.d[0],
                q.ptr[0],
                q.rbin[0],
                q.base[0],
                q.m0[0],
                q.m0_bins,
                _NO_THR[0],
                _NO_THR[0],
                s0,
                self.prefmin[s0],
                self.merge_bins,
                self.horizon,
                1.0 + p.sync_slowdown,
                p.slo_s,
                float(p.slots),
                np.empty(self.horizon),  # per call: an episode may be costed from threads
            )  # fmt: skip
        )


def effect_sizes(result: ReplayResult, high_pressure: float = 0.6) -> dict:
    """The real-sidecar effect sizes (docs/calibration.md#effect-sizes) for one replay.

    Returns:
        ``p95_high_low``: p95 latency of high-pressure requests (pressure >= threshold) over
        that of low-pressure ones; ``p95_sync_ratio``: p95 of sync-active over sync-inactive
        requests; ``pressure_latency_corr``: Pearson correlation of pressure and latency.
        A ratio is NaN when one of its classes is empty.
    """
    lat = result.latency_s
    high = result.pressure >= high_pressure

    def ratio(mask: np.ndarray) -> float:
        if mask.all() or not mask.any():
            return float("nan")
        return percentile(lat[mask], 95) / percentile(lat[~mask], 95)

    if lat.size > 1 and np.std(result.pressure) > 0 and np.std(lat) > 0:
        corr = float(np.corrcoef(result.pressure, lat)[0, 1])
    else:
        corr = 0.0
    return {
        "p95_high_low": ratio(high),
        "p95_sync_ratio": ratio(result.sync_active),
        "pressure_latency_corr": corr,
    }
