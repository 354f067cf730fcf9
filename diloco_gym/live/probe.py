"""Warm-up and capacity probe of a serving endpoint, with the merge workers idle.

A calibration replays its trace at a fraction (the *target utilization*) of what the
engine can carry on this host, so that the no-merge control stays below the SLO and the
effect of a merge is measured on a serving system that is busy but not saturated. This
module measures that capacity:

1. :func:`warm_up`: requests as long as the window's longest, one at a time (the first
   requests of a fresh engine are several times slower: allocation, kernel selection), then
   requests of the window's mean size whose latency is the *idle* latency.
2. :func:`probe_capacity`: a short ramp of offered load. Each step replays
   ``rate x step_s`` requests at uniformly drawn (seeded) times over ``step_s`` seconds,
   with request sizes drawn from the window's; a step is *sustainable* when at least
   ``min_completed`` of its requests completed successfully within ``step_s`` plus a grace
   time, and its p95 latency is at most ``p95_factor`` times the idle p95. The ramp
   multiplies the rate by ``growth`` until a step is not sustainable twice in a row at the
   same rate (one failure can be a transient) or ``max_steps`` is reached; when the first
   rate fails, it is halved (twice at most);
   the capacity is the highest sustainable rate (a lower bound; the first unsustainable
   rate is the upper bound).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from diloco_gym.live.errors import CalibrationError, EndpointUnavailableError
from diloco_gym.live.replay import (
    Endpoint,
    OpenLoopReplayer,
    RequestRecord,
    make_prompt,
    post_completion,
)
from diloco_gym.sim.sidecar import percentile
from diloco_gym.sim.traces import Trace

__all__ = ["ProbeConfig", "warm_up", "probe_capacity", "ProbeResult"]


@dataclass(frozen=True)
class ProbeConfig:
    """Capacity-probe settings.

    Attributes:
        step_s: length of one step of the ramp (seconds of offered load).
        max_steps: most steps.
        growth: rate multiplier between steps (> 1).
        start_rps: rate of the first step (``None``: half the one-at-a-time rate,
            ``0.5 / mean idle latency``).
        p95_factor: a sustainable step has p95 <= ``p95_factor`` x the idle p95.
        min_completed: a sustainable step completes at least this fraction of its requests
            successfully within ``step_s`` plus the grace time.
        grace_s: grace time after a step's last send (``None``: ``max(1, 3 x idle p95)``).
        seed: seeds the arrivals and request sizes.
    """

    step_s: float = 8.0
    max_steps: int = 8
    growth: float = 1.5
    start_rps: float | None = None
    p95_factor: float = 4.0
    min_completed: float = 0.95
    grace_s: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("step_s", "p95_factor"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"ProbeConfig.{name} must be > 0, got {v!r}")
        if not (isinstance(self.growth, (int, float)) and self.growth > 1):
            raise ValueError(f"ProbeConfig.growth must be > 1, got {self.growth!r}")
        if not isinstance(self.max_steps, int) or self.max_steps < 1:
            raise ValueError(f"ProbeConfig.max_steps must be an int >= 1, got {self.max_steps!r}")
        if not 0 < self.min_completed <= 1:
            raise ValueError("ProbeConfig.min_completed must be in (0, 1]")
        if self.start_rps is not None and not self.start_rps > 0:
            raise ValueError("ProbeConfig.start_rps must be > 0")


@dataclass
class ProbeResult:
    """What the probe found.

    Attributes:
        capacity_rps: highest sustainable offered rate (``nan`` when none was).
        upper_rps: first unsustainable rate (``nan`` when the ramp never failed).
        idle_p95_s / idle_mean_s: latency of warm requests of the mean size, one at a time.
        steps: one dict per step (rate, sent, ok, completed in time, p95, sustainable).
    """

    capacity_rps: float
    upper_rps: float
    idle_p95_s: float
    idle_mean_s: float
    steps: list[dict]
    config: ProbeConfig

    def to_dict(self) -> dict:
        return {
            "capacity_rps": self.capacity_rps,
            "upper_rps": self.upper_rps,
            "idle_p95_s": self.idle_p95_s,
            "idle_mean_s": self.idle_mean_s,
            "steps": self.steps,
            "config": asdict(self.config),
        }


def _post_or_raise(
    ep: Endpoint, model: str, prompt_tokens: int, output_tokens: int, salt: int, timeout_s: float
) -> float:
    start = time.monotonic()
    status, _, err = post_completion(
        ep, model, make_prompt(prompt_tokens, salt), output_tokens, timeout_s
    )
    if status == 0:
        raise EndpointUnavailableError(f"warm-up request to {ep.url} failed ({err})")
    if err:
        raise CalibrationError(f"warm-up request to {ep.url} failed: {err}")
    return time.monotonic() - start


def warm_up(
    ep: Endpoint,
    model: str,
    longest: tuple[int, int],
    mean: tuple[int, int],
    timeout_s: float,
    long_requests: int = 2,
    idle_requests: int = 5,
    burst: int = 0,
) -> dict:
    """Warm the engine with the longest request and a concurrent burst, then time idle
    requests of the mean size.

    A continuous-batching engine is slow on the first batches of each new shape (a fresh
    engine on CPU answered its first requests 10-50x slower than later ones), so besides
    the longest request, ``burst`` concurrent requests of the mean size (unrecorded) warm
    the batched path before the idle latency is timed.

    Returns:
        ``{"longest_s": [...], "burst_s": [...], "idle_s": [...], "idle_p95_s",
        "idle_mean_s"}``.

    Raises:
        EndpointUnavailableError / CalibrationError: a warm-up request failed (a request as
            long as the longest one that fails now would fail during the run).
    """
    longest_s = [
        _post_or_raise(ep, model, longest[0], longest[1], 10_000 + i, timeout_s)
        for i in range(long_requests)
    ]
    burst_s: list[float] = []
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            burst_s.append(_post_or_raise(ep, model, mean[0], mean[1], 30_000 + i, timeout_s))
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    for rnd in range(2 if burst > 0 else 0):
        threads = [
            threading.Thread(target=one, args=(rnd * burst + i,), daemon=True) for i in range(burst)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout_s + 1.0)
        if errors:
            raise errors[0]
    idle_s = [
        _post_or_raise(ep, model, mean[0], mean[1], 20_000 + i, timeout_s)
        for i in range(max(1, idle_requests))
    ]
    return {
        "longest_s": longest_s,
        "burst_s": sorted(burst_s),
        "idle_s": idle_s,
        "idle_p95_s": percentile(np.asarray(idle_s), 95),
        "idle_mean_s": float(np.mean(idle_s)),
    }


def _poisson_step(
    rate: float, step_s: float, prompt: np.ndarray, output: np.ndarray, rng: np.random.Generator
) -> Trace:
    # The count is fixed by the rate (uniform arrival times given the count, as in a
    # Poisson process): a short step must offer its rate, not a lucky draw below it.
    n = max(1, round(rate * step_s))
    arrivals = np.sort(rng.uniform(0.0, step_s, size=n))
    pick = rng.integers(0, prompt.size, size=n)
    return Trace(arrivals, prompt[pick], output[pick], step_s, name="probe")


def probe_capacity(
    ep: Endpoint,
    model: str,
    prompt_tokens: np.ndarray,
    output_tokens: np.ndarray,
    idle: dict,
    timeout_s: float,
    cfg: ProbeConfig | None = None,
    say: Callable[[str], None] = lambda message: None,
    stop: Callable[[], None] = lambda: None,
) -> ProbeResult:
    """Ramp offered load until the endpoint stops keeping up (module docstring).

    Args:
        ep / model: the endpoint and the model id.
        prompt_tokens / output_tokens: the request sizes to draw from (the window's).
        idle: :func:`warm_up`'s result (idle p95 and mean latency).
        timeout_s: per-request timeout.
        cfg: probe settings.
        say: progress lines.
        stop: called between polls; raise from it to abort (e.g. a dead server).

    Returns:
        The probe's result; ``capacity_rps`` is NaN when even the first step (after two
        halvings of its rate) was not sustainable.
    """
    cfg = cfg or ProbeConfig()
    prompt = np.asarray(prompt_tokens, dtype=np.int64)
    output = np.asarray(output_tokens, dtype=np.int64)
    if prompt.size == 0:
        raise ValueError("probe_capacity needs at least one request size")
    idle_p95, idle_mean = float(idle["idle_p95_s"]), float(idle["idle_mean_s"])
    limit_s = cfg.p95_factor * idle_p95
    grace = cfg.grace_s if cfg.grace_s is not None else max(1.0, 3.0 * idle_p95)
    ramp = _Ramp(cfg.start_rps or 0.5 / max(idle_mean, 1e-3), cfg.growth)
    rng = np.random.default_rng([cfg.seed, 11])
    steps: list[dict] = []
    t0 = time.monotonic()
    while len(steps) < cfg.max_steps:
        trace = _poisson_step(ramp.rate, cfg.step_s, prompt, output, rng)
        replayer = OpenLoopReplayer(ep, model, timeout_s, lambda: time.monotonic() - t0)
        records, deadline = _offer_step(replayer, trace, t0, cfg.step_s + grace, stop)
        step = _score_step(records, deadline, ramp.rate, cfg, limit_s)
        steps.append(step)
        say(_step_line(len(steps), step))
        # Let the engine drain before the next step, so that steps do not pile up.
        _drain_wait(replayer, timeout_s, stop)
        if not ramp.advance(step["sustainable"]):
            break
    return ProbeResult(ramp.best, ramp.upper, idle_p95, idle_mean, steps, cfg)


@dataclass
class _Ramp:
    """The ramp between steps: the next rate, the bounds found so far, and the retries
    (kept apart from the stepping so that the rule reads in one place)."""

    rate: float
    growth: float
    best: float = float("nan")
    upper: float = float("nan")
    retries: int = 0
    confirmed: bool = False

    def advance(self, ok: bool) -> bool:
        """Set the next step's rate after a step that was sustainable (``ok``) or not;
        False when the ramp ends."""
        if ok:
            self.best = self.rate
            if self.upper <= self.rate:  # an earlier failure below this rate was transient
                self.upper = float("nan")
            self.rate *= self.growth
            self.confirmed = False
            return True
        self.upper = self.rate
        if not self.confirmed:
            # One failure can be a transient (a cold batch shape, another process taking
            # the cores): the same rate is tried once more before it counts.
            self.confirmed = True
            return True
        self.confirmed = False
        if math.isnan(self.best) and self.retries < 2:
            self.retries += 1
            self.rate /= 2.0
            return True
        return False


def _offer_step(
    replayer: OpenLoopReplayer,
    trace: Trace,
    t0: float,
    length_s: float,
    stop: Callable[[], None],
) -> tuple[list[RequestRecord], float]:
    """Replay one step's ``trace`` from 0.2 s from now for ``length_s`` (its sends plus the
    grace time), then close the replayer; returns its records and the step's deadline."""
    origin = time.monotonic() - t0 + 0.2
    replayer.start_phase("probe", trace, origin, trace.prompt_tokens, trace.output_tokens)
    deadline = origin + length_s
    try:
        while time.monotonic() - t0 < deadline:
            stop()
            time.sleep(0.1)
        records = replayer.snapshot()
    finally:
        replayer.close()
    return records, deadline


