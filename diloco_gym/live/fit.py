"""Effect sizes of a live run and the sidecar-model fit to them.

Measured effect sizes (docs/calibration.md), from the successful requests of a run:

* ``p95_sync_ratio``: p95 latency of the sync phase's requests sent while a merge window
  was open over that of the sync phase's other requests (linear-interpolation
  percentiles, :func:`diloco_gym.sim.sidecar.percentile`).
* ``p95_high_low``: p95 latency of *high-pressure* requests over that of the others, both
  phases pooled. Pressure is a measured proxy: the serving pressure
  ``min(1, inflight / pressure_norm_inflight)``, where ``inflight`` is the number of this
  client's requests outstanding at the send (what the server is busy with when the request
  arrives). High pressure = pressure >= ``high_pressure`` (0.6, the reference's threshold).
  The live host has no separate network or checkpoint telemetry, and the merge traffic is
  the *sync* treatment, so it is deliberately kept out of the pressure proxy; the host's
  CPU utilisation at each send is recorded too and its correlation with latency reported
  separately (``cpu_latency_corr``).
* ``pressure_latency_corr``: Pearson correlation of that pressure and latency.

Fit of :class:`~diloco_gym.sim.sidecar.SidecarParams` (each step uses the previous ones):

1. ``ttft_ms``, ``prefill_ms_per_token``, ``decode_ms_per_token``: non-negative least
   squares of latency on (1, prompt tokens, output tokens) over the no-sync control
   phase, using the requests that found the server idle (no other request outstanding)
   when there are enough of them, so that queueing does not bias the per-token costs.
2. ``slots``: bisection (on a log scale) so that the simulated no-sync replay of the
   control phase (:func:`diloco_gym.sim.sidecar.replay` on the same send times and token
   counts) has the measured control-phase p95.
3. ``sync_slowdown``: bisection so that the simulated replay of the sync phase, with the
   merge windows that were really open, has the measured p95 sync ratio (the same idea as
   :func:`diloco_gym.eval.calibration.fit_sidecar`, on the live window instead of a regime).
4. ``serving_capacity_rps`` = ``slots`` / mean nominal service time (the rate at which
   the fitted server is fully busy). ``pressure_gain`` is not fitted (the live pressure
   proxy is the load itself, which the queue already models) and keeps its base value.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from diloco_gym.sim.sidecar import (
    ReplayResult,
    SidecarParams,
    base_latency_s,
    percentile,
    replay,
)

__all__ = [
    "RunData",
    "measured_effect_sizes",
    "fit_service_costs",
    "simulate_phase",
    "replay_requests",
    "sync_bins",
    "bootstrap_intervals",
    "INTERVAL_METRICS",
    "fit_sidecar_live",
    "fit_sync_slowdown",
    "SlowdownFit",
    "LiveFit",
]


@dataclass(frozen=True)
class RunData:
    """Successful requests of a run as arrays, plus the merge windows.

    Attributes:
        phase: ``"sync"`` or ``"control"`` per request.
        offset_s: send time relative to the start of the request's phase.
        latency_s: latency, seconds.
        prompt_tokens / output_tokens: token counts.
        sync_active: a merge window was open at the send.
        inflight: client requests outstanding at the send.
        cpu_util: host CPU utilisation at the send (NaN when unknown).
        windows_s: merge windows ``(start, end)`` relative to the sync phase's start.
        sync_duration_s / control_duration_s: lengths of the phases' trace windows.
    """

    phase: np.ndarray
    offset_s: np.ndarray
    latency_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    sync_active: np.ndarray
    inflight: np.ndarray
    cpu_util: np.ndarray
    windows_s: list[tuple[float, float]]
    sync_duration_s: float
    control_duration_s: float
    repeat: np.ndarray | None = None
    windows_by_repeat: dict[int, list[tuple[float, float]]] | None = None

    def mask(self, phase: str) -> np.ndarray:
        return self.phase == phase

    def repeats(self) -> list[int]:
        """The repeat indices present (``[0]`` for a run without repeats)."""
        if self.repeat is None:
            return [0]
        return sorted({int(k) for k in self.repeat})

    def repeat_mask(self, k: int) -> np.ndarray:
        if self.repeat is None:
            return np.ones(self.latency_s.size, dtype=bool)
        return self.repeat == k

    def windows_for(self, k: int) -> list[tuple[float, float]]:
        """Merge windows of repeat ``k``'s sync phase (relative to that phase's start)."""
        if self.windows_by_repeat is None:
            return self.windows_s
        return self.windows_by_repeat.get(k, [])

    def take(self, index: np.ndarray) -> RunData:
        """The requests at ``index`` (repeats relabelled by the caller if needed)."""
        return replace(
            self,
            phase=self.phase[index],
            offset_s=self.offset_s[index],
            latency_s=self.latency_s[index],
            prompt_tokens=self.prompt_tokens[index],
            output_tokens=self.output_tokens[index],
            sync_active=self.sync_active[index],
            inflight=self.inflight[index],
            cpu_util=self.cpu_util[index],
            repeat=None if self.repeat is None else self.repeat[index],
        )


def _ratio(lat: np.ndarray, mask: np.ndarray) -> float:
    if mask.all() or not mask.any():
        return float("nan")
    return percentile(lat[mask], 95) / percentile(lat[~mask], 95)


def _corr(x: np.ndarray, y: np.ndarray) -> float:
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if x.size < 3 or np.std(x) == 0 or np.std(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def pressure_proxy(inflight: np.ndarray, norm_inflight: float) -> np.ndarray:
    """Serving pressure in [0, 1] from the in-flight count at each send."""
    return np.minimum(1.0, np.asarray(inflight, dtype=np.float64) / norm_inflight)


def measured_effect_sizes(
    data: RunData, pressure_norm_inflight: float = 4.0, high_pressure: float = 0.6
) -> dict:
    """The effect sizes of the module docstring, with the class sizes behind them.

    Ratios are NaN when one of their classes is empty; correlations are NaN with fewer
    than three requests or no variation.
    """
    lat = data.latency_s
    sync = data.mask("sync")
    control = data.mask("control")
    active = data.sync_active & sync
    pressure = pressure_proxy(data.inflight, pressure_norm_inflight)
    high = pressure >= high_pressure
    sync_lat = lat[sync]
    out = {
        "p95_sync_ratio": _ratio(sync_lat, active[sync]),
        "p95_high_low": _ratio(lat, high),
        "pressure_latency_corr": _corr(pressure, lat),
        "cpu_latency_corr": _corr(data.cpu_util, lat),
        "p95_sync_active_ms": percentile(lat[active] * 1000, 95),
        "p95_sync_inactive_ms": percentile(lat[sync & ~active] * 1000, 95),
        "p95_control_ms": percentile(lat[control] * 1000, 95),
        "p50_sync_active_ms": percentile(lat[active] * 1000, 50),
        "p50_sync_inactive_ms": percentile(lat[sync & ~active] * 1000, 50),
        "p50_control_ms": percentile(lat[control] * 1000, 50),
        "requests_sync_active": int(active.sum()),
        "requests_sync_inactive": int((sync & ~active).sum()),
        "requests_control": int(control.sum()),
        "requests_high_pressure": int(high.sum()),
        "requests_low_pressure": int((~high).sum()),
    }
    inactive_p95 = out["p95_sync_inactive_ms"]
    control_p95 = out["p95_control_ms"]
    out["p95_sync_vs_control"] = (
        out["p95_sync_active_ms"] / control_p95
        if np.isfinite(control_p95) and control_p95 > 0
        else float("nan")
    )
    out["p95_inactive_vs_control"] = (
        inactive_p95 / control_p95 if np.isfinite(control_p95) and control_p95 > 0 else float("nan")
    )
    return out


#: Effect sizes that get a bootstrap interval.
INTERVAL_METRICS = ("p95_sync_ratio", "p95_high_low", "p95_sync_vs_control")


def _interval_metrics(
    data: RunData, pressure_norm_inflight: float, high_pressure: float
) -> dict[str, float]:
    """The :data:`INTERVAL_METRICS` of ``data`` (the same definitions as
    :func:`measured_effect_sizes`, without the extras, for the bootstrap's speed)."""
    lat = data.latency_s
    sync = data.mask("sync")
    control = data.mask("control")
    active = data.sync_active & sync
    high = pressure_proxy(data.inflight, pressure_norm_inflight) >= high_pressure
    control_p95 = percentile(lat[control], 95) if control.any() else float("nan")
    active_p95 = percentile(lat[active], 95) if active.any() else float("nan")
    return {
        "p95_sync_ratio": _ratio(lat[sync], active[sync]),
        "p95_high_low": _ratio(lat, high),
        "p95_sync_vs_control": (
            active_p95 / control_p95
            if np.isfinite(control_p95) and control_p95 > 0
            else float("nan")
        ),
    }


def bootstrap_intervals(
    data: RunData,
    pressure_norm_inflight: float = 4.0,
    high_pressure: float = 0.6,
    resamples: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> dict:
    """Percentile-bootstrap confidence intervals of the effect sizes, over repeats.

    The unit of resampling is a *repeat* (one sync phase and its control phase, replayed
    back to back): requests of one phase share the engine's state and the merge windows,
    so they are not independent, while repeats are. Each resample draws as many repeats
    as the run had, with replacement, pools their requests and recomputes each effect size;
    the interval is the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the
    resampled values. With few repeats the interval is coarse (``n`` repeats give at most
    ``C(2n - 1, n)`` distinct resamples) and tends to be too narrow: read it as a lower bound
    on the uncertainty.

    Returns:
        ``{"unit", "repeats", "level", "resamples", "per_repeat": {metric: [values]},
        metric: [lo, hi] or None}``: ``None`` with fewer than two repeats, or when fewer
        than half of the resamples define the metric (an empty class).
    """
    if not 0 < level < 1:
        raise ValueError(f"bootstrap level must be in (0, 1), got {level!r}")
    reps = data.repeats()
    index_of = {k: np.flatnonzero(data.repeat_mask(k)) for k in reps}
    out: dict = {
        "unit": "repeat (a sync phase and its no-sync control phase)",
        "repeats": len(reps),
        "level": level,
        "resamples": int(resamples),
        "per_repeat": {m: [] for m in INTERVAL_METRICS},
    }
    for k in reps:
        values = _interval_metrics(data.take(index_of[k]), pressure_norm_inflight, high_pressure)
        for m in INTERVAL_METRICS:
            out["per_repeat"][m].append(values[m])
    if len(reps) < 2 or resamples < 1:
        for m in INTERVAL_METRICS:
            out[m] = None
        out["note"] = "fewer than two repeats: no interval"
        return out
    rng = np.random.default_rng([seed, 17])
    draws: dict[str, list[float]] = {m: [] for m in INTERVAL_METRICS}
    for _ in range(resamples):
        pick = rng.integers(0, len(reps), size=len(reps))
        index = np.concatenate([index_of[reps[j]] for j in pick])
        values = _interval_metrics(data.take(index), pressure_norm_inflight, high_pressure)
        for m in INTERVAL_METRICS:
            draws[m].append(values[m])
    alpha = (1.0 - level) / 2.0
    for m in INTERVAL_METRICS:
        arr = np.asarray(draws[m], dtype=np.float64)
        arr = arr[np.isfinite(arr)]
        out[m] = (
            None
            if arr.size < resamples / 2
            else [float(np.quantile(arr, alpha)), float(np.quantile(arr, 1.0 - alpha))]
        )
    return out


def fit_service_costs(
    prompt_tokens: np.ndarray, output_tokens: np.ndarray, latency_s: np.ndarray
) -> dict:
    """Non-negative least squares ``latency_ms ~ ttft + prefill * prompt + decode * output``.

    Returns:
        ``ttft_ms``, ``prefill_ms_per_token``, ``decode_ms_per_token``, ``r2`` and
        ``requests``; the costs are NaN with fewer than three requests.
    """
    from scipy.optimize import nnls

    y = np.asarray(latency_s, dtype=np.float64) * 1000.0
    n = y.size
    if n < 3:
        nan = float("nan")
        return {
            "ttft_ms": nan,
            "prefill_ms_per_token": nan,
            "decode_ms_per_token": nan,
            "r2": nan,
            "requests": int(n),
        }
    a = np.column_stack(
        [np.ones(n), np.asarray(prompt_tokens, np.float64), np.asarray(output_tokens, np.float64)]
    )
    # Scale the columns so that nnls is well conditioned, then undo the scaling.
    scale = np.maximum(np.abs(a).max(axis=0), 1e-12)
    coef, _ = nnls(a / scale, y)
    coef = coef / scale
    resid = y - a @ coef
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid**2)) / ss_tot if ss_tot > 0 else float("nan")
    return {
        "ttft_ms": float(coef[0]),
        "prefill_ms_per_token": float(coef[1]),
        "decode_ms_per_token": float(coef[2]),
        "r2": r2,
        "requests": int(n),
    }


