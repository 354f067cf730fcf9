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

from dataclasses import dataclass, fields
from functools import lru_cache

import numpy as np

__all__ = [
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
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not np.isfinite(
                value
            ):
                raise ValueError(f"SidecarParams.{f.name} must be a finite number, got {value!r}")
            if value < 0:
                raise ValueError(f"SidecarParams.{f.name} must be >= 0, got {value!r}")
        for name in ("slots", "slo_ms", "serving_capacity_rps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SidecarParams.{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 < self.high_pressure <= 1:
            raise ValueError(f"SidecarParams.high_pressure must be in (0, 1], got "
                             f"{self.high_pressure!r}")

    @property
    def slo_s(self) -> float:
        return self.slo_ms / 1000.0


def base_latency_s(prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                   p: SidecarParams) -> np.ndarray:
    """Nominal service time per request, seconds."""
    return (p.ttft_ms + p.prefill_ms_per_token * prompt_tokens
            + p.decode_ms_per_token * output_tokens) / 1000.0


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
        return {
            "requests": int(n),
            "violated": int(self.violated.sum()),
            "violation_pct": self.violation_pct,
            "p50_ms": percentile(lat_ms, 50),
            "p95_ms": percentile(lat_ms, 95),
            "p99_ms": percentile(lat_ms, 99),
            "sync_active_frac": float(self.sync_active.mean()) if n else 0.0,
        }


def percentile(x: np.ndarray, q: float) -> float:
    """Linear-interpolation percentile (the reference's convention); NaN when empty."""
    return float(np.percentile(x, q)) if np.size(x) else float("nan")


def replay(base_s: np.ndarray, req_bin: np.ndarray, pressure_bin: np.ndarray,
           sync_bin: np.ndarray | None, p: SidecarParams, bin_s: float) -> ReplayResult:
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
    active = (np.zeros(req_bin.size, bool) if sync_bin is None
              else sync_bin[req_bin].astype(bool))
    return ReplayResult(latency, latency > p.slo_s, active, pressure_bin[req_bin])


@lru_cache(maxsize=16)
def _cost_grid(n_bins: int, first: int, stride: int, n_starts: int, merge_bins: int,
               horizon: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Index grids of :func:`merge_costs` that depend only on the shapes (cached)."""
    starts = first + stride * np.arange(n_starts, dtype=np.int64)
    k = np.minimum(starts[:, None] + np.arange(horizon), n_bins)  # (C, J) bin of each offset
    k_end = np.minimum(k, np.minimum(starts + merge_bins, n_bins)[:, None])
    s0 = np.minimum(starts, n_bins)
    for a in (k, k_end, s0):
        a.setflags(write=False)
    return k, k_end, s0


def merge_costs(base_s: np.ndarray, req_bin: np.ndarray, pressure_bin: np.ndarray,
                p: SidecarParams, bin_s: float, starts: np.ndarray, merge_bins: int,
                violated0: np.ndarray) -> np.ndarray:
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

    Args:
        starts: candidate start bins, equally spaced.

    Returns:
        float array, one cost per start (number of requests, >= 0).
    """
    n_bins = pressure_bin.size
    starts = np.asarray(starts, dtype=np.int64)
    n_c = starts.size
    if n_c == 0 or req_bin.size == 0:
        return np.zeros(n_c)
    stride = int(starts[1] - starts[0]) if n_c > 1 else 1
    if n_c > 1 and not np.all(np.diff(starts) == stride):
        raise ValueError("merge_costs needs equally spaced candidate starts")
    first = int(starts[0])
    horizon = merge_bins + int(round(p.tail_s / bin_s))
    k, k_end, s0 = _cost_grid(n_bins, first, stride, n_c, merge_bins, horizon)

    m0 = _slowdown(pressure_bin, None, p)
    s = _running_sum(base_s, req_bin, m0, p, bin_s)
    prefmin = np.minimum.accumulate(s)
    # Capacity a merge removes per bin: cap - cap / (1 + sigma).
    lost = p.slots * bin_s / m0 * (p.sync_slowdown / (1.0 + p.sync_slowdown))
    d = np.zeros(n_bins + 1)
    np.cumsum(lost, out=d[1:])
    s_merge = s[k] + d[k_end]
    s_merge -= d[s0][:, None]
    run_min = np.minimum.accumulate(s_merge, axis=1)
    np.minimum(run_min, prefmin[s0][:, None], out=run_min)
    s_merge -= run_min  # now the backlog with the merge, (C, J)
    flat_backlog = s_merge.ravel()

    # Request i violates under a candidate iff its backlog exceeds a threshold that only
    # depends on whether it arrived inside the window (in-window) or after it (tail).
    slow = m0[req_bin]
    thr_in = (p.slo_s / (slow * (1.0 + p.sync_slowdown)) - base_s) * p.slots
    thr_tail = (p.slo_s / slow - base_s) * p.slots
    rel = req_bin - first
    c_hi = rel // stride  # last candidate starting at or before the request
    r = rel - c_hi * stride  # offset of the request from that candidate's start
    lags = np.arange((horizon + stride - 1) // stride + 1)
    c = c_hi[:, None] - lags  # (R, L) candidate
    j = r[:, None] + lags * stride  # (R, L) offset inside that candidate's horizon
    valid = (c >= 0) & (c < n_c) & (j < horizon)
    b = np.take(flat_backlog, c * horizon + j, mode="clip")
    thr = np.where(j < merge_bins, thr_in[:, None], thr_tail[:, None])
    extra = (b > thr) & valid
    extra &= ~violated0.astype(bool)[:, None]
    return np.bincount(c[extra], minlength=n_c).astype(np.float64)


def effect_sizes(result: ReplayResult, high_pressure: float = 0.6) -> dict:
    """The real-sidecar effect sizes of SPEC.md §4.1 for one replay.

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
