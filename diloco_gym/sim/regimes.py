"""Seeded trace generators, one per regime, plus replay of a loaded trace.

The regimes are described in docs/model.md#synthetic-regimes.

A generator is a frozen dataclass called with a ``np.random.Generator``; it returns a
:class:`~diloco_gym.sim.traces.Trace`. Same generator and seed, same trace.

Arrivals are a non-homogeneous Poisson process whose rate ``rate_rps(t)`` is constant on
slices of ``SLICE_S`` seconds. They are drawn by time rescaling: the points of a unit-rate
Poisson process (cumulative sums of standard exponentials) are mapped through the inverse
of the cumulative expected count, which is piecewise linear, so every slice gets a Poisson
number of arrivals spread uniformly inside it - the same process as a Poisson count per
slice, at a fraction of the cost, and already sorted. Tokens are log-normal, drawn by
inversion from a table of ``2**14`` equiprobable standard-normal quantiles (one uniform per
request gives both the prompt and the output quantile). Network and checkpoint pressure are
smoothed AR(1) processes (one sample per second) with occasional high-pressure episodes;
serving pressure is derived from the load by the environment.

**Load relative to capacity.** A sidecar with ``slots`` parallel servers and a mean nominal
service time ``E[base]`` (:func:`diloco_gym.sim.sidecar.base_latency_s` of the workload's token
mix, no pressure, no merge) clears at most ``capacity = slots / E[base]`` requests per
second; a workload's *utilization* is its mean offered work over that capacity,
``U = mean_rate * E[base] / slots``. Every regime's load is defined by its utilization
under its own default sidecar (:meth:`SyntheticRegime.utilization`); with the default
sidecar the rates are exactly the ones in :data:`REGIMES`, and
:meth:`SyntheticRegime.with_load` rescales them so that another sidecar (a fitted one from a
smaller host, say) runs the regime at the same utilization, or at a chosen one. For the
default sidecar and the regimes' token mix (prompt median 600, output median 100) the
capacity is about 23 req/s, so sync-heavy's 10 req/s is U = 0.44.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cached_property, lru_cache

import numpy as np

from diloco_gym.sim import compiled, compiled_draws
from diloco_gym.sim.sidecar import SidecarParams, base_latency_s
from diloco_gym.sim.traces import PRESSURE_DT_S, Trace, random_window, scale_rate, tile_starts

__all__ = [
    "SyntheticRegime",
    "ReplayRegime",
    "REGIMES",
    "get_regime",
    "regime_names",
    "trace_utilization",
    "trace_idle_violation_pct",
    "replay_rate_scale",
]

SLICE_S = 0.1
#: Bits of a request's uniform used by each token quantile (2**14 quantiles per table).
_TOKEN_BITS = 14


#: The package file of :func:`normal_quantiles`.
NORMAL_QUANTILES_RESOURCE = f"data/normal_quantiles_{_TOKEN_BITS}.npy"


@lru_cache(maxsize=1)
def normal_quantiles() -> np.ndarray:
    """The ``2**_TOKEN_BITS`` equiprobable standard-normal quantiles, at the probabilities
    ``(k + 1/2) / 2**_TOKEN_BITS`` (``|z| < 4.01``), read-only.

    They ship with the package (``data/normal_quantiles_14.npy``, written once with
    ``scipy.special.ndtri`` of those probabilities; a test checks every value against it), so
    that a fresh process's first episode does not load ``scipy.special`` (about 0.1 s) and
    the token tables stay the same whichever scipy is installed."""
    from importlib import resources

    path = resources.files("diloco_gym").joinpath(NORMAL_QUANTILES_RESOURCE)
    k = 1 << _TOKEN_BITS
    try:
        with path.open("rb") as fh:
            z = np.load(fh, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise ValueError(
            f"cannot read diloco_gym/{NORMAL_QUANTILES_RESOURCE} ({e}): the installed package "
            "is damaged; reinstall diloco-gym"
        ) from e
    if not isinstance(z, np.ndarray) or z.dtype != np.float64 or z.shape != (k,):
        got = f"{z.dtype} {z.shape}" if isinstance(z, np.ndarray) else type(z).__name__
        raise ValueError(
            f"diloco_gym/{NORMAL_QUANTILES_RESOURCE} holds {got}, expected float64 ({k},): "
            "the installed package is damaged; reinstall diloco-gym"
        )
    z.setflags(write=False)
    return z


@lru_cache(maxsize=64)
def _token_table(median: float, sigma: float, upper: float, dtype=np.int64) -> np.ndarray:
    """Log-normal token counts at the ``2**_TOKEN_BITS`` equiprobable normal quantiles
    (:func:`normal_quantiles`), rounded and clipped to ``[1, upper]``."""
    z = normal_quantiles()
    table = np.clip(np.rint(median * np.exp(sigma * z)), 1, upper).astype(dtype)
    table.setflags(write=False)
    return table


@lru_cache(maxsize=16)
def _slice_grid(duration_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(edges, centres, widths)`` of the rate slices of a ``duration_s`` window (the last
    slice is cut at the window's end)."""
    n_slices = int(np.ceil(duration_s / SLICE_S - 1e-9))
    edges = np.minimum(np.arange(n_slices + 1) * SLICE_S, duration_s)
    out = (edges, 0.5 * (edges[:-1] + edges[1:]), np.diff(edges))
    for a in out:
        a.setflags(write=False)
    return out


