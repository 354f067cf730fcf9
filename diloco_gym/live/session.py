"""A live session: one serving engine (built-in or an endpoint), its merge workers, one
warm-up and one capacity probe, kept for as many replays as a validation needs.

``diloco-gym calibrate`` measures one trace window in fixed phases. A validation
(:mod:`diloco_gym.live.validate`) replays many windows, at several loads, with merge
schedules it chooses (a fixed plan, an agent's schedule, matched-random ones) or merges a
controller decides while the window plays. :func:`live_session` starts what they share
once, with the calibration's own steps (:mod:`~diloco_gym.live.resources`,
:mod:`~diloco_gym.live.rate`), and releases it whatever happens; :meth:`LiveSession.replay`
runs one phase with the calibration's phase loop and its guards
(:func:`~diloco_gym.live.phases.run_phase`: the server lives, the engine carries the load).

All phases of a session share one run clock and one open-loop replayer, so their records
and merge windows are on one time axis; each phase has a unique name (``"cal:sync"``,
``"w3:agent"``, ...).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from diloco_gym.live.config import CalibrationConfig
from diloco_gym.live.engine import LIVE_EXTRA_HINT, engine_available
from diloco_gym.live.errors import CalibrationError
from diloco_gym.live.output import partial_path
from diloco_gym.live.phases import PhasePlan, overload_limit, run_phase
from diloco_gym.live.plan import prepare_trace, token_arrays
from diloco_gym.live.rate import choose_rate, warm_up_run
from diloco_gym.live.replay import CpuSampler, Endpoint, OpenLoopReplayer, RequestRecord
from diloco_gym.live.resources import Resources, connect_external, start_builtin
from diloco_gym.live.state import Job, RunState, TraceWindow
from diloco_gym.sim.regimes import REGIMES
from diloco_gym.sim.traces import Trace

__all__ = ["LiveSession", "PhaseRun", "live_session", "phase_arrays"]

Source = str | os.PathLike[str] | Trace


@dataclass(frozen=True)
class PhaseRun:
    """One replayed phase of a session.

    Attributes:
        name: the phase's unique name; ``repeat`` its repetition.
        origin_s: the run-clock time of the window's offset 0.
        duration_s: the window's length.
        records: the phase's requests (sent or not, answered or failed).
        planned: the planned merge windows ``(start, length)``, from the origin.
        recorded: the merge windows as they were open ``(start, end)``, from the origin:
            from the command to the last worker's report (checkpoint included).
    """

    name: str
    repeat: int
    origin_s: float
    duration_s: float
    records: list[RequestRecord]
    planned: list[tuple[float, float]] = field(default_factory=list)
    recorded: list[tuple[float, float]] = field(default_factory=list)


def phase_arrays(run: PhaseRun) -> dict[str, np.ndarray]:
    """A phase's requests as arrays: ``offset_s`` (send time from the origin; the
    scheduled time for a request never sent), ``latency_s`` (NaN when it failed), ``ok``,
    ``prompt_tokens``, ``output_tokens``."""
    recs = run.records
    send = np.array([r.send_s if np.isfinite(r.send_s) else r.scheduled_s for r in recs])
    return {
        "offset_s": (send - run.origin_s) if recs else np.zeros(0),
        "latency_s": np.array([r.latency_s for r in recs], dtype=np.float64),
        "ok": np.array([r.ok for r in recs], dtype=bool),
        "prompt_tokens": np.array([r.prompt_tokens for r in recs], dtype=np.int64),
        "output_tokens": np.array([r.output_tokens for r in recs], dtype=np.int64),
    }


@dataclass
class LiveSession:
    """What :func:`live_session` started: the job, the run state (clock, replayer,
    capacity), the resources, the endpoint's URL and model."""

    job: Job
    run: RunState
    res: Resources
    url: str
    model: str

    @property
    def cfg(self) -> CalibrationConfig:
        return self.job.cfg

    @property
    def capacity_rps(self) -> float | None:
        """The probed capacity (``None`` without a probe or when it found none)."""
        cap = self.run.capacity.get("capacity_rps")
        return float(cap) if cap is not None and np.isfinite(cap) else None

    def rate_for(self, utilization: float) -> float:
        """The mean request rate of ``utilization`` x the probed capacity.

        Raises:
            CalibrationError: the session has no probed capacity (``--no-probe``): give
                rates, not utilizations.
        """
        cap = self.capacity_rps
        if cap is None:
            raise CalibrationError(
                "no probed capacity to place a utilization against: run with the probe "
                "(drop --no-probe) or give --rate"
            )
        return utilization * cap

    def window(
        self,
        source: Source,
        duration_s: float,
        rate_rps: float | None,
        start_s: float | None = None,
        seed: int | None = None,
    ) -> TraceWindow:
        """Cut a window of ``source`` (a regime, a trace file or a trace) at ``rate_rps``
        (``None``: the trace's own rate), from ``start_s`` (``None``: a seeded random
        window), with the session's request-size caps."""
        label = self.cfg.label or (
            source if isinstance(source, str) and source in REGIMES else None
        )
        cfg = replace(
            self.cfg,
            rate_rps=rate_rps,
            start_s=start_s,
            seed=self.cfg.seed if seed is None else seed,
            label=label or "sync-heavy",  # the window's label plays no part in a validation
        )
        win, _, _, _ = prepare_trace(source, duration_s, cfg, self.job.trace_format)
        prompt, output = token_arrays(win, cfg)
        return TraceWindow(win, prompt, output)

    def replay(
        self,
        window: TraceWindow,
        name: str,
        merges: Sequence[tuple[float, float]] = (),
        repeat: int = 0,
        duration_s: float | None = None,
        repeats: int = 1,
    ) -> PhaseRun:
        """Replay ``window`` open loop as phase ``name`` (repetition ``repeat`` of
        ``repeats``) while the planned ``merges`` ``(start, length)`` run; wait for its
        requests; return what was measured."""
        run = self.run
        length = float(window.trace.duration_s if duration_s is None else duration_s)
        run.overload_limit = overload_limit(run, self.cfg, window.trace.mean_rate_rps)
        first = len(run.merges)
        plan = PhasePlan(name, repeat, tuple((float(s), float(w)) for s, w in merges))
        cfg = replace(self.cfg, repeats=repeats)  # the progress line's "k/n"
        run_phase(run, plan, self.res.cluster, self.res.server, window, length, cfg, self.job.say)
        return self.collect(name, repeat, plan.merges, first)

    def collect(
        self, name: str, repeat: int, planned: Sequence[tuple[float, float]], first_merge: int
    ) -> PhaseRun:
        """The :class:`PhaseRun` of a finished phase whose merges are ``run.merges`` from
        index ``first_merge`` on."""
        run = self.run
        key = name if repeat == 0 else f"{name}-{repeat + 1}"
        meta = run.phases[key]
        origin = float(meta["origin_s"])
        assert run.replayer is not None
        records = [r for r in run.replayer.snapshot() if r.phase == name and r.repeat == repeat]
        recorded = []
        for m in run.merges[first_merge:]:
            m["phase_name"] = name
            if m.get("end_s") is not None:
                recorded.append((m["start_s"] - origin, m["end_s"] - origin))
        return PhaseRun(
            name, repeat, origin, float(meta["duration_s"]), records, list(planned), recorded
        )