def _score_step(
    records: list[RequestRecord], deadline: float, rate: float, cfg: ProbeConfig, limit_s: float
) -> dict:
    """The record of one step: what was answered in time, its p95, whether sustainable."""
    sent = sum(r.sent for r in records)
    # Requests not answered by the deadline count as infinitely slow in the p95.
    lat = np.array(
        [
            r.latency_s if r.ok and r.send_s + r.latency_s <= deadline else np.inf
            for r in records
            if r.sent
        ]
    )
    in_time = lat[np.isfinite(lat)]
    # "higher": no interpolation, so that a tail of unanswered requests gives inf
    # rather than inf - inf.
    p95 = float(np.percentile(lat, 95, method="higher")) if lat.size else float("inf")
    completed = len(in_time) / max(1, len(records))
    ok = completed >= cfg.min_completed and p95 <= limit_s
    return {
        "offered_rps": rate,
        "requests": len(records),
        "sent": sent,
        "ok_in_time": len(in_time),
        "throughput_rps": len(in_time) / cfg.step_s,
        "completed_fraction": completed,
        "p95_s": p95 if math.isfinite(p95) else None,
        "p95_limit_s": limit_s,
        "sustainable": bool(ok),
    }


def _step_line(n: int, step: dict) -> str:
    """The progress line of step ``n``."""
    p95 = step["p95_s"]
    return (
        f"probe step {n}: {step['offered_rps']:.2f} req/s offered, {step['ok_in_time']}/"
        f"{step['requests']} answered in time, p95 "
        + (f"{p95:.2f} s" if p95 is not None else "n/a")
        + f" (limit {step['p95_limit_s']:.2f} s): "
        f"{'sustainable' if step['sustainable'] else 'NOT sustainable'}"
    )


def _drain_wait(replayer: OpenLoopReplayer, timeout_s: float, stop: Callable[[], None]) -> None:
    deadline = time.monotonic() + timeout_s + 1.0
    while replayer.outstanding > 0 and time.monotonic() < deadline:
        stop()
        time.sleep(0.1)