def _exponential_batch(total: float) -> int:
    """Unit-rate exponentials drawn at once for ``total`` expected arrivals: enough to pass
    ``total`` with probability ~1 - 1e-9 (the compiled
    :func:`~diloco_gym.sim.jit_draws.exponential_batch`, which the compiled draws use;
    :func:`~diloco_gym.sim.jit_draws.unit_points` draws more if not)."""
    return int(compiled_draws().exponential_batch(float(total)))


def _check_generator(rng: object) -> None:
    """The compiled draws take a NumPy ``Generator`` only: one line otherwise."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"a synthetic trace draws from a numpy.random.Generator "
            f"(np.random.default_rng(seed)), got {type(rng).__name__}"
        )


def _ar1(noise: np.ndarray, rho: float) -> np.ndarray:
    """``x[i] = rho * x[i - 1] + noise[i]`` from ``x[0] = noise[0]``, along the last axis.

    The compiled first-order IIR filter (:func:`diloco_gym.sim.iir1`, bit-identical to
    ``scipy.signal.lfilter([1], [1, -rho])``, which computes exactly this expression per
    sample).
    """
    from diloco_gym.sim import iir1

    return iir1(1.0, -rho, noise)


def _pressure_series(
    rng: np.random.Generator,
    n: int,
    mean: float,
    sd: float,
    spike_rate_per_s: float,
    spike_s: float,
    spike_level: float,
) -> np.ndarray:
    """AR(1) pressure around ``mean`` with rare plateaus at ``spike_level``."""
    rho = 0.97  # about 30 s memory
    noise = rng.normal(0.0, sd * np.sqrt(1 - rho**2), n)
    noise[0] = rng.normal(0.0, sd)  # x[0]; noise[0] is never used by the recursion
    x = _ar1(noise, rho)
    series = mean + x
    onsets = np.flatnonzero(rng.random(n) < spike_rate_per_s)
    length = max(1, int(round(spike_s / PRESSURE_DT_S)))
    for t in onsets:
        series[t : t + length] = np.maximum(series[t : t + length], spike_level)
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
            were fitted to (docs/calibration.md: bursty replays took the sync-heavy interference).
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

    @property
    def mean_rate_rps(self) -> float:
        """Expected mean request rate of a window: the quiet rate plus the burst lift times
        its duty cycle (plateau plus half the linear ramp, per mean burst period)."""
        if self.burst_period_s <= 0 or self.busy_rate_rps == self.quiet_rate_rps:
            return self.quiet_rate_rps
        duty = min(1.0, (self.burst_s + 0.5 * self.ramp_s) / self.burst_period_s)
        return self.quiet_rate_rps + (self.busy_rate_rps - self.quiet_rate_rps) * duty

    def mean_service_s(self, sidecar: SidecarParams | None = None) -> float:
        """Mean nominal service time (seconds) of this regime's token mix on ``sidecar``
        (default: the regime's own), exact over the token quantile tables."""
        sc = sidecar or self.sidecar
        prompt = _token_table(self.prompt_median, self.prompt_sigma, 32768.0).mean()
        output = _token_table(self.output_median, self.output_sigma, 4096.0).mean()
        return float(base_latency_s(prompt, output, sc))

    def capacity_rps(self, sidecar: SidecarParams | None = None) -> float:
        """Requests per second ``sidecar`` clears at most on this token mix:
        ``slots / mean_service_s`` (no pressure, no merge)."""
        sc = sidecar or self.sidecar
        return sc.slots / self.mean_service_s(sc)

    def utilization(self, sidecar: SidecarParams | None = None) -> float:
        """Mean offered work over capacity, ``mean_rate_rps / capacity_rps(sidecar)``."""
        return self.mean_rate_rps / self.capacity_rps(sidecar)

    def idle_violation_pct(self, sidecar: SidecarParams | None = None) -> float:
        """Share (%) of this regime's requests whose nominal service time alone (an idle
        sidecar: no queue, no pressure, no merge) exceeds the SLO; exact over the token
        quantile tables. No load scaling can bring a replay's violation rate below it."""
        sc = sidecar or self.sidecar
        prompt = _token_table(self.prompt_median, self.prompt_sigma, 32768.0).astype(float)
        output = _token_table(self.output_median, self.output_sigma, 4096.0).astype(float)
        rest = sc.slo_ms - sc.ttft_ms - sc.decode_ms_per_token * output  # ms left for prefill
        if sc.prefill_ms_per_token > 0:
            # The prompt table is sorted (increasing quantiles): count the prompts past it.
            over = prompt.size - np.searchsorted(
                prompt, rest / sc.prefill_ms_per_token, side="right"
            )
        else:
            over = np.where(rest < 0, prompt.size, 0)
        return float(100.0 * over.sum() / (prompt.size * output.size))

    def with_load(
        self,
        sidecar: SidecarParams | None = None,
        rate_scale: float | None = None,
        target_utilization: float | None = None,
    ) -> SyntheticRegime:
        """This regime with its rates scaled for ``sidecar`` and a chosen load.

        The target utilization is ``target_utilization`` if given, else the regime's own
        utilization under its default sidecar times ``rate_scale`` (default 1). Quiet and
        busy rates are both multiplied by ``target / utilization(sidecar)``, so the burst
        shape is kept. With the default sidecar (or one of equal capacity) and no scaling
        the regime itself is returned: the same traces, seed for seed.

        Raises:
            ValueError: both or a non-positive ``rate_scale`` / ``target_utilization``.
        """
        if rate_scale is not None and target_utilization is not None:
            raise ValueError("give rate_scale or target_utilization, not both")
        for name, v in (("rate_scale", rate_scale), ("target_utilization", target_utilization)):
            if v is not None and not (np.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive number, got {v}")
        sc = sidecar or self.sidecar
        target = (
            target_utilization
            if target_utilization is not None
            else self.utilization() * (1.0 if rate_scale is None else rate_scale)
        )
        factor = target / self.utilization(sc)
        if factor == 1.0:
            return self
        return replace(
            self,
            quiet_rate_rps=self.quiet_rate_rps * factor,
            busy_rate_rps=self.busy_rate_rps * factor,
        )

    @property
    def has_bursts(self) -> bool:
        """Whether the rate ever leaves ``quiet_rate_rps`` (a burst period and a busy rate)."""
        return self.burst_period_s > 0 and self.busy_rate_rps != self.quiet_rate_rps

    def _onsets(self, rng: np.random.Generator) -> np.ndarray:
        """Burst onsets of one window (the rate function's draws from ``rng``)."""
        if self.periodic:
            phase = rng.uniform(0.0, self.burst_period_s)
            first = phase - self.burst_period_s
            return np.arange(first, self.duration_s, self.burst_period_s)
        gaps = rng.uniform(0.5, 1.5, int(self.duration_s / self.burst_period_s * 2) + 4)
        return np.cumsum(gaps * self.burst_period_s) - rng.uniform(0, self.burst_period_s)

    def rate_rps(
        self, t: np.ndarray, rng: np.random.Generator, _sorted: bool = False
    ) -> np.ndarray:
        """The rate function at times ``t`` (draws burst timing from ``rng``)."""
        rate = np.full(np.shape(t), self.quiet_rate_rps)
        if not self.has_bursts:
            return rate
        onsets = self._onsets(rng)
        return rate + (self.busy_rate_rps - self.quiet_rate_rps) * self._lift(
            np.asarray(t, dtype=np.float64), onsets, _sorted
        )

    def _lift(self, t: np.ndarray, onsets: np.ndarray, is_sorted: bool = False) -> np.ndarray:
        """Burst level in [0, 1] at ``t``: the largest over bursts of a ramp from 0 to 1 on
        ``[onset - ramp_s, onset)`` (none without a ramp) and 1 on the plateau
        ``[onset, onset + burst_s)`` (the compiled :func:`diloco_gym.sim.jit.lift_sorted`
        on the sorted times).
        """
        shape = t.shape
        t = t.reshape(-1)
        order = None
        if not is_sorted and t.size > 1 and not bool(np.all(t[1:] >= t[:-1])):
            order = np.argsort(t, kind="stable")
            t = t[order]
        lift = np.empty(t.size)
        compiled().lift_sorted(
            np.ascontiguousarray(t, dtype=np.float64),
            np.ascontiguousarray(onsets, dtype=np.float64),
            float(self.ramp_s),
            float(self.burst_s),
            lift,
        )
        if order is not None:
            lift[order] = lift.copy()
        return lift.reshape(shape)

    def draw_raw(
        self, rng: np.random.Generator, rate_rng: np.random.Generator | None = None
    ) -> tuple:
        """The random numbers of one trace, in the generator's fixed order: the burst
        timing, the unit-rate Poisson points, one uniform per request (its two token
        quantiles), the pressure noise and the pressure spikes' uniforms.

        ``rate_rng``: draw the burst timing (the rate function) from this generator
        instead, and everything else from ``rng``; the rate-clairvoyant reference
        (:mod:`diloco_gym.eval.clairvoyant`) redraws an episode's arrivals under that
        episode's own bursts with it. By default one generator draws all, bursts first.

        Returns ``(cum, points, token_u, noise, spike_u)`` (``cum``: the cumulative
        expected arrivals of the rate slices); :meth:`from_raw` turns a batch of them into
        traces' arrays.
        """
        _check_generator(rng)
        edges, t, widths = _slice_grid(self.duration_s)
        bursts = self.has_bursts
        onsets = self._onsets(rng if rate_rng is None else rate_rng) if bursts else np.zeros(0)
        cum = np.empty(t.size + 1)
        total = compiled().slice_counts(
            t,
            widths,
            np.ascontiguousarray(onsets, dtype=np.float64),
            bursts,
            float(self.quiet_rate_rps),
            float(self.busy_rate_rps - self.quiet_rate_rps),
            float(self.ramp_s),
            float(self.burst_s),
            cum,
        )
        # one compiled call: the points, the token uniforms, the pressure noise and spikes
        # (jit_draws.draw_rows: NumPy's numbers from the same generator, bit for bit)
        points, token_u, noise, spike_u = compiled_draws().draw_rows(
            rng, float(total), _exponential_batch(float(total)), self._pressure_samples
        )
        return cum, points, token_u, noise, spike_u

    @cached_property
    def _row_args(self) -> tuple:
        """What :func:`diloco_gym.sim.jit.synthetic_rows` reads of the regime besides the
        draws: the slice edges, the arrival cap, the token tables and bits, and the pressure
        series' constants."""
        edges = _slice_grid(self.duration_s)[0]
        rho = 0.97  # about 30 s memory
        tables = (
            # uint16 holds every count (1..32768) exactly and keeps the tables in cache
            _token_table(self.prompt_median, self.prompt_sigma, 32768.0, np.uint16),
            _token_table(self.output_median, self.output_sigma, 4096.0, np.uint16),
            _TOKEN_BITS,
        )
        pressure_args = (
            float(self.pressure_sd * np.sqrt(1 - rho**2)),
            float(1.0 / np.sqrt(1 - rho**2)),  # x[0] ~ N(0, sd): the stationary law
            rho,
            np.array([self.network_mean, self.checkpoint_mean], dtype=np.float64),
            float(self.spike_rate_per_s),
            max(1, int(round(self.spike_s / PRESSURE_DT_S))),
            float(self.spike_level),
        )
        return edges, float(np.nextafter(edges[-1], 0.0)), tables, pressure_args

    def draw_batch(self, rngs: list[np.random.Generator]) -> tuple:
        """``from_raw([draw_raw(rng) for rng in rngs])``, bit for bit, each generator left
        as ``draw_raw`` leaves it: the burst timings here, then every trace's draws and
        arrays in one compiled call (:func:`diloco_gym.sim.jit_draws.synthetic_batch`)."""
        for r in rngs:
            _check_generator(r)
        _, t, widths = _slice_grid(self.duration_s)
        bursts = self.has_bursts
        onsets = [self._onsets(r) if bursts else np.zeros(0) for r in rngs]
        offsets = np.zeros(len(rngs) + 1, dtype=np.int64)
        np.cumsum([o.size for o in onsets], out=offsets[1:])
        edges, cap, tables, pressure_args = self._row_args
        return compiled_draws().synthetic_batch(
            tuple(rngs), np.concatenate(onsets).astype(np.float64, copy=False), offsets, t,
            widths, bursts, float(self.quiet_rate_rps),
            float(self.busy_rate_rps - self.quiet_rate_rps), float(self.ramp_s),
            float(self.burst_s), self._pressure_samples, edges, cap, *tables, *pressure_args,
        )  # fmt: skip

    @property
    def _pressure_samples(self) -> int:
        return int(np.ceil(self.duration_s / PRESSURE_DT_S - 1e-9))

    def from_raw(self, raws: list[tuple], dtype=np.int64, scratch: dict | None = None) -> tuple:
        """The arrays of the traces of :meth:`draw_raw`'s draws, all in one compiled call
        (:func:`diloco_gym.sim.jit.synthetic_rows`).

        ``scratch``: a dict of arrays this method keeps and reuses between calls for the
        batch's joined draws and its outputs (the vector env's restarts: no fresh memory per
        batch, which the allocator would otherwise take from the system and fault in anew);
        the outputs are then views into it, valid until the next call with it.

        Returns ``(arrival_s, prompt, output, counts, pressure)``: the traces' requests
        concatenated (tokens as ``dtype``), ``counts`` per trace, and ``pressure``
        ``(B, 2, samples)``, network then checkpoint pressure per second.
        """
        b = len(raws)
        counts = np.fromiter((r[1].size for r in raws), dtype=np.int64, count=b)
        offsets = np.zeros(b + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])

        def buffer(name: str, shape: tuple, kind=np.float64) -> np.ndarray:
            if scratch is None:
                return np.empty(shape, dtype=kind)
            size = int(np.prod(shape))
            have = scratch.get(name)
            if have is None or have.size < size or have.dtype != kind:
                have = scratch[name] = np.empty(max(size, int(size * 1.25)), dtype=kind)
            return have[:size].reshape(shape)

        def stacked(k: int) -> np.ndarray:
            if b == 1:
                return raws[0][k][None]
            first = raws[0][k]
            return np.stack([r[k] for r in raws], out=buffer(f"raw{k}", (b, *first.shape)))

        def joined(k: int) -> np.ndarray:
            if b == 1:
                return raws[0][k]
            return np.concatenate([r[k] for r in raws], out=buffer(f"raw{k}", (int(offsets[-1]),)))

        m = int(offsets[-1])
        arrivals = buffer("arrivals", (m,))
        prompt = buffer("prompt", (m,), dtype)
        output = buffer("output", (m,), dtype)
        noise = stacked(3)
        pressure = buffer("pressure", noise.shape)
        edges, cap, tables, pressure_args = self._row_args
        compiled().synthetic_rows(
            joined(1), offsets, stacked(0), edges, cap, joined(2), *tables, noise, stacked(4),
            *pressure_args, arrivals, prompt, output, pressure,
        )  # fmt: skip
        return arrivals, prompt, output, counts, pressure

    def draw(
        self,
        rng: np.random.Generator,
        dtype=np.int64,
        rate_rng: np.random.Generator | None = None,
    ):
        """One trace's arrays: ``(arrival_s, prompt_tokens, output_tokens, network,
        checkpoint)`` (tokens as ``dtype``): :meth:`draw_raw` (``rate_rng`` as there) and
        :meth:`from_raw` on a batch of one, or for int64 tokens from one generator
        :meth:`draw_batch` of one (the same arrays in one compiled call). Calling the
        generator wraps exactly these into a validated :class:`Trace`; the vector env
        builds many at once.
        """
        if rate_rng is None and np.dtype(dtype) == np.int64:
            arrivals, prompt, output, _, pressure = self.draw_batch([rng])
        else:
            raw = self.draw_raw(rng, rate_rng)
            arrivals, prompt, output, _, pressure = self.from_raw([raw], dtype)
        return arrivals, prompt, output, pressure[0, 0], pressure[0, 1]

    def __call__(
        self, rng: np.random.Generator, rate_rng: np.random.Generator | None = None
    ) -> Trace:
        """One trace (``rate_rng`` as in :meth:`draw_raw`)."""
        arrivals, prompt, output, network, checkpoint = self.draw(rng, rate_rng=rate_rng)
        return Trace(
            arrivals,
            prompt,
            output,
            self.duration_s,
            network=network,
            checkpoint=checkpoint,
            name=self.name,
            meta={"regime": self.name},
        )


def trace_utilization(trace: Trace, sidecar: SidecarParams) -> float:
    """Mean offered work of ``trace`` over ``sidecar``'s capacity on the trace's own token
    mix: ``mean_rate * mean(base_latency) / slots`` (see the module docstring)."""
    if trace.num_requests == 0:
        return 0.0
    service = float(base_latency_s(trace.prompt_tokens, trace.output_tokens, sidecar).mean())
    return trace.mean_rate_rps * service / sidecar.slots


def trace_idle_violation_pct(trace: Trace, sidecar: SidecarParams) -> float:
    """Share (%) of ``trace``'s requests whose nominal service time alone exceeds the SLO
    (see :meth:`SyntheticRegime.idle_violation_pct`)."""
    if trace.num_requests == 0:
        return 0.0
    base = base_latency_s(trace.prompt_tokens, trace.output_tokens, sidecar)
    return float(100.0 * np.mean(base > sidecar.slo_s))


def replay_rate_scale(
    trace: Trace,
    sidecar: SidecarParams,
    rate_scale: float | None = None,
    target_utilization: float | None = None,
) -> float:
    """The factor by which to speed up ``trace`` (:func:`~diloco_gym.sim.traces.scale_rate`:
    time compressed, every request kept): ``rate_scale`` as given, or the one that brings
    :func:`trace_utilization` under ``sidecar`` to ``target_utilization``; 1 by default.

    Raises:
        ValueError: both given, a non-positive value, or an empty trace.
    """
    if rate_scale is not None and target_utilization is not None:
        raise ValueError("give --rate-scale or --target-utilization, not both")
    for name, v in (("rate_scale", rate_scale), ("target_utilization", target_utilization)):
        if v is not None and not (np.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a positive number, got {v}")
    if target_utilization is None:
        return 1.0 if rate_scale is None else float(rate_scale)
    u = trace_utilization(trace, sidecar)
    if u <= 0:
        raise ValueError(f"trace {trace.name} has no requests: no utilization to scale")
    return float(target_utilization / u)


@dataclass(frozen=True)
class ReplayRegime:
    """Replay windows of a loaded trace (a real trace, for example).

    Each seed picks a random window of ``duration_s`` (``start_s`` fixes it instead),
    optionally rescales it to ``target_rate_rps``, and adds pressure series from the
    ``pressure_from`` regime's processes when the trace has none (drawn from the seed).

    Random windows overlap one another: episodes cut that way are not independent units.
    For a statistical comparison use :meth:`tiles`, one fixed window per episode.
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
        from diloco_gym.sim.traces import window

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
            net = _pressure_series(
                rng,
                n_p,
                gen.network_mean,
                gen.pressure_sd,
                gen.spike_rate_per_s,
                gen.spike_s,
                gen.spike_level,
            )
            ckpt = _pressure_series(
                rng,
                n_p,
                gen.checkpoint_mean,
                gen.pressure_sd,
                gen.spike_rate_per_s,
                gen.spike_s,
                gen.spike_level,
            )
            tr = Trace(
                tr.arrival_s,
                tr.prompt_tokens,
                tr.output_tokens,
                tr.duration_s,
                network=net,
                checkpoint=ckpt,
                name=tr.name,
                meta=tr.meta,
            )
        return tr

    def tiles(self, stride_s: float | None = None) -> list[ReplayRegime]:
        """One fixed-window regime per window tiling the (rate-scaled) trace.

        Windows of ``duration_s`` start every ``stride_s`` seconds (default: the window
        length, so they are disjoint and each is an independent unit); see
        :func:`diloco_gym.sim.traces.tile_starts`. Each tile keeps this regime's sidecar,
        pressure source and rate target.

        Raises:
            ValueError: when no window fits in the trace.
        """
        src = self.trace
        if self.target_rate_rps is not None:
            src = scale_rate(src, self.target_rate_rps)
        return [
            replace(self, start_s=start)
            for start in tile_starts(src.duration_s, self.duration_s, stride_s)
        ]


# Sidecar parameters per regime, fitted so that a fixed-256 replay reproduces the
# reference's real-sidecar effect sizes (docs/paper.md#real-sidecar-effect-sizes); see
# tests/eval/test_calibration_targets.py and `python -m diloco_gym.eval.calibration` for the fit.
_SIDECAR_QUIET = SidecarParams(sync_slowdown=0.0, pressure_gain=0.0)
_SIDECAR_PRESSURE = SidecarParams(sync_slowdown=0.0, pressure_gain=1.111)
_SIDECAR_SYNC = SidecarParams(sync_slowdown=0.5, pressure_gain=0.0)

REGIMES: dict[str, SyntheticRegime] = {
    "ordinary": SyntheticRegime(
        "ordinary", 6.0, 6.0, sidecar=_SIDECAR_QUIET, calibrated_on="ordinary"
    ),
    "pressure-heavy": SyntheticRegime(
        "pressure-heavy",
        8.0,
        8.0,
        network_mean=0.25,
        checkpoint_mean=0.2,
        pressure_sd=0.1,
        spike_rate_per_s=1 / 100,
        spike_s=20.0,
        spike_level=0.85,
        sidecar=_SIDECAR_PRESSURE,
        calibrated_on="pressure-heavy",
    ),
    "sync-heavy": SyntheticRegime(
        "sync-heavy", 10.0, 10.0, sidecar=_SIDECAR_SYNC, calibrated_on="sync-heavy"
    ),
    "bursty": SyntheticRegime(
        "bursty",
        5.0,
        17.0,
        burst_period_s=120.0,
        burst_s=30.0,
        periodic=True,
        sidecar=_SIDECAR_SYNC,
        calibrated_on="sync-heavy",
    ),
    "non-periodic": SyntheticRegime(
        "non-periodic",
        5.0,
        17.0,
        burst_period_s=120.0,
        burst_s=25.0,
        periodic=False,
        ramp_s=12.0,
        sidecar=_SIDECAR_SYNC,
        calibrated_on="sync-heavy",
    ),
}


def regime_names() -> list[str]:
    return list(REGIMES)


def get_regime(name: str) -> SyntheticRegime:
    """The regime called ``name``; an unknown name lists the valid ones."""
    try:
        return REGIMES[name]
    except KeyError:
        raise ValueError(f"unknown regime {name!r}; valid regimes: {', '.join(REGIMES)}") from None