def sync_bins(windows_s: list[tuple[float, float]], n_bins: int, bin_s: float) -> np.ndarray:
    """The replay's merge mask: 1 for every bin whose start lies inside a merge window."""
    starts = np.arange(n_bins) * bin_s
    mask = np.zeros(n_bins)
    for lo, hi in windows_s:
        mask[(starts >= lo) & (starts < hi)] = 1.0
    return mask


def replay_requests(
    offset_s: np.ndarray,
    prompt_tokens: np.ndarray,
    output_tokens: np.ndarray,
    duration_s: float,
    windows_s: list[tuple[float, float]] | None,
    params: SidecarParams,
    bin_s: float = 0.05,
) -> ReplayResult:
    """Replay one phase's sends through the sidecar model (no pressure).

    Each request lands in bin ``floor(offset / bin_s)`` (negative offsets at 0); the
    replay covers ``max(duration_s, last send)`` plus one bin, and ``windows_s`` (merge
    windows relative to the phase's start; ``None``: no merges) become the merge mask of
    :func:`sync_bins`. This is the binning of every live replay (:func:`simulate_phase`,
    :mod:`diloco_gym.live.fidelity`).
    """
    offsets = np.maximum(np.asarray(offset_s, dtype=np.float64), 0.0)
    n_bins = max(1, int(np.ceil(max(duration_s, float(offsets.max(initial=0.0))) / bin_s)) + 1)
    req_bin = np.minimum((offsets / bin_s).astype(np.int64), n_bins - 1)
    base = base_latency_s(prompt_tokens, output_tokens, params)
    sync_bin = None if windows_s is None else sync_bins(windows_s, n_bins, bin_s)
    return replay(base, req_bin, np.zeros(n_bins), sync_bin, params, bin_s)


