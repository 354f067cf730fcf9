"""Seeded trace generators, one per regime of SPEC.md §5, plus replay of a loaded trace.

A generator is a frozen dataclass called with a ``np.random.Generator``; it returns a
:class:`~diloco_gym.traces.Trace`. Same generator and seed, same trace.

Arrivals are a non-homogeneous Poisson process: the rate function ``rate_rps(t)`` is
sampled on slices of ``SLICE_S`` seconds, each slice gets a Poisson count and its arrivals
are spread uniformly inside it. Tokens are log-normal. Network and checkpoint pressure
are smoothed AR(1) processes (one sample per second) with occasional high-pressure
episodes; serving pressure is derived from the load by the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
from scipy.signal import lfilter

from diloco_gym.sidecar import SidecarParams
from diloco_gym.traces import PRESSURE_DT_S, Trace, random_window, scale_rate

__all__ = ["SyntheticRegime", "ReplayRegime", "REGIMES", "get_regime", "regime_names"]

SLICE_S = 0.1
_AR_B = np.array([1.0])


def _pressure_series(rng: np.random.Generator, n: int, mean: float, sd: float,
                     spike_rate_per_s: float, spike_s: float, spike_level: float) -> np.ndarray:
    """AR(1) pressure around ``mean`` with rare plateaus at ``spike_level``."""
    rho = 0.97  # about 30 s memory
    noise = rng.normal(0.0, sd * np.sqrt(1 - rho**2), n)
    noise[0] = rng.normal(0.0, sd)  # x[0]; noise[0] is never used by the recursion
    # x[i] = rho * x[i - 1] + noise[i] as a first-order IIR filter: scipy evaluates
    # exactly this expression per sample, so the series is bit-identical to the loop.
    x = lfilter(_AR_B, [1.0, -rho], noise)
    series = mean + x
    onsets = np.flatnonzero(rng.random(n) < spike_rate_per_s)
    length = max(1, int(round(spike_s / PRESSURE_DT_S)))
    for t in onsets:
        series[t:t + length] = np.maximum(series[t:t + length], spike_level)
    return np.clip(series, 0.0, 1.0)


@dataclass(frozen=True)
class SyntheticRegime:
    """A synthetic sidecar workload.

    Attributes:
        name: regime name.
        quiet_rate_rps: request rate outside bursts.
        busy_rate_rps: request rate inside bursts (equal to quiet for a steady regime).
        burst_period_s: mean time between burst onsets (0 = no bursts).
        burst_s: burst length (plateau), seconds.
        periodic: bursts every ``burst_period_s`` with a random phase; otherwise gaps are
            drawn uniformly in ``[0.5, 1.5] * burst_period_s``.
        ramp_s: rate ramps linearly from quiet to busy over this many seconds before the
            plateau (0 = abrupt onset), which lets a forecaster see a burst coming.
        prompt_median / prompt_sigma: log-normal prompt tokens.
        output_median / output_sigma: log-normal output tokens.
        network_mean / checkpoint_mean / pressure_sd: pressure processes.
        spike_rate_per_s / spike_s: high-pressure episodes (onsets per second, length).
        duration_s: window length, seconds.
        sidecar: the calibrated sidecar parameters of this regime.
        calibrated_on: the regime whose real-sidecar measurements the sidecar parameters
            were fitted to (SPEC.md §4.1: bursty replays took the sync-heavy interference).
    """

    name: str
    quiet_rate_rps: float
    busy_rate_rps: float
    burst_period_s: float = 0.0
    burst_s: float = 30.0
    periodic: bool = True
    ramp_s: float = 0.0
    prompt_median: float = 600.0
    prompt_sigma: float = 0.5
    output_median: float = 100.0
    output_sigma: float = 0.2
    network_mean: float = 0.3
    checkpoint_mean: float = 0.2
    pressure_sd: float = 0.12
    spike_rate_per_s: float = 1 / 200
    spike_s: float = 20.0
    spike_level: float = 0.75
    duration_s: float = 600.0
    sidecar: SidecarParams = SidecarParams()
    calibrated_on: str = ""

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, float) and (not np.isfinite(v) or v < 0):
                raise ValueError(f"{self.name}: {f.name} must be finite and >= 0, got {v}")
        if self.duration_s <= 0:
            raise ValueError(f"{self.name}: duration_s must be > 0")
        if self.busy_rate_rps < self.quiet_rate_rps:
            raise ValueError(f"{self.name}: busy_rate_rps must be >= quiet_rate_rps")

    def rate_rps(self, t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The rate function at times ``t`` (draws burst timing from ``rng``)."""
        rate = np.full(t.shape, self.quiet_rate_rps)
        if self.burst_period_s <= 0 or self.busy_rate_rps == self.quiet_rate_rps:
            return rate
        if self.periodic:
            phase = rng.uniform(0.0, self.burst_period_s)
            first = phase - self.burst_period_s
            onsets = np.arange(first, self.duration_s, self.burst_period_s)
        else:
            gaps = rng.uniform(0.5, 1.5, int(self.duration_s / self.burst_period_s * 2) + 4)
            onsets = np.cumsum(gaps * self.burst_period_s) - rng.uniform(0, self.burst_period_s)
        lift = np.zeros(t.shape)
        # A burst lifts the rate only on [onset - ramp_s, onset + burst_s); elsewhere its
        # term is 0 and max(lift, 0) = lift, so each burst touches just its own span of a
        # sorted ``t`` (the same arithmetic as over the whole grid).
        ordered = t.ndim == 1 and bool(np.all(t[1:] >= t[:-1]))
        for onset in onsets:  # onset = start of the plateau
            if ordered:
                lo, hi = np.searchsorted(t, [onset - self.ramp_s, onset + self.burst_s])
                span = slice(lo, hi)
            else:
                span = slice(None)
            ts = t[span]
            ramp = np.clip((ts - (onset - self.ramp_s)) / self.ramp_s, 0, 1) if self.ramp_s else (
                (ts >= onset).astype(float))
            inside = (ts < onset + self.burst_s) * ramp
            lift[span] = np.maximum(lift[span], inside)
        return rate + (self.busy_rate_rps - self.quiet_rate_rps) * lift

    def __call__(self, rng: np.random.Generator) -> Trace:
        n_slices = int(np.ceil(self.duration_s / SLICE_S))
        t = (np.arange(n_slices) + 0.5) * SLICE_S
        lam = self.rate_rps(t, rng) * SLICE_S
        counts = rng.poisson(lam)
        arrivals = np.repeat(np.arange(n_slices) * SLICE_S, counts) + rng.uniform(
            0, SLICE_S, counts.sum())
        arrivals = np.sort(np.minimum(arrivals, np.nextafter(self.duration_s, 0)))
        n = arrivals.size
        prompt = np.clip(np.rint(self.prompt_median * np.exp(rng.normal(0, self.prompt_sigma, n))),
                         1, 32768)
        output = np.clip(np.rint(self.output_median * np.exp(rng.normal(0, self.output_sigma, n))),
                         1, 4096)
        n_p = int(np.ceil(self.duration_s / PRESSURE_DT_S - 1e-9))
        network = _pressure_series(rng, n_p, self.network_mean, self.pressure_sd,
                                   self.spike_rate_per_s, self.spike_s, self.spike_level)
        checkpoint = _pressure_series(rng, n_p, self.checkpoint_mean, self.pressure_sd,
                                      self.spike_rate_per_s, self.spike_s, self.spike_level)
        return Trace(arrivals, prompt, output, self.duration_s, network=network,
                     checkpoint=checkpoint, name=self.name, meta={"regime": self.name})


