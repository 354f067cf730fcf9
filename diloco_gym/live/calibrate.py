"""Live calibration: measure real merge interference on a real serving endpoint.

:func:`run_calibration` replays a trace window against an OpenAI-compatible completions
endpoint, open loop, while real merges (:mod:`diloco_gym.live.merges`) run on the same
machine, then measures the effect sizes (docs/calibration.md), fits the sidecar model to them
(:mod:`diloco_gym.live.fit`) and writes a calibration file that
:func:`diloco_gym.calibration.load_calibration` reads.

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

from diloco_gym.calibration import CalibrationFileError, validate_calibration
from diloco_gym.live.errors import (
    CalibrationError,
    CalibrationTerminated,
    EndpointUnavailableError,
    MergeWorkerError,
)
from diloco_gym.live.fit import RunData, fit_sidecar_live, measured_effect_sizes
from diloco_gym.live.merges import MergeCluster, MergeConfig, MergeReport
from diloco_gym.live.replay import (
    CpuSampler,
    Endpoint,
    OpenLoopReplayer,
    RequestRecord,
    make_prompt,
    post_completion,
    probe_endpoint,
)
from diloco_gym.live.server import SidecarModelConfig, SidecarProcess, start_sidecar
from diloco_gym.sidecar import SidecarParams
from diloco_gym.traces import Trace, random_window, scale_rate, window

__all__ = ["CalibrationConfig", "CalibrationResult", "run_calibration", "plan_merges",
           "prepare_trace", "partial_path", "BUILTIN_DEFAULTS"]

#: Defaults used with the built-in sidecar when a field of the config is ``None``: a tiny
#: CPU model serves ~3 requests/s of this size, so the regimes' native rates would swamp it.
BUILTIN_DEFAULTS: dict[str, Any] = {"rate_rps": 2.0, "output_scale": 0.5,
                                     "max_prompt_tokens": 256, "max_output_tokens": 256}
#: Defaults against an external endpoint (the trace as it is).
ENDPOINT_DEFAULTS: dict[str, Any] = {"rate_rps": None, "output_scale": 1.0,
                                      "max_prompt_tokens": 4096, "max_output_tokens": 1024}


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

    def __post_init__(self) -> None:
        for name in ("timeout_s", "merge_seconds", "pressure_norm_inflight",
                     "progress_every_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"CalibrationConfig.{name} must be > 0, got {v!r}")
        lo, hi = self.gap_seconds
        if not 0 <= lo <= hi:
            raise ValueError(f"CalibrationConfig.gap_seconds must be (lo, hi) with "
                             f"0 <= lo <= hi, got {self.gap_seconds!r}")
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
                raise ValueError(f"CalibrationConfig.{name} must be None or an int >= 1, "
                                 f"got {v!r}")
        if not isinstance(self.merge, MergeConfig):
            raise ValueError("CalibrationConfig.merge must be a MergeConfig")

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


# --------------------------------------------------------------------------- preparation


def prepare_trace(source: str | os.PathLike[str] | Trace, duration_s: float,
                  cfg: CalibrationConfig, trace_format: str = "auto"
                  ) -> tuple[Trace, str, SidecarParams, dict]:
    """Resolve the source and cut the replayed window.

    Args:
        source: a regime name, a trace file, or a :class:`Trace`.
        duration_s: window length, seconds.
        cfg: the (resolved) config: seed, start, rate.
        trace_format: format of a trace file (see :func:`diloco_gym.loaders.load_trace`).

    Returns:
        ``(window, label, base sidecar parameters, provenance)``.

    Raises:
        ValueError: unknown regime and no such file, a label that is not a regime, or a
            window outside the trace.
    """
    from diloco_gym.regimes import REGIMES, get_regime

    rng = np.random.default_rng(cfg.seed)
    info: dict[str, Any]
    if isinstance(source, Trace):
        full, label, base, info = source, source.name, SidecarParams(), {"kind": "trace",
                                                                         "name": source.name}
    elif isinstance(source, str) and source in REGIMES:
        regime = get_regime(source)
        full = regime(rng)
        label, base = source, regime.sidecar
        info = {"kind": "regime", "name": source, "seed": cfg.seed}
    else:
        path = Path(source)
        if not path.exists():
            raise ValueError(f"{source!s} is neither a regime ({', '.join(REGIMES)}) nor an "
                             f"existing trace file")
        from diloco_gym.loaders import load_trace

        full = load_trace(path, trace_format, seed=cfg.seed)
        label, base = full.name, SidecarParams()
        info = {"kind": "file", "path": str(path), "format": full.meta.get("format"),
                "rows_read": full.meta.get("rows_read")}
    label = cfg.label or label
    if label not in REGIMES:
        raise ValueError(
            f"the calibration file's entry needs a regime name, and {label!r} is not one: "
            f"pass --label (label=) one of {', '.join(REGIMES)}, the regime whose "
            f"measurements this trace stands for")
    info["native_rate_rps"] = full.mean_rate_rps
    if cfg.rate_rps is not None:
        full = scale_rate(full, cfg.rate_rps)
    if cfg.start_s is not None:
        win = window(full, cfg.start_s, duration_s)
    else:
        win = random_window(full, duration_s, rng)
    info.update(window_start_s=float(win.meta.get("window_start_s", 0.0)),
                duration_s=float(duration_s), rate_rps=cfg.rate_rps,
                requests=win.num_requests)
    return win, label, cfg.base_sidecar or base, info


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
    ok = [r for r in records if r.ok and r.phase in run.phases]
    origin = {name: p["origin_s"] for name, p in run.phases.items()}
    sync_origin = origin.get("sync", 0.0)
    windows = [(m["start_s"] - sync_origin, m["end_s"] - sync_origin) for m in run.merges
               if m.get("end_s") is not None]
    return RunData(
        phase=np.array([r.phase for r in ok], dtype=object),
        offset_s=np.array([r.send_s - origin[r.phase] for r in ok], dtype=np.float64),
        latency_s=np.array([r.latency_s for r in ok], dtype=np.float64),
        prompt_tokens=np.array([r.prompt_tokens for r in ok], dtype=np.int64),
        output_tokens=np.array([r.output_tokens for r in ok], dtype=np.int64),
        sync_active=np.array([r.merge_active for r in ok], dtype=bool),
        inflight=np.array([r.inflight for r in ok], dtype=np.int64),
        cpu_util=np.array([r.cpu_util for r in ok], dtype=np.float64),
        windows_s=windows,
        sync_duration_s=float(run.phases.get("sync", {}).get("duration_s", 0.0)),
        control_duration_s=float(run.phases.get("control", {}).get("duration_s", 0.0)),
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
        "sync_inactive": sum(1 for r in records if r.ok and r.phase == "sync"
                             and not r.merge_active),
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


def _document(run: _Run, complete: bool, cfg: CalibrationConfig) -> dict:
    """The calibration file's content from the run so far."""
    records = run.replayer.snapshot() if run.replayer is not None else []
    counts = _request_counts(records)
    measured: dict = {}
    fit: dict = {}
    fitted: dict = {}
    regimes: dict = {}
    if counts["ok"]:
        data = _run_data(records, run)
        measured = measured_effect_sizes(data, cfg.pressure_norm_inflight, cfg.high_pressure)
        try:
            live_fit = fit_sidecar_live(data, measured, run.base)
            fit = live_fit.to_dict()
            fitted = fit.pop("fitted_sidecar")
        except (ValueError, FloatingPointError) as exc:  # a degenerate partial run
            fit = {"error": f"fit failed: {exc}"}
        undefined = [k for k in ("p95_high_low", "p95_sync_ratio")
                     if not math.isfinite(measured[k])]
        entry = {k: (measured[k] if k not in undefined else 1.0)
                 for k in ("p95_high_low", "p95_sync_ratio")}
        entry["pressure_latency_corr"] = measured["pressure_latency_corr"]
        entry["note"] = ("live calibration" + ("" if complete else " (incomplete run)")
                         + (f"; undefined (empty class), written as 1.0: "
                            f"{', '.join(undefined)}" if undefined else ""))
        if undefined:
            entry["undefined"] = undefined
        regimes[run.label] = entry
    ep = run.endpoint.get("url", "?")
    source = (f"live calibration (diloco-gym calibrate) of {ep} "
              f"[{run.endpoint.get('kind', 'endpoint')}] with real "
              f"{run.cluster.get('backend', '?')} merges on {socket.gethostname()}, "
              f"started {run.started_utc}. p95 ratios use linear-interpolation percentiles; "
              f"high pressure = in-flight proxy >= {cfg.high_pressure}; sync active = sent "
              f"inside a recorded merge window.")
    return {
        "source": source,
        "regimes": regimes,
        "complete": bool(complete),
        "error": run.error,
        "stage": run.stage,
        "measured": measured,
        "fitted_sidecar": fitted,
        "fit": fit,
        "requests": counts,
        "metadata": {
            "endpoint": run.endpoint,
            "trace": run.trace_info,
            "label": run.label,
            "merges": run.cluster,
            "started_utc": run.started_utc,
            "elapsed_s": run.clock(),
            "phases": run.phases,
            "config": _finite(_config_dict(cfg)),
            "pressure_proxy": (f"min(1, client in-flight requests at send / "
                               f"{cfg.pressure_norm_inflight})"),
            "host": {"hostname": socket.gethostname(), "platform": platform.platform(),
                     "python": platform.python_version(), "cpus": os.cpu_count(),
                     "torch": _torch_version()},
            "clock": "seconds since the run started (time.monotonic)",
        },
        "schedule": [{"start_s": s, "length_s": n} for s, n in run.plan],
        "merges": run.merges,
        "records": _records_columns(records),
    }


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