def simulate_phase(
    data: RunData, phase: str, params: SidecarParams, bin_s: float = 0.05, with_merges: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Replay one phase's requests through the sidecar model (:func:`replay_requests`).

    With repeated phases each repeat is replayed on its own (its own send times and merge
    windows) and the results are concatenated, repeat by repeat.

    Returns:
        ``(latency_s, sync_active)`` of the phase's requests.
    """
    if data.repeat is not None and len(data.repeats()) > 1:
        lat, act = [], []
        for k in data.repeats():
            sub = data.take(np.flatnonzero(data.repeat_mask(k)))
            sub = replace(sub, repeat=None, windows_s=data.windows_for(k), windows_by_repeat=None)
            if sub.mask(phase).any():
                a, b = simulate_phase(sub, phase, params, bin_s, with_merges)
                lat.append(a)
                act.append(b)
        if not lat:
            return np.zeros(0), np.zeros(0, dtype=bool)
        return np.concatenate(lat), np.concatenate(act)
    if data.windows_by_repeat is not None:
        data = replace(data, windows_s=data.windows_for(data.repeats()[0]))
    m = data.mask(phase)
    duration = data.sync_duration_s if phase == "sync" else data.control_duration_s
    windows = data.windows_s if with_merges and phase == "sync" else None
    res = replay_requests(
        data.offset_s[m], data.prompt_tokens[m], data.output_tokens[m], duration, windows,
        params, bin_s,
    )  # fmt: skip
    return res.latency_s, data.sync_active[m]


@dataclass(frozen=True)
class LiveFit:
    """Fitted sidecar parameters and how well they reproduce the run.

    Attributes:
        params: the fitted parameters.
        service: the least-squares fit of step 1 (with ``r2`` and ``requests``).
        sim_p95_control_ms: simulated control-phase p95 with the fitted ``slots``.
        sim_p95_sync_ratio: simulated p95 sync ratio with the fitted ``sync_slowdown``.
        sim_p95_sync_ratio_no_slowdown: the same with ``sync_slowdown = 0`` (the smallest
            ratio the model can give on this window; a lower measurement fits as 0).
        notes: what could not be fitted and why.
    """

    params: SidecarParams
    service: dict
    sim_p95_control_ms: float
    sim_p95_sync_ratio: float
    sim_p95_sync_ratio_no_slowdown: float
    notes: list[str]
    sync_slowdown_interval: list[float] | None = None

    def to_dict(self) -> dict:
        return {
            "service_fit": self.service,
            "sim_p95_control_ms": self.sim_p95_control_ms,
            "sync_slowdown_interval": self.sync_slowdown_interval,
            "sim_p95_sync_ratio": self.sim_p95_sync_ratio,
            "sim_p95_sync_ratio_no_slowdown": self.sim_p95_sync_ratio_no_slowdown,
            "notes": list(self.notes),
            "fitted_sidecar": asdict(self.params),
        }


def _bisect(
    fn, target: float, lo: float, hi: float, increasing: bool, iters: int, log: bool = False
) -> float:
    """Solve ``fn(x) = target`` for a monotone ``fn`` on ``[lo, hi]``."""
    for _ in range(iters):
        mid = float(np.sqrt(lo * hi)) if log else (lo + hi) / 2
        below = fn(mid) < target
        if below == increasing:
            lo = mid
        else:
            hi = mid
    return float(np.sqrt(lo * hi)) if log else (lo + hi) / 2


def fit_sidecar_live(
    data: RunData,
    measured: dict,
    base: SidecarParams | None = None,
    bin_s: float = 0.05,
    min_idle_requests: int = 10,
    iters: int = 30,
    sync_ratio_interval: tuple[float, float] | list[float] | None = None,
) -> LiveFit:
    """Fit the sidecar model to a live run (steps 1-4 of the module docstring).

    Args:
        data: the run's successful requests and merge windows.
        measured: :func:`measured_effect_sizes` of the run.
        base: parameters not fitted are taken from here (default ``SidecarParams()``).
        bin_s: replay bin width, seconds.
        min_idle_requests: fit step 1 on idle-server requests only when at least this many.
        iters: bisection iterations.
        sync_ratio_interval: the measured interval of the p95 sync ratio
            (:func:`bootstrap_intervals`); ``sync_slowdown`` is then also fitted to its two
            ends, giving the interval of the fitted slowdown (``sync_slowdown_interval``).
    """
    base = base or SidecarParams()
    notes: list[str] = []
    fit_phase = "control" if data.mask("control").sum() >= 3 else "sync"
    if fit_phase == "sync":
        notes.append(
            "fewer than 3 control-phase requests: service costs fitted on the "
            "sync phase's inactive requests"
        )
    params, service = _fit_costs(data, base, fit_phase, min_idle_requests, notes)
    params, sim_control = _fit_slots(data, params, fit_phase, bin_s, iters, notes)
    slowdown = fit_sync_slowdown(
        data, measured.get("p95_sync_ratio", float("nan")), params, bin_s, iters,
        sync_ratio_interval, notes,
    )  # fmt: skip
    params = replace(params, sync_slowdown=slowdown.sync_slowdown)
    mean_base = (
        float(np.mean(base_latency_s(data.prompt_tokens, data.output_tokens, params)))
        if data.latency_s.size
        else 0.0
    )
    if mean_base > 0:
        params = replace(params, serving_capacity_rps=round(params.slots / mean_base, 4))
    return LiveFit(
        params,
        service,
        sim_control,
        slowdown.sim_ratio,
        slowdown.floor_ratio,
        notes,
        slowdown.interval,
    )


def _fit_costs(
    data: RunData, params: SidecarParams, fit_phase: str, min_idle_requests: int, notes: list[str]
) -> tuple[SidecarParams, dict]:
    """Step 1: the per-request and per-token costs, on requests outside merge windows
    (those that found the server idle when there are enough of them)."""
    pool = data.mask(fit_phase) & ~data.sync_active
    idle = pool & (data.inflight == 0)
    use = idle if idle.sum() >= min_idle_requests else pool
    service = fit_service_costs(
        data.prompt_tokens[use], data.output_tokens[use], data.latency_s[use]
    )
    service["idle_only"] = bool(use is idle)
    if np.isfinite(service["ttft_ms"]):
        params = replace(
            params,
            ttft_ms=round(service["ttft_ms"], 4),
            prefill_ms_per_token=round(service["prefill_ms_per_token"], 6),
            decode_ms_per_token=round(service["decode_ms_per_token"], 6),
        )
    else:
        notes.append("too few requests to fit the per-token costs: base values kept")
    return params, service


def _fit_slots(
    data: RunData,
    params: SidecarParams,
    fit_phase: str,
    bin_s: float,
    iters: int,
    notes: list[str],
) -> tuple[SidecarParams, float]:
    """Step 2: ``slots`` so that the simulated control replay has the measured control
    p95; returns the parameters and the simulated p95 (ms, NaN without a control)."""
    target_control = percentile(data.latency_s[data.mask(fit_phase) & ~data.sync_active], 95)
    if fit_phase != "control" or not np.isfinite(target_control):
        notes.append("no control phase: slots kept at the base value")
        return params, float("nan")

    def control_p95(slots: float) -> float:
        lat, _ = simulate_phase(
            data, "control", replace(params, slots=slots), bin_s, with_merges=False
        )
        return percentile(lat, 95)

    lo_slots, hi_slots = 0.25, 256.0
    if control_p95(hi_slots) >= target_control:
        slots = hi_slots
        notes.append("control p95 is at the no-queueing floor: slots set to the maximum")
    elif control_p95(lo_slots) <= target_control:
        slots = lo_slots
    else:
        slots = _bisect(
            control_p95, target_control, lo_slots, hi_slots, increasing=False, iters=iters, log=True
        )
    params = replace(params, slots=round(slots, 4))
    return params, control_p95(params.slots) * 1000.0


@dataclass(frozen=True)
class SlowdownFit:
    """Step 3 of the fit: the ``sync_slowdown`` that reproduces a measured p95 sync ratio.

    Attributes:
        sync_slowdown: the fitted value (rounded to 4 decimals; the base value when the
            ratio is undefined).
        sim_ratio: the simulated ratio at that value (NaN when not fitted).
        floor_ratio: the simulated ratio with no slowdown (NaN when not fitted).
        interval: the values fitted to the two ends of the ratio's interval, if given.
    """

    sync_slowdown: float
    sim_ratio: float
    floor_ratio: float
    interval: list[float] | None = None


def fit_sync_slowdown(
    data: RunData,
    target_ratio: float,
    params: SidecarParams,
    bin_s: float = 0.05,
    iters: int = 30,
    ratio_interval: tuple[float, float] | list[float] | None = None,
    notes: list[str] | None = None,
) -> SlowdownFit:
    """Step 3: bisection on ``sync_slowdown`` so that the simulated sync replay of ``data``
    (its recorded merge windows, each repeat on its own) has ``target_ratio``.

    ``params`` supplies every other parameter (the fitted costs and slots). A target at or
    below the model's ratio with no slowdown fits as 0. What could not be fitted is
    appended to ``notes``.
    """
    notes = [] if notes is None else notes
    if not (data.mask("sync").sum() >= 3 and np.isfinite(target_ratio)):
        notes.append("p95 sync ratio undefined: sync_slowdown kept at the base value")
        return SlowdownFit(params.sync_slowdown, float("nan"), float("nan"))

    def sync_ratio(sigma: float) -> float:
        lat, act = simulate_phase(data, "sync", replace(params, sync_slowdown=sigma), bin_s)
        r = _ratio(lat, act)
        return r if np.isfinite(r) else 1.0

    floor_ratio = sync_ratio(0.0)

    def solve(target: float) -> float:
        if target <= floor_ratio:
            return 0.0
        hi = 1.0
        while sync_ratio(hi) < target and hi < 64.0:
            hi *= 2.0
        return _bisect(sync_ratio, target, 0.0, hi, increasing=True, iters=iters)

    sigma = round(solve(target_ratio), 4)
    if target_ratio <= floor_ratio:
        notes.append(
            f"measured p95 sync ratio {target_ratio:.3f} is at or below the "
            f"model's ratio with no slowdown ({floor_ratio:.3f}, from the mix of "
            f"request sizes and queueing alone): sync_slowdown = 0"
        )
    interval = None
    if ratio_interval is not None and all(np.isfinite(ratio_interval)):
        lo, hi_end = sorted(float(v) for v in ratio_interval)
        interval = [round(solve(lo), 4), round(solve(hi_end), 4)]
    sim_ratio = sync_ratio(sigma)
    if sim_ratio < target_ratio * 0.95:
        notes.append(
            f"the model cannot reproduce the measured p95 sync ratio "
            f"{target_ratio:.3f} on this window (it reaches {sim_ratio:.3f} at "
            f"sync_slowdown {sigma:g}): too few merge-active "
            f"requests, or a ratio that is not a slowdown; do not use this fit"
        )
    return SlowdownFit(sigma, sim_ratio, floor_ratio, interval)
