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

import threading
from dataclasses import dataclass, fields

import numpy as np

__all__ = [
    "IsolatedMergeCost",
    "SidecarParams",
    "ReplayResult",
    "base_latency_s",
    "replay",
    "merge_costs",
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
        for f in fields(self):
            value = getattr(self, f.name)
            if (
                not isinstance(value, (int, float))
                or isinstance(value, bool)
                or not np.isfinite(value)
            ):
                raise ValueError(f"SidecarParams.{f.name} must be a finite number, got {value!r}")
            if value < 0:
                raise ValueError(f"SidecarParams.{f.name} must be >= 0, got {value!r}")
        for name in ("slots", "slo_ms", "serving_capacity_rps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SidecarParams.{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 < self.high_pressure <= 1:
            raise ValueError(
                f"SidecarParams.high_pressure must be in (0, 1], got {self.high_pressure!r}"
            )

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


def _slowdown(pressure_bin: np.ndarray, sync_bin: np.ndarray | None, p: SidecarParams):
    m = 1.0 + p.pressure_gain * pressure_bin**2
    if sync_bin is not None:
        m = m * (1.0 + p.sync_slowdown * sync_bin)
    return m


def _running_sum(base_s, req_bin, m, p: SidecarParams, bin_s: float) -> np.ndarray:
    """``S_k = sum_{j<k} (work_j - capacity_j)``, length ``n_bins + 1``."""
    work = np.bincount(req_bin, weights=base_s, minlength=m.size)
    x = work - p.slots * bin_s / m
    s = np.empty(m.size + 1)
    s[0] = 0.0
    np.cumsum(x, out=s[1:])
    return s


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
        return 100.0 * float(self.violated.mean()) if self.violated.size else 0.0

    def summary(self) -> dict:
        """Violation %, latency percentiles (ms) and sync-active fraction."""
        lat_ms = self.latency_s * 1000.0
        n = lat_ms.size
        # One partition for the three (each value as percentile(lat_ms, q) alone).
        p50, p95, p99 = np.percentile(lat_ms, [50, 95, 99]).tolist() if n else [float("nan")] * 3
        return {
            "requests": int(n),
            "violated": int(self.violated.sum()),
            "violation_pct": self.violation_pct,
            "p50_ms": p50,
            "p95_ms": p95,
            "p99_ms": p99,
            "sync_active_frac": float(self.sync_active.mean()) if n else 0.0,
        }


def percentile(x: np.ndarray, q: float) -> float:
    """Linear-interpolation percentile (the reference's convention); NaN when empty."""
    return float(np.percentile(x, q)) if np.size(x) else float("nan")


def replay(
    base_s: np.ndarray,
    req_bin: np.ndarray,
    pressure_bin: np.ndarray,
    sync_bin: np.ndarray | None,
    p: SidecarParams,
    bin_s: float,
) -> ReplayResult:
    """Replay requests through the queue with the given merge mask.

    Args:
        base_s: nominal service time per request (:func:`base_latency_s`).
        req_bin: bin index of each request's arrival.
        pressure_bin: fleet pressure per bin, in [0, 1].
        sync_bin: 1 where a merge is active (per bin), or ``None`` for no merges.
        p: sidecar parameters.
        bin_s: bin width, seconds.
    """
    m = _slowdown(pressure_bin, sync_bin, p)
    s = _running_sum(base_s, req_bin, m, p, bin_s)
    backlog = s[:-1] - np.minimum.accumulate(s)[:-1]
    latency = (base_s + backlog[req_bin] / p.slots) * m[req_bin]
    active = np.zeros(req_bin.size, bool) if sync_bin is None else sync_bin[req_bin].astype(bool)
    return ReplayResult(latency, latency > p.slo_s, active, pressure_bin[req_bin])


#: Candidates per block in :func:`merge_costs` (bounds memory on day-long traces).
_COST_BLOCK = 4096
#: Requests per chunk of the request/candidate pairing in :func:`merge_costs`.
_PAIR_CHUNK = 1 << 16
#: Bytes of :func:`merge_costs` scratch kept per thread between calls (see _scratch): enough
#: for episodes up to about 20 minutes; longer traces allocate normally, because a retained
#: multi-megabyte block in the heap pins the memory freed around it (higher RSS afterwards).
_SCRATCH_MAX_BYTES = 1 << 21
_SCRATCH = threading.local()


def _scratch(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialised float64 array of ``shape`` backed by a per-thread buffer.

    The backlog grids of :func:`merge_costs` are too big for malloc's small-block heap, so a
    fresh allocation maps new pages and faults each of them in; on an episode reset that
    was a third of the call. Reusing one small buffer per thread avoids it (arrays above
    ``_SCRATCH_MAX_BYTES`` are allocated normally, so at most a few MiB are held).
    """
    size = int(np.prod(shape))
    if size * 8 > _SCRATCH_MAX_BYTES:
        return np.empty(shape)
    buf = getattr(_SCRATCH, name, None)
    if buf is None or buf.size < size:
        buf = np.empty(size)
        setattr(_SCRATCH, name, buf)
    return buf[:size].reshape(shape)


def _padded(x: np.ndarray, size: int) -> np.ndarray:
    """``x`` extended to ``size`` by repeating its last value (index clipping, as a copy)."""
    if size <= x.size:
        return x
    out = np.empty(size)
    out[: x.size] = x
    out[x.size :] = x[-1]
    return out


def _merge_queue(
    base_s: np.ndarray,
    req_bin: np.ndarray,
    pressure_bin: np.ndarray,
    p: SidecarParams,
    bin_s: float,
    size: int,
):
    """What costing a merge needs from the no-merge queue, padded to ``size``.

    Returns ``(m0, S, D, prefmin)``: the no-merge slowdown per bin, the running sum
    ``S_k = sum_{j<k} (work_j - capacity_j)``, the cumulative capacity a merge removes
    ``D_k = sum_{j<k} (cap_j - cap_j / (1 + sigma))``, and the running minimum of ``S``.
    """
    m0 = _slowdown(pressure_bin, None, p)
    s = _running_sum(base_s, req_bin, m0, p, bin_s)
    prefmin = np.minimum.accumulate(s)
    return m0, _padded(s, size), _padded(lost_capacity(m0, p, bin_s), size), _padded(prefmin, size)


def lost_capacity(m0: np.ndarray, p: SidecarParams, bin_s: float) -> np.ndarray:
    """``D_k = sum_{j<k} (cap_j - cap_j / (1 + sigma))``: the cumulative nominal work a merge
    removes from the capacity (``m0`` the no-merge slowdown per bin), length ``bins + 1``."""
    lost = p.slots * bin_s / m0 * (p.sync_slowdown / (1.0 + p.sync_slowdown))
    d = np.zeros(m0.shape[:-1] + (m0.shape[-1] + 1,))  # along the last axis (batches too)
    np.cumsum(lost, axis=-1, out=d[..., 1:])
    return d


def _backlog_thresholds(slow: np.ndarray, base_s: np.ndarray, p: SidecarParams):
    """Backlog (work-seconds) above which a request violates, inside a merge window and
    after it: ``(base + B / slots) * m > slo``  <=>  ``B > (slo / m - base) * slots``."""
    thr_in = (p.slo_s / (slow * (1.0 + p.sync_slowdown)) - base_s) * p.slots
    thr_tail = (p.slo_s / slow - base_s) * p.slots
    return thr_in, thr_tail


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
    """Extra SLO violations (requests) caused by one merge starting at each of ``starts``.

    Each candidate is evaluated *in isolation* against the no-merge replay
    (``violated0``): its window ``[s, s + merge_bins)`` slows service, and the backlog it
    leaves is followed for ``tail_s`` seconds afterwards. Because merges are at least
    ``H_min`` apart, the sum over a schedule's merges approximates its sync-excess;
    :func:`replay` gives the exact figure (the test suite bounds the difference).

    All candidates are evaluated at once: the running sum ``S`` of the no-merge queue is
    shifted by the cumulative capacity a merge removes, and the backlog follows from a
    running minimum along each candidate's horizon (no Python loop over time). Each
    request is then paired with the candidates whose horizon holds it and compared with
    its latency threshold.

    Layout (for speed; the arithmetic is unchanged): the backlog grid is stored
    offset-major, ``grid[j, c]`` for offset ``j`` into candidate ``c``'s horizon, padded
    with ``-inf`` (no candidate, or past the horizon) so that a request's pairs are a
    fixed stride apart in the flat grid and need no validity mask. Requests that violate
    without a merge are dropped before pairing. Day-long traces are processed in blocks
    of candidates and chunks of requests, so memory stays bounded.

    Args:
        starts: candidate start bins, equally spaced.

    Returns:
        float array, one cost per start (number of requests, >= 0).
    """
    starts = np.asarray(starts, dtype=np.int64)
    n_c = starts.size
    if n_c == 0 or req_bin.size == 0:
        return np.zeros(n_c)
    stride = int(starts[1] - starts[0]) if n_c > 1 else 1
    if n_c > 1 and (stride < 1 or not np.all(np.diff(starts) == stride)):
        raise ValueError("merge_costs needs equally spaced candidate starts")
    first = int(starts[0])
    if first < 0:
        raise ValueError("merge_costs needs candidate starts >= 0")
    horizon = merge_bins + int(round(p.tail_s / bin_s))
    n_lags = (horizon - 1) // stride + 1  # candidates whose horizon can hold one request
    # Lags [0, lag_in) are inside the merge window for every request, [lag_tail, n_lags)
    # after it; the (at most one) lag in between depends on the request's offset.
    lag_in = min(merge_bins // stride, n_lags)
    lag_tail = min(-(-merge_bins // stride), n_lags)

    # Index k >= n_bins reads S[n_bins] (the reference clips indices): pad by repetition.
    m0, s, d, prefmin = _merge_queue(
        base_s, req_bin, pressure_bin, p, bin_s, int(starts[-1]) + horizon + 1
    )

    # Per request: candidate of the last start at or before it (c_hi), offset from it (r),
    # and the backlog thresholds inside the window and in the tail.
    keep = ~np.asarray(violated0).astype(bool)
    rel = req_bin - first
    keep &= rel >= 0
    c_hi = rel // stride
    keep &= c_hi < n_c + n_lags - 1
    ridx = np.flatnonzero(keep)
    c_hi = c_hi[ridx]
    r_off = rel[ridx] - c_hi * stride
    thr_in, thr_tail = _backlog_thresholds(m0[req_bin[ridx]], base_s[ridx], p)

    if ridx.size and np.any(np.diff(c_hi) < 0):  # requests not in time order
        order = np.argsort(c_hi, kind="stable")
        c_hi, r_off, thr_in, thr_tail = c_hi[order], r_off[order], thr_in[order], thr_tail[order]

    cost = np.zeros(n_c, dtype=np.int64)
    pad = n_lags - 1
    rows = n_lags * stride  # covers offsets r + lag * stride, r < stride
    lags = np.arange(n_lags, dtype=np.int64)
    es = s.strides[0]
    for c_a in range(0, n_c, _COST_BLOCK):
        c_b = min(n_c, c_a + _COST_BLOCK)
        nb = c_b - c_a
        cols = nb + 2 * pad
        st = starts[c_a:c_b]
        grid = _scratch("grid", (rows, cols))
        grid[:, :pad] = -np.inf
        grid[:, pad + nb :] = -np.inf
        grid[horizon:] = -np.inf
        g = grid[:horizon, pad : pad + nb]
        s_win = np.lib.stride_tricks.as_strided(
            s[int(st[0]) :], (horizon, nb), (es, es * stride), writeable=False
        )
        d_win = np.lib.stride_tricks.as_strided(
            d[int(st[0]) :], (merge_bins, nb), (es, es * stride), writeable=False
        )
        # S with the merge: s[k] + d[k_end] - d[s0], k_end clipped to the window's end.
        np.add(s_win[:merge_bins], d_win, out=g[:merge_bins])
        np.add(s_win[merge_bins:], d[st + merge_bins][None, :], out=g[merge_bins:])
        g -= d[st][None, :]
        # Running minimum along each horizon, starting from the no-merge prefix minimum
        # (min is exact, so the order of the comparisons does not matter).
        run = _scratch("run", (horizon, nb))
        prev = prefmin[st]
        for j in range(horizon):
            prev = np.minimum(prev, g[j], out=run[j])
        g -= run  # now the backlog with the merge
        flat = grid.ravel()
        step = stride * cols - 1  # flat distance between a request's consecutive lags

        lo, hi = np.searchsorted(c_hi, [c_a, c_b + pad])
        for q0 in range(lo, hi, _PAIR_CHUNK):
            q = slice(q0, min(hi, q0 + _PAIR_CHUNK))
            ch = c_hi[q] - c_a
            r = r_off[q]
            t_in, t_tail = thr_in[q], thr_tail[q]
            base = r * cols + ch + pad
            extra = np.empty((n_lags, base.size), dtype=bool)
            for lag in range(n_lags):
                b = np.take(flat[lag * step :], base)
                if lag < lag_in:
                    thr = t_in
                elif lag >= lag_tail:
                    thr = t_tail
                else:
                    thr = np.where(r + lag * stride < merge_bins, t_in, t_tail)
                np.greater(b, thr, out=extra[lag])
            # Count per candidate c = ch - lag: sum each run of equal ch, then scatter.
            heads = np.flatnonzero(np.diff(ch, prepend=ch[0] - 1))
            per = np.add.reduceat(extra, heads, axis=1, dtype=np.int64)  # (L, groups)
            cand = ch[heads][None, :] - lags[:, None]
            ok = (cand >= 0) & (cand < nb)
            cost[c_a:c_b] += np.bincount(cand[ok], weights=per[ok], minlength=nb).astype(np.int64)
    return cost.astype(np.float64)


class IsolatedMergeCost:
    """The cost of one merge at a time, with exactly the arithmetic of :func:`merge_costs`.

    An environment only needs the costs of the merges it launches (a few dozen per
    episode), not all of them; this precomputes the no-merge queue once (``O(bins)``) and
    then costs a merge in ``O(horizon)``. ``cost_at(s)`` equals ``merge_costs(...)`` at start
    ``s`` bit for bit (same sums in the same order; the minimum is exact), which the test
    suite checks on every decision of many episodes.
    """

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
        :func:`diloco_gym.envs.core.episode_core` computed them (the same arithmetic as
        :func:`_merge_queue`), so that they are not computed twice."""
        self.merge_bins = int(merge_bins)
        self.horizon = self.merge_bins + int(round(p.tail_s / bin_s))
        size = pressure_bin.size + 1 + self.horizon  # past the end: S[n_bins], as there
        if queue is None:
            m0, self._s, self._d, self._prefmin = _merge_queue(
                base_s, req_bin, pressure_bin, p, bin_s, size
            )
        else:
            m0, s, prefmin = queue
            self._s, self._prefmin = _padded(s, size), _padded(prefmin, size)
            self._d = _padded(lost_capacity(m0, p, bin_s), size)
        idx = np.flatnonzero(~np.asarray(violated0).astype(bool))
        rb = req_bin[idx]
        if rb.size > 1 and not bool(np.all(rb[1:] >= rb[:-1])):  # sorted arrivals: already
            idx = idx[np.argsort(rb, kind="stable")]
        self._rbin = req_bin[idx]
        self._thr_in, self._thr_tail = _backlog_thresholds(m0[self._rbin], base_s[idx], p)

    def cost_at(self, start: int) -> float:
        """Extra violated requests of a merge starting at bin ``start``."""
        start = int(start)
        w, h = self.merge_bins, self.horizon
        s, d = self._s, self._d
        g = np.empty(h)
        np.add(s[start : start + w], d[start : start + w], out=g[:w])
        np.add(s[start + w : start + h], d[start + w], out=g[w:])
        g -= d[start]
        run = np.minimum(np.minimum.accumulate(g), self._prefmin[start])
        g -= run  # the backlog with the merge
        lo, hi = np.searchsorted(self._rbin, [start, start + h])
        j = self._rbin[lo:hi] - start
        thr = np.where(j < w, self._thr_in[lo:hi], self._thr_tail[lo:hi])
        return float(np.count_nonzero(g[j] > thr))


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