@dataclass(frozen=True)
class ReplayRegime:
    """Replay windows of a loaded trace (a real trace, for example).

    Each seed picks a random window of ``duration_s`` (``start_s`` fixes it instead),
    optionally rescales it to ``target_rate_rps``, and adds pressure series from the
    ``pressure_from`` regime's processes when the trace has none.
    """

    trace: Trace
    duration_s: float = 600.0
    start_s: float | None = None
    target_rate_rps: float | None = None
    sidecar: SidecarParams = SidecarParams()
    pressure_from: SyntheticRegime | None = None
    name: str = "replay"
    calibrated_on: str = "sync-heavy"

    def __call__(self, rng: np.random.Generator) -> Trace:
        from diloco_gym.traces import window

        src = self.trace
        if self.target_rate_rps is not None:
            src = scale_rate(src, self.target_rate_rps)
        if self.start_s is not None:
            tr = window(src, self.start_s, self.duration_s)
        else:
            tr = random_window(src, self.duration_s, rng)
        if tr.network is None or tr.checkpoint is None:
            gen = self.pressure_from or REGIMES["sync-heavy"]
            n_p = tr.num_pressure_samples
            net = _pressure_series(rng, n_p, gen.network_mean, gen.pressure_sd,
                                   gen.spike_rate_per_s, gen.spike_s, gen.spike_level)
            ckpt = _pressure_series(rng, n_p, gen.checkpoint_mean, gen.pressure_sd,
                                    gen.spike_rate_per_s, gen.spike_s, gen.spike_level)
            tr = Trace(tr.arrival_s, tr.prompt_tokens, tr.output_tokens, tr.duration_s,
                       network=net, checkpoint=ckpt, name=tr.name, meta=tr.meta)
        return tr


