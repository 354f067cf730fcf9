"""Live calibration: measure real merge interference on a real serving endpoint.

:func:`run_calibration` replays a trace window against an OpenAI-compatible completions
endpoint, open loop, while real merges (:mod:`diloco_gym.live.merges`) run on the same
machine, then measures the effect sizes (docs/calibration.md), fits the sidecar model to them
(:mod:`diloco_gym.live.fit`) and writes a calibration file that
:func:`diloco_gym.eval.calibration.load_calibration` reads.

A run has two phases over the *same* trace window (so the second is the no-sync load
match of docs/protocol.md):

1. **sync**: the window is replayed while merges run at a seeded schedule: merge windows
   of ``merge_seconds`` separated by gaps drawn uniformly from ``gap_seconds``, the first
   after ``lead_seconds``. A merge window is open from the moment the merge command is
   sent to the moment every worker has reported done (all-reduces plus checkpoint), so it
   can outlast its planned length; these *recorded* windows define "sync active".
2. **control**: the same window replayed with no merges.

Without an endpoint the built-in sidecar (:mod:`diloco_gym.live.server`) is started on
127.0.0.1 and stopped at the end.

The output file (written atomically: temporary file, fsync, rename) follows the
calibration schema ``diloco_gym/data/calibration.schema.json`` (``source``, ``regimes``,
``complete``, ``error``, ``fitted_sidecar``, ``fit``, ``measured``, ``metadata``,
``schedule``, ``merges``, ``requests`` (counts) and ``records``: one column per field of
:class:`~diloco_gym.live.replay.RequestRecord`); a complete document is validated against
it before it is written.

Only a complete run writes the target file. Partial measurements always go *beside* it,
to :func:`partial_path` (``NAME.partial.json`` for ``NAME.json``), so a failed run never
replaces a good calibration: after the sync phase (so that a run killed outright still
leaves its first half behind) and when a run fails. A complete run removes a stale
partial file.

Every ``/v1/completions`` answer is validated (JSON object, a ``choices`` list with a
``text``, ``usage.completion_tokens`` within ``max_tokens`` when usage is reported, see
:func:`~diloco_gym.live.replay.check_completion`); an invalid one is a failed request.
When more than ``max_error_fraction`` (default 0.5) of the sent requests failed, the run
is incomplete and the error says how many failed, of which kind, and the first error.

Faults: the endpoint down at start raises :class:`EndpointUnavailableError`; a merge
worker that dies, the built-in sidecar dying, too many failed requests, or an endpoint
whose ``/v1/models`` answers an error or garbage (without ``--model``) raise
:class:`CalibrationError`; Ctrl-C re-raises :class:`KeyboardInterrupt` (SIGTERM, which the
command turns into :class:`CalibrationTerminated`, likewise). In every case the
measurements so far are saved with ``"complete": false`` and an ``error`` message, and all
child processes are stopped and reaped before the function returns or raises.
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from diloco_gym.eval.calibration import CalibrationFileError, validate_calibration
from diloco_gym.live.engine import (
    LIVE_EXTRA_HINT,
    EngineModelConfig,
    EngineProcess,
    engine_available,
    kv_settings,
    start_engine,
)
from diloco_gym.live.errors import (
    CalibrationError,
    CalibrationTerminated,
    EndpointUnavailableError,
    MergeWorkerError,
)
from diloco_gym.live.fit import (
    RunData,
    bootstrap_intervals,
    fit_sidecar_live,
    measured_effect_sizes,
)
from diloco_gym.live.merges import MergeCluster, MergeConfig, MergeReport
from diloco_gym.live.probe import ProbeConfig, ProbeResult, probe_capacity, warm_up
from diloco_gym.live.replay import (
    CpuSampler,
    Endpoint,
    OpenLoopReplayer,
    RequestRecord,
    probe_endpoint,
)
from diloco_gym.live.server import SidecarModelConfig, SidecarProcess, start_sidecar
from diloco_gym.sim.sidecar import SidecarParams
from diloco_gym.sim.traces import Trace, random_window, scale_rate, window

__all__ = [
    "CalibrationConfig",
    "CalibrationResult",
    "run_calibration",
    "plan_merges",
    "prepare_trace",
    "partial_path",
    "BUILTIN_DEFAULTS",
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

    def __post_init__(self) -> None:
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

    def resolved(self, builtin: bool) -> CalibrationConfig:
        """The config with its ``None`` defaults filled for the built-in sidecar or not."""
        defaults = BUILTIN_DEFAULTS if builtin else ENDPOINT_DEFAULTS
        return replace(self, **{k: v for k, v in defaults.items() if getattr(self, k) is None})


@dataclass
class CalibrationResult:
    """What :func:`run_calibration` measured and wrote.

    Attributes:
        path: the calibration file.
        document: its content.
        complete: the run finished as planned.
    """

    path: str
    document: dict

    @property
    def complete(self) -> bool:
        return bool(self.document.get("complete"))

    @property
    def measured(self) -> dict:
        return self.document.get("measured", {})

    @property
    def fitted_sidecar(self) -> dict:
        return self.document.get("fitted_sidecar", {})

    @property
    def out_of_range(self) -> str | None:
        """Why the fitted sidecar is outside the model's range (slower than the SLO)."""
        return (self.document.get("fit") or {}).get("out_of_range")


# --------------------------------------------------------------------------- preparation


def check_source(source: str | os.PathLike[str]) -> Path:
    """The trace file ``source`` names, when it is not a regime.

    Raises:
        ValueError: ``source`` is neither a regime nor an existing file (a usage error,
            checked before anything starts).
    """
    from diloco_gym.sim.regimes import REGIMES

    path = Path(source)
    if not path.exists():
        raise ValueError(
            f"{source!s} is neither a regime ({', '.join(REGIMES)}) nor an existing trace file"
        )
    return path


def prepare_trace(
    source: str | os.PathLike[str] | Trace,
    duration_s: float,
    cfg: CalibrationConfig,
    trace_format: str = "auto",
) -> tuple[Trace, str, SidecarParams, dict]:
    """Resolve the source and cut the replayed window.

    Args:
        source: a regime name, a trace file, or a :class:`Trace`.
        duration_s: window length, seconds.
        cfg: the (resolved) config: seed, start, rate.
        trace_format: format of a trace file (see :func:`diloco_gym.sim.loaders.load_trace`).

    Returns:
        ``(window, label, base sidecar parameters, provenance)``.

    Raises:
        ValueError: unknown regime and no such file, a label that is not a regime, or a
            window outside the trace.
    """
    from diloco_gym.sim.regimes import REGIMES

    rng = np.random.default_rng(cfg.seed)
    full, label, base, info = _resolve_source(source, cfg, trace_format, rng)
    label = cfg.label or label
    if label not in REGIMES:
        raise ValueError(
            f"the calibration file's entry needs a regime name, and {label!r} is not one: "
            f"pass --label (label=) one of {', '.join(REGIMES)}, the regime whose "
            f"measurements this trace stands for"
        )
    info["native_rate_rps"] = full.mean_rate_rps
    if full.num_requests and None not in (
        cfg.output_scale,
        cfg.max_prompt_tokens,
        cfg.max_output_tokens,
    ):
        # The longest request any window of this trace can send (after the caps): the
        # engine's KV cache is sized for it before the window is cut.
        p_all, o_all = _token_arrays(full, cfg)
        info["longest_prompt_tokens"] = int(p_all.max())
        info["longest_output_tokens"] = int(o_all.max())
    if cfg.rate_rps is not None:
        full = scale_rate(full, cfg.rate_rps)
    if cfg.start_s is not None:
        win = window(full, cfg.start_s, duration_s)
    else:
        win = random_window(full, duration_s, rng)
    info.update(
        window_start_s=float(win.meta.get("window_start_s", 0.0)),
        duration_s=float(duration_s),
        rate_rps=cfg.rate_rps,
        requests=win.num_requests,
    )
    return win, label, cfg.base_sidecar or base, info