def run_calibration(endpoint: str | None, source: str | os.PathLike[str] | Trace,
                    duration_s: float, out_path: str | os.PathLike[str], *,
                    trace_format: str = "auto", config: CalibrationConfig | None = None,
                    progress: Callable[[str], None] | None = _default_progress
                    ) -> CalibrationResult:
    """Measure merge interference on a serving endpoint and write a calibration file.

    Args:
        endpoint: ``http://host:port`` of an OpenAI-compatible server, or ``None`` to start
            the built-in sidecar on 127.0.0.1.
        source: a regime name (:data:`diloco_gym.regimes.REGIMES`), a trace file, or a
            :class:`~diloco_gym.traces.Trace`.
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
    if not (isinstance(duration_s, (int, float)) and math.isfinite(duration_s)
            and duration_s > 0):
        raise ValueError(f"duration_s must be > 0, got {duration_s!r}")
    say = progress or (lambda message: None)
    out = Path(out_path)
    partial = partial_path(out)
    builtin = endpoint is None
    cfg = (config or CalibrationConfig()).resolved(builtin)
    run = _Run(t0=time.monotonic(),
               started_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    win, run.label, run.base, run.trace_info = prepare_trace(source, duration_s, cfg,
                                                             trace_format)
    prompt, output = _token_arrays(win, cfg)
    run.trace_info.update(sent_prompt_tokens_mean=float(prompt.mean()) if prompt.size else 0.0,
                          sent_output_tokens_mean=float(output.mean()) if output.size else 0.0)
    run.plan = plan_merges(duration_s, cfg)
    say(f"trace {run.trace_info['kind']} {run.trace_info.get('name') or run.trace_info.get('path')}"
        f": {win.num_requests} requests in a {duration_s:g} s window "
        f"({win.mean_rate_rps:.2f} req/s); {len(run.plan)} merges of "
        f"{cfg.merge_seconds:g} s planned" + ("; then a no-sync control phase"
                                              if cfg.control else ""))

    sidecar: SidecarProcess | None = None
    sidecar_box: dict = {}  # filled by the start-up thread: "handle" or "error"
    starter: threading.Thread | None = None
    cluster: MergeCluster | None = None
    cpu = CpuSampler().start()
    ticker_stop = threading.Event()
    ticker: threading.Thread | None = None
    complete = False
    try:
        if builtin:
            say("starting the built-in sidecar and the merge workers")
            # The sidecar starts in a thread while the workers spawn: both load torch at once.
            cluster = MergeCluster(cfg.merge)

            def _start_sidecar() -> None:
                try:
                    sidecar_box["handle"] = start_sidecar(cfg.sidecar)
                except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
                    sidecar_box["error"] = exc

            starter = threading.Thread(target=_start_sidecar, name="sidecar-start",
                                       daemon=True)
            starter.start()
            try:
                cluster.start()
            finally:
                starter.join()
                sidecar = sidecar_box.get("handle")
            if "error" in sidecar_box:
                raise CalibrationError(f"the built-in sidecar failed to start: "
                                       f"{sidecar_box['error']}")
            assert sidecar is not None
            url, model = sidecar.url, cfg.model or cfg.sidecar.model_name
            run.endpoint = {"kind": "built-in", "url": url, "model": model,
                            **sidecar.describe()}
            say(f"built-in sidecar {model} ({sidecar.num_parameters / 1e6:.1f} M parameters) "
                f"serving at {url}")
        else:
            assert endpoint is not None  # builtin is False
            url = endpoint
            say(f"probing {url}")
            try:
                info = probe_endpoint(url, timeout_s=min(cfg.timeout_s, 10.0))
            except EndpointUnavailableError as exc:
                raise EndpointUnavailableError(
                    f"{exc}. Is the server running? Omit --endpoint to use the built-in "
                    f"sidecar.") from None
            model = cfg.model or (info["models"][0] if info["models"] else "")
            if not model:
                raise CalibrationError(f"{url}/v1/models {info['models_error']}; pass --model")
            if not info["models"]:
                say(f"note: {url}/v1/models {info['models_error']}; using --model {model}")
            run.endpoint = {"kind": "external", "url": url, "model": model,
                            "models_listed": info["models"]}
            say(f"endpoint {url} answers; model {model}")
            _warm_up(Endpoint.parse(url), model, cfg)  # before paying for the workers
            cluster = MergeCluster(cfg.merge)
            say(f"starting {cfg.merge.workers} merge workers")
            cluster.start()
        run.cluster = cluster.describe()
        say(f"{cfg.merge.workers} merge workers ready: {cluster.backend} all-reduce of "
            f"{cfg.merge.merge_mb:g} MiB over {run.cluster['init_method']}")

        ep = Endpoint.parse(url)
        if builtin:
            _warm_up(ep, model, cfg)

        run.replayer = OpenLoopReplayer(ep, model, cfg.timeout_s, run.clock,
                                        cfg.max_outstanding, cpu)

        def _tick() -> None:
            assert run.replayer is not None  # set before the ticker starts
            while not ticker_stop.wait(cfg.progress_every_s):
                c = run.replayer.counts() if run.replayer else {}
                say(f"t={run.clock():6.1f} s {run.stage}: sent {c.get('sent', 0)}/"
                    f"{c.get('planned', 0)}, ok {c.get('ok', 0)}, errors "
                    f"{c.get('errors', 0)}, outstanding {c.get('outstanding', 0)}, merge "
                    f"{'active' if run.replayer.state.merge_id >= 0 else 'idle'}")

        ticker = threading.Thread(target=_tick, name="calibrate-progress", daemon=True)
        ticker.start()

        _sync_phase(run, cluster, sidecar, win, prompt, output, duration_s, cfg, say)
        _save(partial, run, False, cfg)  # the first half survives even a hard kill
        if cfg.control:
            _control_phase(run, sidecar, win, prompt, output, duration_s, cfg, say)

        run.stage = "done"
        _check_failure_rate(run.replayer.snapshot(), cfg)
        document = _document(run, True, cfg)
        try:
            validate_calibration(_finite(document), str(out))
        except CalibrationFileError as exc:
            raise CalibrationError(f"the measurements do not make a valid calibration "
                                   f"file: {exc.reason} (field {exc.field})") from None
        complete = True
    except KeyboardInterrupt as exc:
        what = "terminated by SIGTERM" if isinstance(exc, CalibrationTerminated) \
            else "interrupted by Ctrl-C"
        run.error = f"{what} during the {run.stage} stage"
        say(run.error)
        # The documented ``path`` attribute, added to the interrupt on its way out.
        exc.path = str(partial) if _save_partial(partial, run, cfg, say) else None  # type: ignore[attr-defined]
        raise
    except CalibrationError as exc:
        run.error = str(exc)
        if _save_partial(partial, run, cfg, say):
            exc.path = str(partial)
        raise
    except Exception as exc:
        run.error = f"{type(exc).__name__}: {exc}"
        _save_partial(partial, run, cfg, say)
        raise
    finally:
        ticker_stop.set()
        if ticker is not None:
            ticker.join(timeout=1.0)
        if run.replayer is not None:
            run.replayer.close()
        if cluster is not None:
            cluster.close()
        if starter is not None:
            # An interrupted start-up may still be bringing the sidecar up: wait for it so
            # that it can be stopped rather than orphaned.
            starter.join()
            sidecar = sidecar_box.get("handle")
        if sidecar is not None:
            sidecar.stop()
        cpu.stop()
    _write_atomic(out, document)
    document = _finite(document)
    partial.unlink(missing_ok=True)  # superseded by the complete file
    for line in _summary_lines(document):
        say(line)
    say(f"wrote {out} (complete: {str(complete).lower()})")
    return CalibrationResult(str(out), document)


def _check_failure_rate(records: list[RequestRecord], cfg: CalibrationConfig) -> None:
    """Raise :class:`CalibrationError` when no request succeeded or too many failed."""
    counts = _request_counts(records)
    sent = max(1, counts["sent"])
    failed = counts["errors"] / sent
    if counts["ok"] > 0 and failed <= cfg.max_error_fraction:
        return
    first = next((r.error for r in records if r.done and not r.ok), "")
    kinds = ", ".join(f"{k}: {v}" for k, v in sorted(counts["by_status"].items())
                      if k != "200")
    why = (f"{100 * failed:.0f} %, above the {100 * cfg.max_error_fraction:.0f} % limit"
           if failed > cfg.max_error_fraction else "within the limit")
    raise CalibrationError(
        f"{counts['errors']} of {counts['sent']} requests failed ({why}"
        + ("" if counts["ok"] else "; none succeeded") + f"; {kinds or 'no answer'}); first "
        f"error: {first or 'none'}")


def _summary_lines(document: dict) -> list[str]:
    """The console summary of a calibration file: the effect sizes, the fitted slowdown and
    every note of the fit (what the run could not determine, and why)."""
    m = document["measured"]
    lines = [f"measured p95 sync ratio {_fmt(m.get('p95_sync_ratio'))}, p95 high/low "
             f"{_fmt(m.get('p95_high_low'))}, pressure-latency corr "
             f"{_fmt(m.get('pressure_latency_corr'))}; fitted sync_slowdown "
             f"{_fmt(document['fitted_sidecar'].get('sync_slowdown'))}"]
    counts = document.get("requests", {})
    if counts.get("errors"):
        limit = document.get("metadata", {}).get("config", {}).get("max_error_fraction")
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(counts.get("by_status", {}).items())
                          if k != "200")
        lines.append(f"{counts['errors']} of {counts['sent']} requests failed "
                     f"({100 * counts['errors'] / max(1, counts['sent']):.0f} %"
                     + (f", within the {100 * limit:.0f} % limit" if limit is not None else "")
                     + f"; {kinds}); they are left out of the measurements")
    lines += [f"fit note: {note}" for note in document["fit"].get("notes", [])]
    if "error" in document["fit"]:
        lines.append(f"fit note: {document['fit']['error']}")
    return lines


def _sync_phase(run: _Run, cluster: MergeCluster, sidecar: SidecarProcess | None, win: Trace,
                prompt: np.ndarray, output: np.ndarray, duration_s: float,
                cfg: CalibrationConfig, say: Callable[[str], None]) -> None:
    """Phase 1: replay the window while the planned merges run."""
    say(f"sync phase: {duration_s:g} s, {win.num_requests} requests, {len(run.plan)} merges")
    origin = _begin_phase(run, "sync", win, prompt, output, duration_s)
    assert run.replayer is not None  # _begin_phase() checked it
    for k, (start, length) in enumerate(run.plan):
        _sleep_until(run.clock, origin + start)
        _check_sidecar(sidecar)
        entry: dict = {"merge_id": k, "planned_start_s": origin + start,
                       "planned_length_s": length}
        run.merges.append(entry)
        # The window opens when the command goes out and closes when every worker is done
        # (checkpoint included); requests read the flag under the same lock.
        entry["start_s"] = run.replayer.set_merge(k)
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
            entry["end_s"] = run.replayer.clear_merge()
            if killer is not None:
                killer.cancel()
            if report is not None:
                entry.update(asdict(report))
        say(f"merge {k + 1}/{len(run.plan)}: {entry['start_s'] - origin:5.1f}-"
            f"{entry['end_s'] - origin:5.1f} s, {report.allreduces} all-reduces, "
            f"checkpoint {report.checkpoint_s:.2f} s")
    run.replayer.wait_sent(timeout_s=max(0.0, origin + duration_s - run.clock()) + 5.0)
    _end_phase(run, "sync", sidecar, cfg)


def _control_phase(run: _Run, sidecar: SidecarProcess | None, win: Trace,
                   prompt: np.ndarray, output: np.ndarray, duration_s: float,
                   cfg: CalibrationConfig, say: Callable[[str], None]) -> None:
    """Phase 2: the same window with no merges (the no-sync load match)."""
    say(f"control phase (no merges): {duration_s:g} s, {win.num_requests} requests")
    _begin_phase(run, "control", win, prompt, output, duration_s)
    assert run.replayer is not None  # _begin_phase() checked it
    run.replayer.wait_sent(timeout_s=duration_s + 5.0)
    _end_phase(run, "control", sidecar, cfg)


def _begin_phase(run: _Run, name: str, win: Trace, prompt: np.ndarray, output: np.ndarray,
                 duration_s: float) -> float:
    """Start replaying ``win`` as phase ``name`` half a second from now; returns its origin."""
    assert run.replayer is not None
    run.stage = name
    origin = run.clock() + 0.5
    run.phases[name] = {"origin_s": origin, "duration_s": float(duration_s)}
    run.replayer.start_phase(name, win, origin, prompt, output)
    return origin


def _end_phase(run: _Run, name: str, sidecar: SidecarProcess | None,
               cfg: CalibrationConfig) -> None:
    """Wait for the phase's outstanding requests, record its end, check the sidecar."""
    assert run.replayer is not None  # set before any phase begins
    run.replayer.drain(cfg.timeout_s + 2.0)
    run.phases[name]["end_s"] = run.clock()
    _check_sidecar(sidecar)


