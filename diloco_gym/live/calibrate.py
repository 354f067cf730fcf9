"""Live calibration: measure real merge interference on a real serving endpoint.

This module is the orchestration: the steps of a run in order. The other roles live in
their own modules: the configuration (:mod:`~diloco_gym.live.config`), what is replayed and
when (:mod:`~diloco_gym.live.plan`), the run's state (:mod:`~diloco_gym.live.state`), what
it starts and releases (:mod:`~diloco_gym.live.resources`), the warm-up, probe and rate
(:mod:`~diloco_gym.live.rate`), the measured phases and their guards
(:mod:`~diloco_gym.live.phases`), the document (:mod:`~diloco_gym.live.document`) and the
writes (:mod:`~diloco_gym.live.output`).

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

The output file follows the calibration schema (:mod:`diloco_gym.live.document` builds
it); a complete document is validated against it before it is written
(:mod:`diloco_gym.live.output` writes it).

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

import math
import os
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from diloco_gym.eval.calibration import CalibrationFileError, validate_calibration
from diloco_gym.live.config import (
    BUILTIN_DEFAULTS,
    CalibrationConfig,
    default_engine_threads,
)
from diloco_gym.live.document import (
    build_document,
    finite,
    request_counts,
    uncertain_reasons,
)
from diloco_gym.live.engine import (
    LIVE_EXTRA_HINT,
    engine_available,
)
from diloco_gym.live.errors import (
    CalibrationError,
    CalibrationTerminated,
    EndpointUnavailableError,
    MergeWorkerError,
)
from diloco_gym.live.output import (
    CalibrationResult,
    partial_path,
    save_document,
    save_partial,
    write_complete,
)
from diloco_gym.live.phases import (
    overload_limit,
    phase_plans,
    run_phase,
)
from diloco_gym.live.plan import (
    check_source,
    phase_order,
    plan_merges,
    prepare_trace,
    token_arrays,
)
from diloco_gym.live.rate import choose_rate, warm_up_run
from diloco_gym.live.replay import (
    CpuSampler,
    Endpoint,
    OpenLoopReplayer,
    RequestRecord,
)
from diloco_gym.live.resources import (
    Resources,
    connect_external,
    start_builtin,
)
from diloco_gym.live.state import Job, RunState, TraceWindow
from diloco_gym.sim.traces import Trace

__all__ = [
    "CalibrationConfig",
    "CalibrationResult",
    "run_calibration",
    "plan_merges",
    "prepare_trace",
    "partial_path",
    "check_source",
    "phase_order",
    "uncertain_reasons",
    "default_engine_threads",
    "BUILTIN_DEFAULTS",
    # MergeWorkerError is a CalibrationError; re-exported for callers that catch it by name.
    "CalibrationError",
    "EndpointUnavailableError",
    "MergeWorkerError",
    "CalibrationTerminated",
]


def _default_progress(message: str) -> None:
    print(f"[calibrate] {message}", flush=True)


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
    job = Job(endpoint, source, duration_s, trace_format, cfg, say, out, partial_path(out))
    if job.builtin and cfg.engine == "transformers" and not engine_available():
        raise CalibrationError(LIVE_EXTRA_HINT)
    run = RunState(
        t0=time.monotonic(), started_utc=datetime.now(timezone.utc).isoformat(timespec="seconds")
    )
    window, longest = _first_cut(job, run)
    resources = Resources(run, CpuSampler().start())
    try:
        document = _measure(job, run, resources, window, longest)
    except BaseException as exc:
        _record_failure(job, run, exc)
        raise
    finally:
        resources.close()
    return write_complete(job, document)


def _first_cut(job: Job, run: RunState) -> tuple[TraceWindow, tuple[int, int]]:
    """Cut the window at the given rate (or the trace's own) and plan the phases.

    This first cut gives the request sizes for the warm-up and the probe; with the probe's
    rate the window is cut again (:func:`_recut_window`). Returns the window and the
    longest request ``(prompt, output)`` any window of the trace can send.
    """
    cfg = job.cfg
    win, run.label, run.base, run.trace_info = prepare_trace(
        job.source, job.duration_s, cfg, job.trace_format
    )
    prompt, output = token_arrays(win, cfg)
    run.plan = plan_merges(job.duration_s, cfg)
    run.order = phase_order(cfg)
    longest = (
        run.trace_info.get("longest_prompt_tokens", int(prompt.max(initial=1))),
        run.trace_info.get("longest_output_tokens", int(output.max(initial=1))),
    )
    return TraceWindow(win, prompt, output), longest


def _measure(
    job: Job, run: RunState, res: Resources, window: TraceWindow, longest: tuple[int, int]
) -> dict:
    """Every step of a run in order, up to the validated complete document (not written)."""
    cfg, say = job.cfg, job.say
    if job.builtin:
        url, model = start_builtin(job, run, res, longest)
    else:
        url, model = connect_external(job, run, res, window, longest)
    assert res.cluster is not None  # started by either step
    run.cluster = res.cluster.describe()
    say(
        f"{cfg.merge.workers} merge workers ready: {res.cluster.backend} all-reduce of "
        f"{cfg.merge.merge_mb:g} MiB over {run.cluster['init_method']}"
    )
    ep = Endpoint.parse(url)
    if job.builtin:
        warm_up_run(run, ep, model, cfg, window.prompt, window.output, longest, say)
    rate = choose_rate(
        run, ep, model, cfg, job.builtin, window.prompt, window.output, res.server, say
    )
    window = _recut_window(job, run, window, rate)
    run.overload_limit = overload_limit(run, cfg, window.trace.mean_rate_rps)
    run.replayer = OpenLoopReplayer(
        ep, model, cfg.timeout_s, run.clock, cfg.max_outstanding, res.cpu
    )
    res.start_ticker(cfg.progress_every_s, say)
    _run_phases(job, run, res, window)
    return _complete_document(job, run)


def _recut_window(job: Job, run: RunState, window: TraceWindow, rate: float | None) -> TraceWindow:
    """Cut the window again at the chosen rate (when it differs from the given one) and
    announce what will be replayed."""
    cfg = job.cfg
    win, prompt, output = window.trace, window.prompt, window.output
    if rate is not None and rate != cfg.rate_rps:
        win, _, _, run.trace_info = prepare_trace(
            job.source, job.duration_s, replace(cfg, rate_rps=rate), job.trace_format
        )
        prompt, output = token_arrays(win, cfg)
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
    return TraceWindow(win, prompt, output)


def _run_phases(job: Job, run: RunState, res: Resources, window: TraceWindow) -> None:
    """Replay every phase in the run's order, saving the partial file after each."""
    for plan in phase_plans(run):
        run_phase(run, plan, res.cluster, res.server, window, job.duration_s, job.cfg, job.say)
        # What was measured so far survives even a hard kill.
        save_document(job.partial, run, False, job.cfg, intervals=False)


def _complete_document(job: Job, run: RunState) -> dict:
    """The complete document, once the failure rate is within the limit and the document
    is a valid calibration file."""
    assert run.replayer is not None  # set before the phases
    run.stage = "done"
    _check_failure_rate(run.replayer.snapshot(), job.cfg)
    document = build_document(run, True, job.cfg)
    try:
        validate_calibration(finite(document), str(job.out))
    except CalibrationFileError as exc:
        raise CalibrationError(
            f"the measurements do not make a valid calibration "
            f"file: {exc.reason} (field {exc.field})"
        ) from None
    return document


def _record_failure(job: Job, run: RunState, exc: BaseException) -> None:
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
        saved = save_partial(job.partial, run, job.cfg, job.say)
        exc.path = str(job.partial) if saved else None  # type: ignore[attr-defined]
    elif isinstance(exc, CalibrationError):
        run.error = str(exc)
        if save_partial(job.partial, run, job.cfg, job.say):
            exc.path = str(job.partial)
    elif isinstance(exc, Exception):
        run.error = f"{type(exc).__name__}: {exc}"
        save_partial(job.partial, run, job.cfg, job.say)


def _check_failure_rate(records: list[RequestRecord], cfg: CalibrationConfig) -> None:
    """Raise :class:`CalibrationError` when no request succeeded or too many failed."""
    counts = request_counts(records)
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