def _resolve_source(
    source: str | os.PathLike[str] | Trace,
    cfg: CalibrationConfig,
    trace_format: str,
    rng: np.random.Generator,
) -> tuple[Trace, str, SidecarParams, dict]:
    """The whole trace of a :class:`Trace`, a regime (drawn from ``rng``) or a file, with
    its label, base sidecar parameters and provenance."""
    from diloco_gym.sim.regimes import REGIMES, get_regime

    info: dict[str, Any]
    if isinstance(source, Trace):
        full, label, base, info = (
            source,
            source.name,
            SidecarParams(),
            {"kind": "trace", "name": source.name},
        )
    elif isinstance(source, str) and source in REGIMES:
        regime = get_regime(source)
        full = regime(rng)
        label, base = source, regime.sidecar
        info = {"kind": "regime", "name": source, "seed": cfg.seed}
    else:
        path = check_source(source)
        from diloco_gym.sim.loaders import load_trace

        full = load_trace(path, trace_format, seed=cfg.seed)
        label, base = full.name, SidecarParams()
        info = {
            "kind": "file",
            "path": str(path),
            "format": full.meta.get("format"),
            "rows_read": full.meta.get("rows_read"),
        }
    return full, label, base, info


def plan_merges(duration_s: float, cfg: CalibrationConfig) -> list[tuple[float, float]]:
    """Planned merge windows ``(start, length)`` of the sync phase (seeded).

    Windows start at ``lead_seconds`` and are separated by gaps drawn uniformly from
    ``gap_seconds``; a window that would not end inside the phase is dropped, except that
    a phase always has at least one merge when it is longer than the lead.
    """
    rng = np.random.default_rng([cfg.seed, 7])
    lo, hi = cfg.gap_seconds
    plan: list[tuple[float, float]] = []
    t = cfg.lead_seconds
    while t + cfg.merge_seconds <= duration_s:
        plan.append((round(t, 3), cfg.merge_seconds))
        t += cfg.merge_seconds + float(rng.uniform(lo, hi))
    if not plan and duration_s > cfg.lead_seconds:
        plan.append((cfg.lead_seconds, max(0.1, (duration_s - cfg.lead_seconds) / 2)))
    return plan


def _token_arrays(win: Trace, cfg: CalibrationConfig) -> tuple[np.ndarray, np.ndarray]:
    prompt = np.clip(win.prompt_tokens, 1, cfg.max_prompt_tokens)
    output = np.clip(np.rint(win.output_tokens * cfg.output_scale), 1, cfg.max_output_tokens)
    return prompt.astype(np.int64), output.astype(np.int64)


# --------------------------------------------------------------------------- the run


@dataclass
class _Run:
    """Mutable state of one run (what a partial file needs)."""

    t0: float
    started_utc: str
    label: str = ""
    base: SidecarParams = field(default_factory=SidecarParams)
    trace_info: dict = field(default_factory=dict)
    plan: list[tuple[float, float]] = field(default_factory=list)
    merges: list[dict] = field(default_factory=list)
    phases: dict = field(default_factory=dict)
    endpoint: dict = field(default_factory=dict)
    cluster: dict = field(default_factory=dict)
    replayer: OpenLoopReplayer | None = None
    error: str | None = None
    stage: str = "setup"
    order: list[tuple[str, int]] = field(default_factory=list)
    current: tuple[str, int] | None = None
    capacity: dict = field(default_factory=dict)
    warmup: dict = field(default_factory=dict)
    rate_rps: float | None = None
    overload_limit: int = 64
    over_since: float | None = None

    def clock(self) -> float:
        return time.monotonic() - self.t0


def _default_progress(message: str) -> None:
    print(f"[calibrate] {message}", flush=True)


def _sleep_until(clock: Callable[[], float], when: float) -> None:
    while True:
        left = when - clock()
        if left <= 0:
            return
        time.sleep(min(left, 0.2))