def _warm_up(ep: Endpoint, model: str, cfg: CalibrationConfig) -> None:
    """Send the unrecorded warm-up requests; any failure stops the run."""
    for i in range(cfg.warmup_requests):
        status, _, err = post_completion(ep, model, make_prompt(16, i), 8, cfg.timeout_s)
        if status == 0:
            raise EndpointUnavailableError(f"warm-up request to {ep.url} failed ({err})")
        if err:
            raise CalibrationError(f"warm-up request to {ep.url} failed: {err}")


def _fmt(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, (int, float)) and math.isfinite(x) else "n/a"


def _check_sidecar(sidecar: SidecarProcess | None) -> None:
    if sidecar is not None and not sidecar.is_alive():
        raise CalibrationError(f"the built-in sidecar (pid {sidecar.pid}) died")


def partial_path(out: str | os.PathLike[str]) -> Path:
    """Where the partial measurements of a run writing ``out`` go: ``NAME.partial.json``
    beside ``NAME.json`` (``out`` itself is written only by a complete run)."""
    out = Path(out)
    stem = out.name[:-5] if out.name.lower().endswith(".json") else out.name
    return out.with_name(f"{stem}.partial.json")


def _save_partial(out: Path, run: _Run, cfg: CalibrationConfig,
                  say: Callable[[str], None]) -> bool:
    """Save an incomplete run to ``out`` (a partial path); never mask the error being
    handled. Says "partial measurements saved" once: callers do not repeat it."""
    try:
        _save(out, run, False, cfg)
    except Exception as exc:  # noqa: BLE001 - report and carry on with the original error
        say(f"could not save the partial measurements to {out}: {exc}")
        return False
    say(f"partial measurements saved to {out} (complete: false)")
    return True


def _save(out: Path, run: _Run, complete: bool, cfg: CalibrationConfig) -> dict:
    document = _document(run, complete, cfg)
    _write_atomic(out, document)
    return _finite(document)


# MergeWorkerError is a CalibrationError; re-exported for callers that catch it by name.
__all__ += ["CalibrationError", "EndpointUnavailableError", "MergeWorkerError",
            "CalibrationTerminated"]
