"""The steps before the measured phases: the unrecorded warm-up, the capacity probe (merge
workers idle) and the choice of the replay rate from it."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from diloco_gym.live.config import (
    BUILTIN_RATE_WITHOUT_PROBE,
    CalibrationConfig,
)
from diloco_gym.live.errors import (
    CalibrationError,
)
from diloco_gym.live.phases import (
    check_server,
)
from diloco_gym.live.probe import ProbeConfig, ProbeResult, probe_capacity, warm_up
from diloco_gym.live.replay import (
    Endpoint,
)
from diloco_gym.live.state import RunState

__all__ = [
    "warm_up_run",
    "choose_rate",
]


def warm_up_run(
    run: RunState,
    ep: Endpoint,
    model: str,
    cfg: CalibrationConfig,
    prompt: np.ndarray,
    output: np.ndarray,
    longest: tuple[int, int],
    say: Callable[[str], None],
) -> None:
    """Unrecorded warm-up: requests as long as the longest, then idle requests of the mean
    size (:func:`~diloco_gym.live.probe.warm_up`); any failure stops the run."""
    if cfg.warmup_requests == 0:
        return
    run.stage = "warm-up"
    mean = (max(1, round(float(prompt.mean()))), max(1, round(float(output.mean()))))
    t = time.monotonic()
    # A burst of a quarter of the KV cache's concurrency (twice) warms the batched path.
    burst = max(2, cfg.engine_max_concurrent // 4) if cfg.warmup_requests >= 2 else 0
    run.warmup = warm_up(
        ep,
        model,
        longest,
        mean,
        cfg.timeout_s,
        long_requests=cfg.warmup_requests,
        idle_requests=max(3, cfg.warmup_requests),
        burst=burst,
    )
    say(
        f"warm-up: {len(run.warmup['longest_s'])} requests of {longest[0]} + {longest[1]} "
        f"tokens ({', '.join(f'{v:.2f}' for v in run.warmup['longest_s'])} s), "
        f"{len(run.warmup['burst_s'])} in concurrent bursts (max "
        f"{max(run.warmup['burst_s'], default=0):.2f} s), idle latency "
        f"at the mean size {mean[0]} + {mean[1]}: p95 {run.warmup['idle_p95_s']:.2f} s "
        f"({time.monotonic() - t:.0f} s)"
    )


def choose_rate(
    run: RunState,
    ep: Endpoint,
    model: str,
    cfg: CalibrationConfig,
    builtin: bool,
    prompt: np.ndarray,
    output: np.ndarray,
    server: Any,
    say: Callable[[str], None],
) -> float | None:
    """Probe the capacity (merge workers idle) and choose the replay rate.

    ``rate_rps`` wins when given (the utilization is then only recorded); otherwise the
    rate is ``target_utilization`` x the probed capacity. Without a probe: 2 req/s with a
    built-in engine, the trace's own rate with an endpoint (``None``).
    """
    run.capacity = {"target_utilization": cfg.target_utilization}
    if cfg.probe is not None and run.warmup:
        _probe(run, ep, model, cfg, cfg.probe, prompt, output, server, say)
    if cfg.rate_rps is not None:
        rate = cfg.rate_rps
        run.capacity["rate_source"] = "--rate"
    elif run.capacity.get("capacity_rps") and math.isfinite(run.capacity["capacity_rps"]):
        rate = cfg.target_utilization * run.capacity["capacity_rps"]
        run.capacity["rate_source"] = "target_utilization x probed capacity"
    elif builtin:
        rate = BUILTIN_RATE_WITHOUT_PROBE
        run.capacity["rate_source"] = "built-in default (no probe)"
    else:
        rate = None
        run.capacity["rate_source"] = "the trace's own rate (no probe)"
    run.capacity["rate_rps"] = rate
    run.rate_rps = rate
    return rate


def _probe(
    run: RunState,
    ep: Endpoint,
    model: str,
    cfg: CalibrationConfig,
    probe: ProbeConfig,
    prompt: np.ndarray,
    output: np.ndarray,
    server: Any,
    say: Callable[[str], None],
) -> None:
    """Probe the capacity into ``run.capacity``; without ``rate_rps``, a probe that found
    no sustainable rate stops the run (:class:`CalibrationError`)."""
    run.stage = "probe"
    say(
        f"capacity probe (merge workers idle): steps of {probe.step_s:g} s, rate x"
        f"{probe.growth:g} per step, sustainable while p95 <= "
        f"{probe.p95_factor:g} x idle p95"
    )
    result: ProbeResult = probe_capacity(
        ep,
        model,
        prompt,
        output,
        run.warmup,
        cfg.timeout_s,
        replace(probe, seed=cfg.seed),
        say,
        stop=lambda: check_server(server),
    )
    run.capacity.update(capacity_rps=result.capacity_rps, probe=result.to_dict())
    if math.isfinite(result.capacity_rps):
        say(
            f"capacity: {result.capacity_rps:.2f} req/s sustainable"
            + (
                f" ({result.upper_rps:.2f} req/s was not)"
                if math.isfinite(result.upper_rps)
                else " (the ramp never saturated it)"
            )
        )
    elif cfg.rate_rps is None:
        raise CalibrationError(
            f"capacity probe: the engine did not sustain even "
            f"{result.steps[-1]['offered_rps']:.2f} req/s (p95 within "
            f"{probe.p95_factor:g} x its idle p95 of {result.idle_p95_s:.2f} s): "
            f"use a smaller model (--engine-model-config), smaller requests, or --rate"
        )