def _finite(x: Any) -> Any:
    """JSON-safe value: NaN and infinities become ``None``; numpy scalars become Python."""
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def _write_atomic(path: Path, document: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    text = json.dumps(_finite(document), indent=1, allow_nan=False)
    with open(tmp, "w") as handle:
        handle.write(text + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _run_data(records: list[RequestRecord], run: _Run) -> RunData:
    keys = {(p["name"], p["repeat"]): p for p in run.phases.values()}
    ok = [r for r in records if r.ok and (r.phase, r.repeat) in keys]
    origin = {key: p["origin_s"] for key, p in keys.items()}
    windows: dict[int, list[tuple[float, float]]] = {}
    for m in run.merges:
        k = m.get("repeat", 0)
        if m.get("end_s") is not None and ("sync", k) in origin:
            o = origin[("sync", k)]
            windows.setdefault(k, []).append((m["start_s"] - o, m["end_s"] - o))
    first = keys.get(("sync", 0), {})
    control: dict = next((p for (name, _), p in keys.items() if name == "control"), {})
    return RunData(
        phase=np.array([r.phase for r in ok], dtype=object),
        offset_s=np.array([r.send_s - origin[(r.phase, r.repeat)] for r in ok], dtype=np.float64),
        latency_s=np.array([r.latency_s for r in ok], dtype=np.float64),
        prompt_tokens=np.array([r.prompt_tokens for r in ok], dtype=np.int64),
        output_tokens=np.array([r.output_tokens for r in ok], dtype=np.int64),
        sync_active=np.array([r.merge_active for r in ok], dtype=bool),
        inflight=np.array([r.inflight for r in ok], dtype=np.int64),
        cpu_util=np.array([r.cpu_util for r in ok], dtype=np.float64),
        windows_s=windows.get(0, []),
        sync_duration_s=float(first.get("duration_s", 0.0)),
        control_duration_s=float(control.get("duration_s", 0.0)),
        repeat=np.array([r.repeat for r in ok], dtype=np.int64),
        windows_by_repeat=windows,
    )


def _request_counts(records: list[RequestRecord]) -> dict:
    done = [r for r in records if r.done]
    by_status: dict[str, int] = {}
    for r in done:
        if r.status == 200 and r.error:
            key = "invalid response"
        else:
            key = str(r.status) if r.status else (r.error or "error")
        by_status[key] = by_status.get(key, 0) + 1
    return {
        "planned": len(records),
        "sent": sum(r.sent for r in records),
        "completed": len(done),
        "ok": sum(r.ok for r in records),
        "errors": sum(1 for r in done if not r.ok),
        "timeouts": sum(1 for r in done if r.error == "timed out"),
        "refused": sum(1 for r in done if r.error == "connection refused"),
        "invalid": sum(1 for r in done if r.error.startswith("invalid response")),
        "unfinished": sum(1 for r in records if r.sent and not r.done),
        "sync_active": sum(1 for r in records if r.ok and r.phase == "sync" and r.merge_active),
        "sync_inactive": sum(
            1 for r in records if r.ok and r.phase == "sync" and not r.merge_active
        ),
        "control": sum(1 for r in records if r.ok and r.phase == "control"),
        "by_status": by_status,
    }


def _records_columns(records: list[RequestRecord]) -> dict:
    names = [f.name for f in fields(RequestRecord)]
    cols: dict[str, list] = {name: [] for name in names}
    for r in records:
        for name in names:
            cols[name].append(getattr(r, name))
    cols["ok"] = [r.ok for r in records]
    return cols


def _document(run: _Run, complete: bool, cfg: CalibrationConfig, intervals: bool = True) -> dict:
    """The calibration file's content from the run so far (``intervals=False`` skips the
    bootstrap, for the partial file saved after each phase)."""
    records = run.replayer.snapshot() if run.replayer is not None else []
    counts = _request_counts(records)
    measured: dict = {}
    fit: dict = {}
    fitted: dict = {}
    regimes: dict = {}
    if counts["ok"]:
        measured, fit, fitted, entry = _measure_and_fit(records, run, complete, cfg, intervals)
        regimes[run.label] = entry
    metadata = _metadata(run, cfg)
    if fitted and regimes:
        _mark_out_of_range(fitted, fit, regimes[run.label], metadata)
    ep = run.endpoint.get("url", "?")
    source = (
        f"live calibration (diloco-gym calibrate) of {ep} "
        f"[{run.endpoint.get('kind', 'endpoint')}] with real "
        f"{run.cluster.get('backend', '?')} merges on {socket.gethostname()}, "
        f"started {run.started_utc}. p95 ratios use linear-interpolation percentiles; "
        f"high pressure = in-flight proxy >= {cfg.high_pressure}; sync active = sent "
        f"inside a recorded merge window."
    )
    document = {
        "source": source,
        "regimes": regimes,
        "complete": bool(complete),
        "error": run.error,
        "stage": run.stage,
        "measured": measured,
        "fitted_sidecar": fitted,
        "fit": fit,
        "requests": counts,
        "capacity": run.capacity,
        "metadata": metadata,
        "schedule": [{"start_s": s, "length_s": n} for s, n in run.plan],
        "merges": run.merges,
        "records": _records_columns(records),
    }
    document["uncertain"] = uncertain_reasons(document)
    return document


#: A control phase whose p95 is more than this many times the probe's p95 at a load at
#: least as high says that the host was busier during the replay than during the probe.
CONTROL_VS_PROBE_LIMIT = 3.0


def uncertain_reasons(document: dict) -> list[str]:
    """Why a live calibration's numbers may not hold, one sentence each (empty: none seen):

    * the capacity probe was unstable: a step at or below the accepted capacity failed (the
      capacity was accepted on a retry, so it, and the replay rate drawn from it, may be
      overstated);
    * the control phase's p95 is more than :data:`CONTROL_VS_PROBE_LIMIT` times the probe's
      p95 at the lowest sustainable probed rate at or above the replay's rate (the host was
      busier during the replay than during the probe);
    * the fit contradicts the measurement: the measured p95 sync ratio is below 1 (requests
      were faster while merges ran) but the fitted ``sync_slowdown`` slows service during
      merges.
    """
    out: list[str] = []
    cap = document.get("capacity") or {}
    steps = (cap.get("probe") or {}).get("steps") or []
    best = cap.get("capacity_rps")
    if isinstance(best, float | int) and math.isfinite(best):
        failed = sorted(
            {s["offered_rps"] for s in steps if not s["sustainable"] and s["offered_rps"] <= best}
        )
        if failed:
            out.append(
                f"unstable capacity probe: the step at {', '.join(_fmt(r) for r in failed)} "
                f"req/s failed, yet {_fmt(best)} req/s was accepted on a retry, so the "
                f"capacity and the replay rate drawn from it may be overstated"
            )
    m = document.get("measured") or {}
    control_ms, rate = m.get("p95_control_ms"), cap.get("rate_rps")
    if isinstance(control_ms, float | int) and math.isfinite(control_ms) and rate:
        above = [
            s for s in steps if s["sustainable"] and s.get("p95_s") and s["offered_rps"] >= rate
        ]
        if above:
            ref = min(above, key=lambda s: s["offered_rps"])
            factor = control_ms / 1000 / ref["p95_s"]
            if factor > CONTROL_VS_PROBE_LIMIT:
                out.append(
                    f"control p95 {_fmt(control_ms / 1000)} s is {factor:.1f}x the probe's "
                    f"{_fmt(ref['p95_s'])} s at {_fmt(ref['offered_rps'])} req/s (a load at "
                    f"least the replay's {_fmt(rate)} req/s): the host was busier during the "
                    f"replay than during the probe"
                )
    ratio = m.get("p95_sync_ratio")
    slowdown = (document.get("fitted_sidecar") or {}).get("sync_slowdown")
    if (
        isinstance(ratio, float | int)
        and math.isfinite(ratio)
        and ratio < 1
        and isinstance(slowdown, float | int)
        and slowdown > 0
    ):
        out.append(
            f"the fit contradicts the measurement: the measured p95 sync ratio is "
            f"{_fmt(ratio)} (< 1: requests were faster while merges ran) but the fitted "
            f"sync_slowdown {_fmt(slowdown)} slows service during merges"
        )
    return out


def _mark_out_of_range(fitted: dict, fit: dict, entry: dict, metadata: dict) -> None:
    """Mark a calibration whose fitted sidecar is slower than the SLO (every request
    violates it: outside the model's range) in ``fit["out_of_range"]`` and the regime's
    note; the command warns about it."""
    from diloco_gym.eval.calibration import slower_than_slo

    try:
        why = slower_than_slo(SidecarParams(**fitted), {"metadata": metadata})
    except (TypeError, ValueError):  # a degenerate partial fit: nothing to judge
        return
    if why:
        fit["out_of_range"] = why
        entry["note"] = entry.get("note", "") + "; outside the model's range: slower than the SLO"


def _measure_and_fit(
    records: list[RequestRecord],
    run: _Run,
    complete: bool,
    cfg: CalibrationConfig,
    intervals: bool,
) -> tuple[dict, dict, dict, dict]:
    """The effect sizes (with bootstrap intervals), the fit, the fitted parameters and the
    regime's entry, from the successful requests so far: ``(measured, fit, fitted, entry)``.
    """
    data = _run_data(records, run)
    measured = measured_effect_sizes(data, cfg.pressure_norm_inflight, cfg.high_pressure)
    boot = bootstrap_intervals(
        data,
        cfg.pressure_norm_inflight,
        cfg.high_pressure,
        cfg.bootstrap_resamples if intervals else 0,
        seed=cfg.seed,
    )
    measured["intervals"] = boot
    fitted: dict = {}
    try:
        live_fit = fit_sidecar_live(
            data, measured, run.base, sync_ratio_interval=boot["p95_sync_ratio"]
        )
        fit = live_fit.to_dict()
        fitted = fit.pop("fitted_sidecar")
    except (ValueError, FloatingPointError) as exc:  # a degenerate partial run
        fit = {"error": f"fit failed: {exc}"}
    return measured, fit, fitted, _regime_entry(measured, boot, complete)


def _regime_entry(measured: dict, boot: dict, complete: bool) -> dict:
    """The regime's entry under ``regimes``: the effect sizes (an undefined one written as
    1.0 and listed), their intervals, and a note."""
    undefined = [k for k in ("p95_high_low", "p95_sync_ratio") if not math.isfinite(measured[k])]
    entry = {
        k: (measured[k] if k not in undefined else 1.0) for k in ("p95_high_low", "p95_sync_ratio")
    }
    entry["pressure_latency_corr"] = measured["pressure_latency_corr"]
    for k in ("p95_sync_ratio", "p95_high_low"):
        if boot.get(k) is not None and k not in undefined:
            entry[f"{k}_ci"] = boot[k]
    entry["note"] = (
        "live calibration"
        + ("" if complete else " (incomplete run)")
        + (
            f"; undefined (empty class), written as 1.0: {', '.join(undefined)}"
            if undefined
            else ""
        )
    )
    if undefined:
        entry["undefined"] = undefined
    return entry


def _metadata(run: _Run, cfg: CalibrationConfig) -> dict:
    """The file's ``metadata``: how the run was set up, where and when it ran."""
    return {
        "warmup": run.warmup,
        "phase_order": [_phase_key(n, k) for n, k in run.order],
        "overload_inflight_limit": run.overload_limit,
        "endpoint": _portable(run.endpoint),
        "trace": run.trace_info,
        "label": run.label,
        "merges": _portable(run.cluster),
        "started_utc": run.started_utc,
        "elapsed_s": run.clock(),
        "phases": run.phases,
        "config": _portable(_finite(_config_dict(cfg))),
        "pressure_proxy": (
            f"min(1, client in-flight requests at send / {cfg.pressure_norm_inflight})"
        ),
        "host": {
            "hostname": socket.gethostname(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "torch": _torch_version(),
        },
        "clock": "seconds since the run started (time.monotonic)",
    }


#: Machine-specific fields a calibration file leaves out: the server's command line (a
#: virtual environment's executable, temporary model directories) and the merge workers'
#: temporary checkpoint directory. The versions and the model configuration stay.
_MACHINE_FIELDS = ("command", "checkpoint_dir")


def _portable(value: Any) -> Any:
    """``value`` without machine paths: the :data:`_MACHINE_FIELDS` dropped and every
    absolute filesystem path replaced by its last component (a model directory's name)."""
    if isinstance(value, dict):
        return {k: _portable(v) for k, v in value.items() if k not in _MACHINE_FIELDS}
    if isinstance(value, list | tuple):
        return [_portable(v) for v in value]
    if isinstance(value, str) and "://" not in value and os.path.isabs(value):
        return os.path.basename(value.rstrip("/\\")) or value
    return value


def _config_dict(cfg: CalibrationConfig) -> dict:
    out = asdict(cfg)
    out["gap_seconds"] = list(cfg.gap_seconds)
    return out


def _torch_version() -> str:
    try:
        import torch

        return str(torch.__version__)
    except ImportError:  # pragma: no cover - torch is required to get here
        return "unavailable"


@dataclass
class _Job:
    """The fixed inputs of one run, shared by its steps."""

    endpoint: str | None
    source: str | os.PathLike[str] | Trace
    duration_s: float
    trace_format: str
    cfg: CalibrationConfig
    say: Callable[[str], None]
    out: Path
    partial: Path

    @property
    def builtin(self) -> bool:
        return self.endpoint is None


@dataclass
class _Window:
    """The replayed trace window and the request sizes sent for it (after the caps)."""

    trace: Trace
    prompt: np.ndarray
    output: np.ndarray


@dataclass
class _Resources:
    """What a run starts and must release, whatever happens: the progress ticker, the
    replayer (held by ``run``), the merge workers, the server with its start-up thread and
    the CPU sampler. :meth:`close` releases them in that order."""

    run: _Run
    cpu: CpuSampler
    cluster: MergeCluster | None = None
    server: SidecarProcess | EngineProcess | None = None
    starter: threading.Thread | None = None
    server_box: dict = field(default_factory=dict)  # the start-up thread's "handle" or "error"
    ticker_stop: threading.Event = field(default_factory=threading.Event)
    ticker: threading.Thread | None = None

    def start_server(self, start: Callable[[], Any]) -> None:
        """Run ``start`` in a thread; its server (or its error) lands in ``server_box``."""

        def _start_server() -> None:
            try:
                self.server_box["handle"] = start()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
                self.server_box["error"] = exc

        self.starter = threading.Thread(target=_start_server, name="server-start", daemon=True)
        self.starter.start()

    def join_starter(self) -> None:
        """Wait for the start-up thread (if any) and take the server it brought up."""
        if self.starter is not None:
            self.starter.join()
            self.server = self.server_box.get("handle")

    def start_ticker(self, every_s: float, say: Callable[[str], None]) -> None:
        """Print a progress line every ``every_s`` seconds until :meth:`close`."""
        run = self.run

        def _tick() -> None:
            assert run.replayer is not None  # set before the ticker starts
            while not self.ticker_stop.wait(every_s):
                c = run.replayer.counts() if run.replayer else {}
                say(
                    f"t={run.clock():6.1f} s {run.stage}: sent {c.get('sent', 0)}/"
                    f"{c.get('planned', 0)}, ok {c.get('ok', 0)}, errors "
                    f"{c.get('errors', 0)}, outstanding {c.get('outstanding', 0)}, merge "
                    f"{'active' if run.replayer.state.merge_id >= 0 else 'idle'}"
                )

        self.ticker = threading.Thread(target=_tick, name="calibrate-progress", daemon=True)
        self.ticker.start()

    def close(self) -> None:
        """Release everything, in order; the server only once its start-up has finished."""
        self.ticker_stop.set()
        if self.ticker is not None:
            self.ticker.join(timeout=1.0)
        if self.run.replayer is not None:
            self.run.replayer.close()
        if self.cluster is not None:
            self.cluster.close()
        # An interrupted start-up may still be bringing the server up: wait for it so that
        # it can be stopped rather than orphaned.
        self.join_starter()
        if self.server is not None:
            self.server.stop()
        self.cpu.stop()


def run_calibration(
    endpoint: str | None,
    source: str | os.PathLike[str] | Trace,
    duration_s: float,
    out_path: str | os.PathLike[str],
    *,
    trace_format: str = "auto",
    config: CalibrationConfig | None = None,
    progress: Callable[[str], None] | None = _default_progress,
) -> CalibrationResult:
    """Measure merge interference on a serving endpoint and write a calibration file.

    Args:
        endpoint: ``http://host:port`` of an OpenAI-compatible server, or ``None`` to start
            the built-in sidecar on 127.0.0.1.
        source: a regime name (:data:`diloco_gym.sim.regimes.REGIMES`), a trace file, or a
            :class:`~diloco_gym.sim.traces.Trace`.
        duration_s: length of the replayed trace window; each phase lasts this long.
        out_path: the calibration file to write.
        trace_format: format of a trace file (``auto`` detects it).
        config: run configuration (defaults: :class:`CalibrationConfig`).
        progress: called with one line of text at each step (``None``: silent).

    Returns:
        The result of a complete run (``result.complete`` is True), written to
        ``out_path``.

    Raises:
        EndpointUnavailableError: the endpoint does not answer at start.
        CalibrationError: a merge worker died, the sidecar died, too many requests failed
            or the endpoint lists no model; the partial file (:func:`partial_path`, never
            ``out_path``) is at ``exc.path``.
        KeyboardInterrupt: (or :class:`CalibrationTerminated`) re-raised after saving the
            partial file; its ``path`` attribute names it (``None`` if nothing was saved).
        ValueError: bad arguments (unknown regime, window outside the trace, ...).
    """
    if not (isinstance(duration_s, (int, float)) and math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"duration_s must be > 0, got {duration_s!r}")
    out = Path(out_path)
    cfg = (config or CalibrationConfig()).resolved(endpoint is None)
    say = progress or (lambda message: None)
    job = _Job(endpoint, source, duration_s, trace_format, cfg, say, out, partial_path(out))
    if job.builtin and cfg.engine == "transformers" and not engine_available():
        raise CalibrationError(LIVE_EXTRA_HINT)
    run = _Run(
        t0=time.monotonic(), started_utc=datetime.now(timezone.utc).isoformat(timespec="seconds")
    )
    window, longest = _first_cut(job, run)
    resources = _Resources(run, CpuSampler().start())
    try:
        document = _measure(job, run, resources, window, longest)
    except BaseException as exc:
        _record_failure(job, run, exc)
        raise
    finally:
        resources.close()
    return _write_complete(job, document)


def _first_cut(job: _Job, run: _Run) -> tuple[_Window, tuple[int, int]]:
    """Cut the window at the given rate (or the trace's own) and plan the phases.

    This first cut gives the request sizes for the warm-up and the probe; with the probe's
    rate the window is cut again (:func:`_recut_window`). Returns the window and the
    longest request ``(prompt, output)`` any window of the trace can send.
    """
    cfg = job.cfg
    win, run.label, run.base, run.trace_info = prepare_trace(
        job.source, job.duration_s, cfg, job.trace_format
    )
    prompt, output = _token_arrays(win, cfg)
    run.plan = plan_merges(job.duration_s, cfg)
    run.order = phase_order(cfg)
    longest = (
        run.trace_info.get("longest_prompt_tokens", int(prompt.max(initial=1))),
        run.trace_info.get("longest_output_tokens", int(output.max(initial=1))),
    )
    return _Window(win, prompt, output), longest


def _measure(
    job: _Job, run: _Run, res: _Resources, window: _Window, longest: tuple[int, int]
) -> dict:
    """Every step of a run in order, up to the validated complete document (not written)."""
    cfg, say = job.cfg, job.say
    if job.builtin:
        url, model = _start_builtin(job, run, res, longest)
    else:
        url, model = _connect_external(job, run, res, window, longest)
    assert res.cluster is not None  # started by either step
    run.cluster = res.cluster.describe()
    say(
        f"{cfg.merge.workers} merge workers ready: {res.cluster.backend} all-reduce of "
        f"{cfg.merge.merge_mb:g} MiB over {run.cluster['init_method']}"
    )
    ep = Endpoint.parse(url)
    if job.builtin:
        _warm_up(run, ep, model, cfg, window.prompt, window.output, longest, say)
    rate = _choose_rate(
        run, ep, model, cfg, job.builtin, window.prompt, window.output, res.server, say
    )
    window = _recut_window(job, run, window, rate)
    run.overload_limit = _overload_limit(run, cfg, window.trace.mean_rate_rps)
    run.replayer = OpenLoopReplayer(
        ep, model, cfg.timeout_s, run.clock, cfg.max_outstanding, res.cpu
    )
    res.start_ticker(cfg.progress_every_s, say)
    _run_phases(job, run, res, window)
    return _complete_document(job, run)


def default_engine_threads(merge: MergeConfig, cpus: int | None = None) -> int:
    """Threads for a CPU engine beside the merge workers: the cores they leave, at least 1.

    Each merge worker runs ``merge.torch_threads`` threads; the engine gets the rest of the
    host's ``cpus`` (default: the CPUs this process may use).
    """
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        cpus = cpus or os.cpu_count() or 1
    return max(1, cpus - merge.workers * merge.torch_threads)


def _builtin_starter(job: _Job, longest: tuple[int, int]) -> Callable[[], Any]:
    """Announce the built-in server and return the call that starts it (it runs in a
    thread, see :func:`_start_builtin`)."""
    cfg, say = job.cfg, job.say
    if cfg.engine == "transformers":
        kv = kv_settings(*longest, max_concurrent=cfg.engine_max_concurrent)
        threads = cfg.engine_threads or default_engine_threads(cfg.merge)
        say(
            f"starting transformers serve --continuous-batching (KV: block "
            f"{kv.block_size}, {kv.num_blocks} blocks, {kv.max_batch_tokens} batch "
            f"tokens; longest request {longest[0]} + {longest[1]} tokens; {threads} torch "
            f"thread{'s' if threads > 1 else ''}) and the merge workers"
        )
        return lambda: start_engine(
            kv, cfg.engine_model, cfg.engine_start_timeout_s, threads=threads
        )
    say(
        "starting the built-in fallback server (dependency-free, one thread per "
        "request, no batching) and the merge workers"
    )
    return lambda: start_sidecar(cfg.sidecar)


def _start_builtin(
    job: _Job, run: _Run, res: _Resources, longest: tuple[int, int]
) -> tuple[str, str]:
    """Start the built-in server and the merge workers; returns ``(url, model)``.

    The server starts in a thread while the workers spawn: both load torch at once.
    """
    start = _builtin_starter(job, longest)
    res.cluster = MergeCluster(job.cfg.merge)
    res.start_server(start)
    try:
        res.cluster.start()
    finally:
        res.join_starter()
    if "error" in res.server_box:
        err = res.server_box["error"]
        if isinstance(err, CalibrationError):
            raise CalibrationError(str(err))
        raise CalibrationError(f"the built-in {job.cfg.engine} server failed to start: {err}")
    assert res.server is not None
    return _describe_builtin(job, run, res.server)


def _describe_builtin(
    job: _Job, run: _Run, server: SidecarProcess | EngineProcess
) -> tuple[str, str]:
    """Record and announce the started built-in server; returns ``(url, model)``."""
    url = server.url
    if isinstance(server, EngineProcess):
        model = server.model
        run.endpoint = {
            "kind": "built-in",
            "engine": "transformers",
            "url": url,
            "model": model,
            **server.describe(),
        }
        job.say(
            f"transformers serve (continuous batching) on a {server.parameters / 1e6:.1f}"
            f" M-parameter Llama at {url}"
        )
    else:
        model = job.cfg.model or job.cfg.sidecar.model_name
        run.endpoint = {
            "kind": "built-in",
            "engine": "builtin-fallback",
            "url": url,
            "model": model,
            **server.describe(),
        }
        job.say(
            f"built-in fallback server {model} ({server.num_parameters / 1e6:.1f} M "
            f"parameters) at {url}"
        )
    return url, model


def _connect_external(
    job: _Job, run: _Run, res: _Resources, window: _Window, longest: tuple[int, int]
) -> tuple[str, str]:
    """Probe the external endpoint, warm it up, then start the merge workers; returns
    ``(url, model)``."""
    cfg, say = job.cfg, job.say
    assert job.endpoint is not None  # not a built-in run
    url = job.endpoint
    say(f"probing {url}")
    try:
        info = probe_endpoint(url, timeout_s=min(cfg.timeout_s, 10.0))
    except EndpointUnavailableError as exc:
        raise EndpointUnavailableError(
            f"{exc}. Is the server running? Omit --endpoint to use the built-in engine."
        ) from None
    model = cfg.model or (info["models"][0] if info["models"] else "")
    if not model:
        raise CalibrationError(f"{url}/v1/models {info['models_error']}; pass --model")
    if not info["models"]:
        say(f"note: {url}/v1/models {info['models_error']}; using --model {model}")
    run.endpoint = {
        "kind": "external",
        "url": url,
        "model": model,
        "models_listed": info["models"],
    }
    say(f"endpoint {url} answers; model {model}")
    _warm_up(run, Endpoint.parse(url), model, cfg, window.prompt, window.output, longest, say)
    res.cluster = MergeCluster(cfg.merge)
    say(f"starting {cfg.merge.workers} merge workers")
    res.cluster.start()
    return url, model


def _recut_window(job: _Job, run: _Run, window: _Window, rate: float | None) -> _Window:
    """Cut the window again at the chosen rate (when it differs from the given one) and
    announce what will be replayed."""
    cfg = job.cfg
    win, prompt, output = window.trace, window.prompt, window.output
    if rate is not None and rate != cfg.rate_rps:
        win, _, _, run.trace_info = prepare_trace(
            job.source, job.duration_s, replace(cfg, rate_rps=rate), job.trace_format
        )
        prompt, output = _token_arrays(win, cfg)
    run.trace_info.update(
        sent_prompt_tokens_mean=float(prompt.mean()) if prompt.size else 0.0,
        sent_output_tokens_mean=float(output.mean()) if output.size else 0.0,
    )
    if run.capacity.get("capacity_rps"):
        run.capacity["utilization"] = win.mean_rate_rps / run.capacity["capacity_rps"]
    job.say(
        f"trace {run.trace_info['kind']} "
        f"{run.trace_info.get('name') or run.trace_info.get('path')}: "
        f"{win.num_requests} requests in a {job.duration_s:g} s window "
        f"({win.mean_rate_rps:.2f} req/s"
        + (
            f", {100 * run.capacity['utilization']:.0f} % of the probed capacity"
            if "utilization" in run.capacity
            else ""
        )
        + f"); {len(run.plan)} merges of {cfg.merge_seconds:g} s per sync phase; "
        f"phases: {', '.join(f'{n}{k + 1}' for n, k in run.order)}"
    )
    return _Window(win, prompt, output)


def _run_phases(job: _Job, run: _Run, res: _Resources, window: _Window) -> None:
    """Replay every phase in the run's order, saving the partial file after each."""
    cfg, say = job.cfg, job.say
    win, prompt, output, duration_s = window.trace, window.prompt, window.output, job.duration_s
    for name, k in run.order:
        if name == "sync":
            assert res.cluster is not None  # started before any phase
            _sync_phase(run, res.cluster, res.server, win, prompt, output, duration_s, cfg, say, k)
        else:
            _control_phase(run, res.server, win, prompt, output, duration_s, cfg, say, k)
        # What was measured so far survives even a hard kill.
        _save(job.partial, run, False, cfg, intervals=False)


def _complete_document(job: _Job, run: _Run) -> dict:
    """The complete document, once the failure rate is within the limit and the document
    is a valid calibration file."""
    assert run.replayer is not None  # set before the phases
    run.stage = "done"
    _check_failure_rate(run.replayer.snapshot(), job.cfg)
    document = _document(run, True, job.cfg)
    try:
        validate_calibration(_finite(document), str(job.out))
    except CalibrationFileError as exc:
        raise CalibrationError(
            f"the measurements do not make a valid calibration "
            f"file: {exc.reason} (field {exc.field})"
        ) from None
    return document


def _record_failure(job: _Job, run: _Run, exc: BaseException) -> None:
    """Note why the run stopped and save the partial file; an interrupt or a
    :class:`CalibrationError` gets the file's ``path`` (the caller re-raises ``exc``)."""
    if isinstance(exc, KeyboardInterrupt):
        what = (
            "terminated by SIGTERM"
            if isinstance(exc, CalibrationTerminated)
            else "interrupted by Ctrl-C"
        )
        run.error = f"{what} during the {run.stage} stage"
        job.say(run.error)
        # The documented ``path`` attribute, added to the interrupt on its way out.
        saved = _save_partial(job.partial, run, job.cfg, job.say)
        exc.path = str(job.partial) if saved else None  # type: ignore[attr-defined]
    elif isinstance(exc, CalibrationError):
        run.error = str(exc)
        if _save_partial(job.partial, run, job.cfg, job.say):
            exc.path = str(job.partial)
    elif isinstance(exc, Exception):
        run.error = f"{type(exc).__name__}: {exc}"
        _save_partial(job.partial, run, job.cfg, job.say)


def _write_complete(job: _Job, document: dict) -> CalibrationResult:
    """Write the complete file, remove the partial one it supersedes, print the summary."""
    _write_atomic(job.out, document)
    document = _finite(document)
    job.partial.unlink(missing_ok=True)  # superseded by the complete file
    for line in _summary_lines(document):
        job.say(line)
    job.say(f"wrote {job.out} (complete: {str(bool(document['complete'])).lower()})")
    return CalibrationResult(str(job.out), document)


def _check_failure_rate(records: list[RequestRecord], cfg: CalibrationConfig) -> None:
    """Raise :class:`CalibrationError` when no request succeeded or too many failed."""
    counts = _request_counts(records)
    sent = max(1, counts["sent"])
    failed = counts["errors"] / sent
    if counts["ok"] > 0 and failed <= cfg.max_error_fraction:
        return
    first = next((r.error for r in records if r.done and not r.ok), "")
    kinds = ", ".join(f"{k}: {v}" for k, v in sorted(counts["by_status"].items()) if k != "200")
    why = (
        f"{100 * failed:.0f} %, above the {100 * cfg.max_error_fraction:.0f} % limit"
        if failed > cfg.max_error_fraction
        else "within the limit"
    )
    raise CalibrationError(
        f"{counts['errors']} of {counts['sent']} requests failed ({why}"
        + ("" if counts["ok"] else "; none succeeded")
        + f"; {kinds or 'no answer'}); first "
        f"error: {first or 'none'}"
    )


def _summary_lines(document: dict) -> list[str]:
    """The console summary of a calibration file: the effect sizes, the fitted slowdown and
    every note of the fit (what the run could not determine, and why)."""
    m = document["measured"]
    iv = m.get("intervals") or {}

    def ci(name: str) -> str:
        bounds = iv.get(name)
        return f" [{_fmt(bounds[0])}, {_fmt(bounds[1])}]" if bounds else ""

    lines = [
        f"measured p95 sync ratio {_fmt(m.get('p95_sync_ratio'))}"
        f"{ci('p95_sync_ratio')}, p95 high/low {_fmt(m.get('p95_high_low'))}"
        f"{ci('p95_high_low')}, pressure-latency corr "
        f"{_fmt(m.get('pressure_latency_corr'))}; fitted sync_slowdown "
        f"{_fmt(document['fitted_sidecar'].get('sync_slowdown'))}"
    ]
    if iv.get("repeats", 0) >= 2:
        lines.append(
            f"intervals: {100 * iv['level']:.0f} % bootstrap over {iv['repeats']} "
            f"repeats (coarse with few repeats); per-repeat p95 sync ratios: "
            + ", ".join(_fmt(v) for v in iv["per_repeat"]["p95_sync_ratio"])
        )
    cap = document.get("capacity") or {}
    if cap.get("capacity_rps"):
        lines.append(
            f"probed capacity {_fmt(cap['capacity_rps'])} req/s; replayed at "
            f"{_fmt(cap.get('rate_rps'))} req/s (utilization "
            f"{_fmt(cap.get('utilization'))})"
        )
    counts = document.get("requests", {})
    if counts.get("errors"):
        limit = document.get("metadata", {}).get("config", {}).get("max_error_fraction")
        kinds = ", ".join(
            f"{k}: {v}" for k, v in sorted(counts.get("by_status", {}).items()) if k != "200"
        )
        lines.append(
            f"{counts['errors']} of {counts['sent']} requests failed "
            f"({100 * counts['errors'] / max(1, counts['sent']):.0f} %"
            + (f", within the {100 * limit:.0f} % limit" if limit is not None else "")
            + f"; {kinds}); they are left out of the measurements"
        )
    lines += [f"fit note: {note}" for note in document["fit"].get("notes", [])]
    lines += [f"UNCERTAIN: {why}" for why in document.get("uncertain") or []]
    if "error" in document["fit"]:
        lines.append(f"fit note: {document['fit']['error']}")
    return lines


def phase_order(cfg: CalibrationConfig) -> list[tuple[str, int]]:
    """The run's phases ``(name, repeat)``: ``repeats`` pairs of a sync and a control phase,
    each pair in an order drawn from the seed (sync phases only without a control)."""
    rng = np.random.default_rng([cfg.seed, 13])
    order: list[tuple[str, int]] = []
    for k in range(cfg.repeats):
        names = ["sync", "control"] if cfg.control else ["sync"]
        if cfg.control and rng.random() < 0.5:
            names.reverse()
        order += [(name, k) for name in names]
    return order


def _sync_phase(
    run: _Run,
    cluster: MergeCluster,
    server: Any,
    win: Trace,
    prompt: np.ndarray,
    output: np.ndarray,
    duration_s: float,
    cfg: CalibrationConfig,
    say: Callable[[str], None],
    repeat: int = 0,
) -> None:
    """Replay the window while the planned merges run."""
    replayer = run.replayer
    assert replayer is not None  # set before any phase starts
    say(
        f"sync phase {repeat + 1}/{cfg.repeats}: {duration_s:g} s, {win.num_requests} "
        f"requests, {len(run.plan)} merges"
    )
    origin = _begin_phase(run, "sync", repeat, win, prompt, output, duration_s)
    for j, (start, length) in enumerate(run.plan):
        _wait(run, cfg, server, until=origin + start)
        k = len(run.merges)  # merge ids are unique over the run
        entry: dict = {
            "merge_id": k,
            "repeat": repeat,
            "planned_start_s": origin + start,
            "planned_length_s": length,
        }
        run.merges.append(entry)
        # The window opens when the command goes out and closes when every worker is done
        # (checkpoint included); requests read the flag under the same lock.
        entry["start_s"] = replayer.set_merge(k)
        killer = None
        if cfg.kill_worker_at_merge == k:
            rank = 1 if cfg.merge.workers > 1 else 0
            killer = threading.Timer(0.5, cluster.kill_worker, args=(rank,))
            killer.daemon = True
            killer.start()
        report: MergeReport | None = None
        try:
            report = cluster.merge(length)
        finally:
            entry["end_s"] = replayer.clear_merge()
            if killer is not None:
                killer.cancel()
            if report is not None:
                entry.update(asdict(report))
        say(
            f"merge {j + 1}/{len(run.plan)}: {entry['start_s'] - origin:5.1f}-"
            f"{entry['end_s'] - origin:5.1f} s, {report.allreduces} all-reduces, "
            f"checkpoint {report.checkpoint_s:.2f} s"
        )
    _wait(run, cfg, server, until=origin + duration_s + 5.0, done=lambda: not replayer.sending)
    _end_phase(run, "sync", repeat, server, cfg)


def _control_phase(
    run: _Run,
    server: Any,
    win: Trace,
    prompt: np.ndarray,
    output: np.ndarray,
    duration_s: float,
    cfg: CalibrationConfig,
    say: Callable[[str], None],
    repeat: int = 0,
) -> None:
    """The same window with no merges (the no-sync load match)."""
    replayer = run.replayer
    assert replayer is not None  # set before any phase starts
    say(
        f"control phase {repeat + 1}/{cfg.repeats} (no merges): {duration_s:g} s, "
        f"{win.num_requests} requests"
    )
    origin = _begin_phase(run, "control", repeat, win, prompt, output, duration_s)
    _wait(run, cfg, server, until=origin + duration_s + 5.0, done=lambda: not replayer.sending)
    _end_phase(run, "control", repeat, server, cfg)


def _begin_phase(
    run: _Run,
    name: str,
    repeat: int,
    win: Trace,
    prompt: np.ndarray,
    output: np.ndarray,
    duration_s: float,
) -> float:
    """Start replaying ``win`` as phase ``name`` half a second from now; returns its origin."""
    assert run.replayer is not None
    run.stage = f"{name} {repeat + 1}"
    origin = run.clock() + 0.5
    run.phases[_phase_key(name, repeat)] = {
        "name": name,
        "repeat": repeat,
        "origin_s": origin,
        "duration_s": float(duration_s),
    }
    run.current = (name, repeat)
    run.replayer.start_phase(name, win, origin, prompt, output, repeat=repeat)
    return origin


def _phase_key(name: str, repeat: int) -> str:
    """Key of a phase in the file's ``metadata.phases`` (``sync`` and ``control`` for the
    first repeat, as in files without repeats; ``sync-2`` ... after it)."""
    return name if repeat == 0 else f"{name}-{repeat + 1}"


def _end_phase(run: _Run, name: str, repeat: int, server: Any, cfg: CalibrationConfig) -> None:
    """Wait for the phase's outstanding requests, record its end, check the server."""
    replayer = run.replayer
    assert replayer is not None  # set before any phase starts
    _wait(
        run,
        cfg,
        server,
        until=run.clock() + cfg.timeout_s + 2.0,
        done=lambda: replayer.outstanding == 0,
    )
    run.phases[_phase_key(name, repeat)]["end_s"] = run.clock()
    _check_sidecar(server)


def _wait(
    run: _Run,
    cfg: CalibrationConfig,
    server: Any,
    until: float,
    done: Callable[[], bool] | None = None,
) -> None:
    """Wait until the run clock reaches ``until`` (or ``done()``), checking every 0.1 s that
    the server lives and the engine is not overloaded."""
    while run.clock() < until and not (done is not None and done()):
        _check_sidecar(server)
        _check_overload(run, cfg)
        time.sleep(0.1)
    _check_overload(run, cfg)


def _overload_limit(run: _Run, cfg: CalibrationConfig, rate_rps: float) -> int:
    """Outstanding requests beyond which the run stops (see ``overload_inflight``)."""
    if cfg.overload_inflight is not None:
        return cfg.overload_inflight
    # A merge may stall the engine for its whole window: the arrivals of two windows are
    # an expected backlog, not an overload.
    merge_backlog = math.ceil(2.0 * rate_rps * cfg.merge_seconds)
    steps = [s for s in run.capacity.get("probe", {}).get("steps", []) if s["sustainable"]]
    if steps and steps[-1].get("p95_s"):
        # Little's law at the highest sustainable step's p95, with a 4x margin.
        return max(16, merge_backlog, math.ceil(4.0 * rate_rps * steps[-1]["p95_s"]))
    return max(64, merge_backlog)


def _check_overload(run: _Run, cfg: CalibrationConfig) -> None:
    """Raise :class:`CalibrationError` when the engine cannot carry the offered load:
    more requests outstanding than the limit, or too many timeouts in this phase."""
    rep = run.replayer
    if rep is None or run.current is None:
        return
    outstanding = rep.outstanding
    now = run.clock()
    hint = (
        f"the engine cannot carry {run.rate_rps:.2f} req/s (mean) here while merges run: "
        f"lower --target-utilization (now {cfg.target_utilization:g}) or --rate"
        if run.rate_rps
        else "lower --rate"
    )
    limit = run.overload_limit
    grace = (
        cfg.overload_grace_s
        if cfg.overload_grace_s is not None
        else max(10.0, 2.0 * cfg.merge_seconds)
    )
    if outstanding > limit:
        if run.over_since is None:
            run.over_since = now
        if outstanding > 4 * limit or now - run.over_since > grace:
            why = (
                f"more than 4 x the limit {limit}"
                if outstanding > 4 * limit
                else f"above the limit {limit} for {now - run.over_since:.0f} s"
            )
            raise CalibrationError(
                f"overload: {outstanding} requests in flight, {why}, {now:.1f} s into the "
                f"run, in the {run.stage} phase; {hint}"
            )
    else:
        run.over_since = None
    counts = rep.counts(*run.current)
    if counts["timeouts"] >= 3 and counts["timeouts"] > cfg.overload_timeout_fraction * max(
        1, counts["done"]
    ):
        raise CalibrationError(
            f"overload: {counts['timeouts']} of {counts['done']} answered requests of the "
            f"{run.stage} phase timed out (limit "
            f"{100 * cfg.overload_timeout_fraction:.0f} %, timeout {cfg.timeout_s:g} s); "
            f"{hint}"
        )


def _warm_up(
    run: _Run,
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


def _choose_rate(
    run: _Run,
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
    run: _Run,
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
        stop=lambda: _check_sidecar(server),
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


def _fmt(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def _check_sidecar(server: Any) -> None:
    if server is not None and not server.is_alive():
        tail = server.log_tail() if isinstance(server, EngineProcess) else ""
        raise CalibrationError(
            f"the serving engine (pid {server.pid}) died" + (f": {tail}" if tail else "")
        )


def partial_path(out: str | os.PathLike[str]) -> Path:
    """Where the partial measurements of a run writing ``out`` go: ``NAME.partial.json``
    beside ``NAME.json`` (``out`` itself is written only by a complete run)."""
    out = Path(out)
    stem = out.name[:-5] if out.name.lower().endswith(".json") else out.name
    return out.with_name(f"{stem}.partial.json")


def _save_partial(out: Path, run: _Run, cfg: CalibrationConfig, say: Callable[[str], None]) -> bool:
    """Save an incomplete run to ``out`` (a partial path); never mask the error being
    handled. Says "partial measurements saved" once: callers do not repeat it."""
    try:
        _save(out, run, False, cfg)
    except Exception as exc:  # noqa: BLE001 - report and carry on with the original error
        say(f"could not save the partial measurements to {out}: {exc}")
        return False
    say(f"partial measurements saved to {out} (complete: false)")
    return True


def _save(
    out: Path, run: _Run, complete: bool, cfg: CalibrationConfig, intervals: bool = True
) -> dict:
    document = _document(run, complete, cfg, intervals)
    _write_atomic(out, document)
    return _finite(document)


# MergeWorkerError is a CalibrationError; re-exported for callers that catch it by name.
__all__ += [
    "CalibrationError",
    "EndpointUnavailableError",
    "MergeWorkerError",
    "CalibrationTerminated",
]