# Sidecar parameters per regime, fitted so that a fixed-256 replay reproduces the
# reference's real-sidecar effect sizes (SPEC.md §5); see tests/test_calibration_targets.py
# and `python -m diloco_gym.fit` for the fit.
_SIDECAR_QUIET = SidecarParams(sync_slowdown=0.0, pressure_gain=0.0)
_SIDECAR_PRESSURE = SidecarParams(sync_slowdown=0.0, pressure_gain=1.111)
_SIDECAR_SYNC = SidecarParams(sync_slowdown=0.5, pressure_gain=0.0)

REGIMES: dict[str, SyntheticRegime] = {
    "ordinary": SyntheticRegime("ordinary", 6.0, 6.0, sidecar=_SIDECAR_QUIET,
                                calibrated_on="ordinary"),
    "pressure-heavy": SyntheticRegime(
        "pressure-heavy", 8.0, 8.0, network_mean=0.25, checkpoint_mean=0.2, pressure_sd=0.1,
        spike_rate_per_s=1 / 100, spike_s=20.0, spike_level=0.85, sidecar=_SIDECAR_PRESSURE,
        calibrated_on="pressure-heavy"),
    "sync-heavy": SyntheticRegime("sync-heavy", 10.0, 10.0, sidecar=_SIDECAR_SYNC,
                                  calibrated_on="sync-heavy"),
    "bursty": SyntheticRegime("bursty", 5.0, 17.0, burst_period_s=120.0, burst_s=30.0,
                              periodic=True, sidecar=_SIDECAR_SYNC, calibrated_on="sync-heavy"),
    "non-periodic": SyntheticRegime("non-periodic", 5.0, 17.0, burst_period_s=120.0,
                                    burst_s=25.0, periodic=False, ramp_s=12.0,
                                    sidecar=_SIDECAR_SYNC, calibrated_on="sync-heavy"),
}


def regime_names() -> list[str]:
    return list(REGIMES)


def get_regime(name: str) -> SyntheticRegime:
    """The regime called ``name``; an unknown name lists the valid ones."""
    try:
        return REGIMES[name]
    except KeyError:
        raise ValueError(f"unknown regime {name!r}; valid regimes: {', '.join(REGIMES)}") from None
