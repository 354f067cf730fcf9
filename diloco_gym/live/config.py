"""What a live calibration run is configured with: :class:`CalibrationConfig` and the
defaults it resolves against (a built-in engine or an external endpoint)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Any

from diloco_gym.live.engine import (
    EngineModelConfig,
)
from diloco_gym.live.merges import MergeConfig
from diloco_gym.live.probe import ProbeConfig
from diloco_gym.live.server import SidecarModelConfig
from diloco_gym.sim.sidecar import SidecarParams

__all__ = [
    "CalibrationConfig",
    "BUILTIN_DEFAULTS",
    "BUILTIN_RATE_WITHOUT_PROBE",
    "ENDPOINT_DEFAULTS",
    "ENGINES",
    "default_engine_threads",
]


#: Defaults used with a built-in engine when a field of the config is ``None``: a tiny CPU
#: model serves a few requests/s of this size, so the regimes' native sizes would swamp it.
#: The rate comes from the capacity probe (``target_utilization`` of the capacity); 2 req/s
#: only when the probe is off.
BUILTIN_DEFAULTS: dict[str, Any] = {
    "rate_rps": None,
    "output_scale": 0.5,
    "max_prompt_tokens": 256,
    "max_output_tokens": 256,
}


#: Rate of a built-in engine when neither ``rate_rps`` nor the probe sets one.
BUILTIN_RATE_WITHOUT_PROBE = 2.0


#: The engines ``calibrate`` can start itself (without an endpoint).
ENGINES = ("transformers", "builtin-fallback")


#: Defaults against an external endpoint (the trace as it is).
ENDPOINT_DEFAULTS: dict[str, Any] = {
    "rate_rps": None,
    "output_scale": 1.0,
    "max_prompt_tokens": 4096,
    "max_output_tokens": 1024,
}


@dataclass(frozen=True)
class CalibrationConfig:
    """Everything about a live calibration run besides the endpoint and the trace.

    Attributes:
        seed: seeds the trace window, the regime's trace and the merge schedule.
        start_s: start of the trace window (``None``: a seeded random window).
        rate_rps: rescale the trace to this mean request rate before windowing
            (``None``: built-in sidecar 2 req/s, external endpoint the trace's own rate).
        output_scale: multiply each request's output tokens (``None``: 0.5 built-in, 1).
        max_prompt_tokens / max_output_tokens: caps on the sent sizes (``None``: defaults
            of :data:`BUILTIN_DEFAULTS` / :data:`ENDPOINT_DEFAULTS`).
        model: model id sent in requests (``None``: the built-in model, or the first id
            the endpoint lists under ``/v1/models``).
        timeout_s: per-request socket timeout.
        merge: merge workers, tensor size and backend.
        merge_seconds: planned length of a merge window (the paper's 8 s).
        gap_seconds: range of the gap between merge windows, drawn uniformly.
        lead_seconds: time before the first merge window.
        control: run the no-sync control phase.
        pressure_norm_inflight: in-flight count at which the pressure proxy reaches 1.
        high_pressure: pressure threshold of the high class.
        warmup_requests: unrecorded requests sent (one at a time) before the run.
        max_outstanding: most requests outstanding at once (beyond, sends are delayed).
        max_error_fraction: a run in which more than this fraction of the sent requests
            failed (refused, timed out, HTTP errors, invalid responses) is incomplete.
        label: the regime key under ``regimes`` (default: the replayed regime; required
            with a trace file or a :class:`Trace`, whose name is not a regime).
        sidecar: configuration of the built-in sidecar.
        base_sidecar: parameters the fit does not touch come from here (default: the
            regime's calibrated parameters, or ``SidecarParams()`` for a trace file).
        progress_every_s: seconds between progress lines.
        kill_worker_at_merge: fault injection for tests: SIGKILL worker rank 1 (or 0 when
            there is one) half a second into this merge.
        engine: without an endpoint, which server to start: ``"transformers"`` (a real
            continuous-batching engine, :mod:`diloco_gym.live.engine`, needs the ``live``
            extra) or ``"builtin-fallback"`` (the dependency-free server of
            :mod:`diloco_gym.live.server`).
        engine_model: size of the ``transformers`` engine's model.
        engine_max_concurrent: requests of the longest size its KV cache holds at once.
        engine_threads: torch intra-op threads of the ``transformers`` engine (``None``: the
            cores the merge workers leave, :func:`default_engine_threads`). On a CPU host an
            engine with more threads than free cores stalls at every parallel region
            whenever another process holds one of its cores, which makes its latency
            erratic (measured: see docs/calibration.md).
        engine_start_timeout_s: how long the engine may take to answer ``/health``.
        probe: capacity-probe settings (:class:`~diloco_gym.live.probe.ProbeConfig`);
            ``None`` skips the probe (the rate is then ``rate_rps``, or 2 req/s with a
            built-in engine, or the trace's own rate).
        target_utilization: without ``rate_rps``, the replay's mean rate is this fraction
            of the probed capacity. The default 0.5 keeps the no-merge control well inside
            the probe's sustainable region (p95 within ``probe.p95_factor`` of idle), so that
            merges are measured on a busy but unsaturated engine.
        repeats: sync/control phase pairs; the order within each pair is drawn from the
            seed. Effect sizes are pooled over all repeats and get a bootstrap interval
            over repeats (:func:`~diloco_gym.live.fit.bootstrap_intervals`).
        bootstrap_resamples: resamples of that bootstrap.
        overload_inflight: stop the run (overload) when more requests than this are
            outstanding for longer than ``overload_grace_s``, or more than four times this
            at any moment (``None``: ``max(16, 2 x rate x merge_seconds, 4 x rate x p95 of
            the highest sustainable probe step)``, or ``max(64, 2 x rate x merge_seconds)``
            without a probe). The grace lets the backlog of one merge
            drain: a merge may stall the engine for its whole window, and a continuous-
            batching engine clears such a backlog quickly afterwards.
        overload_grace_s: see ``overload_inflight`` (``None``: ``max(10, 2 x
            merge_seconds)``).
        overload_timeout_fraction: stop the run when more than this fraction of a phase's
            answered requests timed out (after at least 3 timeouts).
        link_shares: the sync intensities measured: link shares in (0, 1], one of them 1.
            With more than one, every repeat adds a sync phase per share below 1 whose
            merges all-reduce at that share of the unthrottled rate, and the interference
            function of the fleet model is fitted (:mod:`diloco_gym.live.intensity`).
        interference_resamples: bootstrap resamples of that fit's intervals.
    """

    seed: int = 0
    start_s: float | None = None
    rate_rps: float | None = None
    output_scale: float | None = None
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    model: str | None = None
    timeout_s: float = 30.0
    merge: MergeConfig = field(default_factory=MergeConfig)
    merge_seconds: float = 8.0
    gap_seconds: tuple[float, float] = (8.0, 16.0)
    lead_seconds: float = 2.0
    control: bool = True
    pressure_norm_inflight: float = 4.0
    high_pressure: float = 0.6
    warmup_requests: int = 2
    max_outstanding: int = 256
    max_error_fraction: float = 0.5
    label: str | None = None
    sidecar: SidecarModelConfig = field(default_factory=SidecarModelConfig)
    base_sidecar: SidecarParams | None = None
    progress_every_s: float = 5.0
    kill_worker_at_merge: int | None = None
    engine: str = "transformers"
    engine_model: EngineModelConfig = field(default_factory=EngineModelConfig)
    engine_max_concurrent: int = 32
    engine_threads: int | None = None
    engine_start_timeout_s: float = 180.0
    probe: ProbeConfig | None = field(default_factory=ProbeConfig)
    target_utilization: float = 0.5
    repeats: int = 3
    bootstrap_resamples: int = 2000
    overload_inflight: int | None = None
    overload_grace_s: float | None = None
    overload_timeout_fraction: float = 0.2
    link_shares: tuple[float, ...] = (1.0,)
    interference_resamples: int = 200

    def __post_init__(self) -> None:  # noqa: C901 - one check per option, in sequence
        for name in ("timeout_s", "merge_seconds", "pressure_norm_inflight", "progress_every_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"CalibrationConfig.{name} must be > 0, got {v!r}")
        lo, hi = self.gap_seconds
        if not 0 <= lo <= hi:
            raise ValueError(
                f"CalibrationConfig.gap_seconds must be (lo, hi) with "
                f"0 <= lo <= hi, got {self.gap_seconds!r}"
            )
        if self.lead_seconds < 0:
            raise ValueError("CalibrationConfig.lead_seconds must be >= 0")
        if self.rate_rps is not None and not self.rate_rps > 0:
            raise ValueError(f"CalibrationConfig.rate_rps must be > 0, got {self.rate_rps!r}")
        if self.output_scale is not None and not self.output_scale > 0:
            raise ValueError("CalibrationConfig.output_scale must be > 0")
        if not 0 < self.high_pressure <= 1:
            raise ValueError("CalibrationConfig.high_pressure must be in (0, 1]")
        if not 0 <= self.max_error_fraction <= 1:
            raise ValueError("CalibrationConfig.max_error_fraction must be in [0, 1]")
        for name, low in (("warmup_requests", 0), ("max_outstanding", 1)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"CalibrationConfig.{name} must be an int >= {low}, got {v!r}")
        for name in ("max_prompt_tokens", "max_output_tokens"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"CalibrationConfig.{name} must be None or an int >= 1, got {v!r}")
        if not isinstance(self.merge, MergeConfig):
            raise ValueError("CalibrationConfig.merge must be a MergeConfig")
        if self.engine not in ENGINES:
            raise ValueError(
                f"CalibrationConfig.engine must be one of {', '.join(ENGINES)}, got {self.engine!r}"
            )
        if not (
            isinstance(self.target_utilization, (int, float)) and 0 < self.target_utilization <= 1
        ):
            raise ValueError(
                f"CalibrationConfig.target_utilization must be in (0, 1], got "
                f"{self.target_utilization!r}"
            )
        for name, low in (("repeats", 1), ("engine_max_concurrent", 1), ("bootstrap_resamples", 0)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"CalibrationConfig.{name} must be an int >= {low}, got {v!r}")
        if self.overload_inflight is not None and (
            not isinstance(self.overload_inflight, int) or self.overload_inflight < 1
        ):
            raise ValueError(
                f"CalibrationConfig.overload_inflight must be None or an int "
                f">= 1, got {self.overload_inflight!r}"
            )
        if self.overload_grace_s is not None and not self.overload_grace_s >= 0:
            raise ValueError("CalibrationConfig.overload_grace_s must be None or >= 0")
        if not 0 < self.overload_timeout_fraction <= 1:
            raise ValueError("CalibrationConfig.overload_timeout_fraction must be in (0, 1]")
        if self.engine_threads is not None and (
            not isinstance(self.engine_threads, int)
            or isinstance(self.engine_threads, bool)
            or self.engine_threads < 1
        ):
            raise ValueError(
                f"CalibrationConfig.engine_threads must be None or an int >= 1, got "
                f"{self.engine_threads!r}"
            )
        if not self.engine_start_timeout_s > 0:
            raise ValueError("CalibrationConfig.engine_start_timeout_s must be > 0")
        _check_link_shares(self.link_shares)
        if not isinstance(self.interference_resamples, int) or self.interference_resamples < 0:
            raise ValueError(
                f"CalibrationConfig.interference_resamples must be an int >= 0, got "
                f"{self.interference_resamples!r}"
            )

    @property
    def shares_below_one(self) -> tuple[float, ...]:
        """The link shares below 1, largest first (their sync phases are ``sync@U``)."""
        return tuple(sorted((u for u in self.link_shares if u < 1.0), reverse=True))

    def resolved(self, builtin: bool) -> CalibrationConfig:
        """The config with its ``None`` defaults filled for the built-in sidecar or not."""
        defaults = BUILTIN_DEFAULTS if builtin else ENDPOINT_DEFAULTS
        return replace(self, **{k: v for k, v in defaults.items() if getattr(self, k) is None})


def default_engine_threads(merge: MergeConfig, cpus: int | None = None) -> int:
    """Threads for a CPU engine beside the merge workers: the cores they leave, at least 1.

    Each merge worker runs ``merge.torch_threads`` threads; the engine gets the rest of the
    host's ``cpus`` (default: the CPUs this process may use).
    """
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        cpus = cpus or os.cpu_count() or 1
    return max(1, cpus - merge.workers * merge.torch_threads)


def _check_link_shares(shares: object) -> None:
    """``link_shares`` is a tuple of distinct numbers in (0, 1] that holds 1."""
    if not isinstance(shares, tuple) or not shares:
        raise ValueError(f"CalibrationConfig.link_shares must be a non-empty tuple, got {shares!r}")
    for u in shares:
        if isinstance(u, bool) or not isinstance(u, int | float) or not 0.0 < u <= 1.0:
            raise ValueError(f"CalibrationConfig.link_shares must lie in (0, 1], got {u!r}")
    if len(set(shares)) != len(shares):
        raise ValueError(f"CalibrationConfig.link_shares has a share twice: {list(shares)}")
    if 1.0 not in shares:
        raise ValueError(
            f"CalibrationConfig.link_shares must include 1 (the full-rate sync phase the "
            f"calibration's own entry measures), got {list(shares)}"
        )