def _default_progress(message: str) -> None:
    print(f"[validate] {message}", flush=True)


@contextlib.contextmanager
def live_session(
    endpoint: str | None,
    sources: Sequence[Source],
    duration_s: float,
    config: CalibrationConfig | None = None,
    *,
    trace_format: str = "auto",
    out: str | os.PathLike[str] = "validate.json",
    progress: Callable[[str], None] | None = _default_progress,
    capacity_rps: float | None = None,
) -> Iterator[LiveSession]:
    """Start a session: the engine (``endpoint`` ``None``: the built-in one) sized for the
    longest request of any of ``sources``, the merge workers, the warm-up and the capacity
    probe on a ``duration_s`` window of the first source; release everything on exit.

    ``capacity_rps`` skips the probe and takes that capacity as given (an endpoint whose
    capacity is known, or a smoke run).

    Raises:
        CalibrationError: the live extra is missing for the built-in engine, the engine or
            a merge worker failed, the probe found no sustainable rate.
        EndpointUnavailableError: the endpoint does not answer.
    """
    if not sources:
        raise ValueError("live_session needs at least one trace source")
    cfg = (config or CalibrationConfig()).resolved(endpoint is None)
    if capacity_rps is not None:
        if not (np.isfinite(capacity_rps) and capacity_rps > 0):
            raise ValueError(f"capacity_rps must be > 0, got {capacity_rps!r}")
        cfg = replace(cfg, probe=None)
    say = progress or (lambda message: None)
    path = Path(out)
    job = Job(endpoint, sources[0], duration_s, trace_format, cfg, say, path, partial_path(path))
    if job.builtin and cfg.engine == "transformers" and not engine_available():
        raise CalibrationError(LIVE_EXTRA_HINT)
    run = RunState(
        t0=time.monotonic(), started_utc=datetime.now(timezone.utc).isoformat(timespec="seconds")
    )
    first, longest = _first_window(job, run, sources)
    res = Resources(run, CpuSampler().start())
    try:
        if job.builtin:
            url, model = start_builtin(job, run, res, longest)
        else:
            url, model = connect_external(job, run, res, first, longest)
        assert res.cluster is not None
        run.cluster = res.cluster.describe()
        ep = Endpoint.parse(url)
        if job.builtin:
            warm_up_run(run, ep, model, cfg, first.prompt, first.output, longest, say)
        choose_rate(run, ep, model, cfg, job.builtin, first.prompt, first.output, res.server, say)
        if capacity_rps is not None:
            run.capacity.update(capacity_rps=float(capacity_rps), capacity_source="given")
            say(f"capacity {capacity_rps:g} req/s as given (no probe)")
        run.replayer = OpenLoopReplayer(
            ep, model, cfg.timeout_s, run.clock, cfg.max_outstanding, res.cpu
        )
        res.start_ticker(cfg.progress_every_s, say)
        yield LiveSession(job, run, res, url, model)
    finally:
        res.close()


def _first_window(
    job: Job, run: RunState, sources: Sequence[Source]
) -> tuple[TraceWindow, tuple[int, int]]:
    """The first source's window (the warm-up's and the probe's request sizes) and the
    longest request ``(prompt, output)`` any window of any source can send (the engine's
    KV cache is sized for it)."""
    cfg = job.cfg
    longest = [1, 1]
    first: TraceWindow | None = None
    for source in sources:
        label = cfg.label or (source if isinstance(source, str) and source in REGIMES else None)
        win, run.label, run.base, info = prepare_trace(
            source, job.duration_s, replace(cfg, label=label or "sync-heavy"), job.trace_format
        )
        prompt, output = token_arrays(win, cfg)
        longest[0] = max(longest[0], info.get("longest_prompt_tokens", int(prompt.max(initial=1))))
        longest[1] = max(longest[1], info.get("longest_output_tokens", int(output.max(initial=1))))
        if first is None:
            first, run.trace_info = TraceWindow(win, prompt, output), info
    assert first is not None
    return first, (longest[0], longest[1])
