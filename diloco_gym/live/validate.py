"""``diloco-gym validate``: does the fitted simulator predict what a real engine does?

One live session (:func:`~diloco_gym.live.session.live_session`: the engine, the merge
workers, one warm-up and one capacity probe) runs up to three modes:

1. **Calibration** (always first, unless a calibration file is given): the calibration's
   own phases on one setting (``calibration_source`` at ``calibration_utilization`` of the
   probed capacity, ``repeats`` pairs of a sync and a control phase) and the sidecar fit
   (:func:`~diloco_gym.live.fit.fit_sidecar_live`). The SLO is fixed here: ``slo_ms``, or
   the calibration's control-phase p99.
2. **fidelity**: on held-out settings the fit never saw (other utilizations, other regimes,
   a window of a real trace), ``repeats`` control phases (no merges) and sync phases (a
   fixed merge plan), each compared with the fitted simulator's prediction for the same
   sends (:mod:`~diloco_gym.live.fidelity`).
3. **verdicts**: on ``windows`` disjoint windows of ``regime``, the agent's schedule (as the
   simulator computes it on the window's arrivals), ``draws`` matched-random schedules and
   a no-merge control, replayed live in a seeded order; the live agent-minus-random
   difference and its paired test beside the simulator's, and the rank correlation of the
   two costs over every replayed schedule (:mod:`~diloco_gym.live.verdicts`).
4. **closed-loop**: on the same windows, the agent decides live through a controller
   (:mod:`~diloco_gym.live.closed_loop`), against matched-random schedules of its own merge
   count, and against the open-loop replay of its simulated schedule.

A *cost* is sync-excess: the violation % of a replay with merges minus that of the same
window's control replay, in percentage points; a failed request counts as a violation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from diloco_gym.envs.params import EnvParams
from diloco_gym.live import fidelity as fid
from diloco_gym.live import verdict_stats as vstats
from diloco_gym.live import verdicts as ver
from diloco_gym.live.closed_loop import replay_closed_loop
from diloco_gym.live.document import run_data
from diloco_gym.live.errors import CalibrationError
from diloco_gym.live.fit import bootstrap_intervals, fit_sidecar_live, measured_effect_sizes
from diloco_gym.live.plan import phase_order, plan_merges
from diloco_gym.live.session import LiveSession, PhaseRun, phase_arrays
from diloco_gym.sim.sidecar import SidecarParams, percentile
from diloco_gym.sim.traces import Trace
from diloco_gym.text import finite_float

__all__ = [
    "MODES",
    "ValidateConfig",
    "calibrate_in_session",
    "run_fidelity",
    "run_windows",
    "violation_pct",
    "scaled_env",
    "sample_of",
    "bare",
    "run_validation",
    "ver_block",
    "interval",
]

MODES = ("fidelity", "verdicts", "closed-loop")

#: The default held-out settings of the fidelity mode: (source, utilization).
#: A bursty regime's 90 s windows reach about twice its mean rate, so its load is lower.
HELD_OUT = (("sync-heavy", 0.3), ("sync-heavy", 0.6), ("bursty", 0.3))


@dataclass(frozen=True)
class ValidateConfig:
    """What a validation runs (the engine, load and merge options are the calibration's
    :class:`~diloco_gym.live.config.CalibrationConfig`).

    Attributes:
        modes: which of :data:`MODES` to run.
        calibration_source / calibration_utilization: the setting the sidecar is fitted on.
        duration_s: window length of the calibration and of each fidelity setting.
        repeats: phase pairs per calibration and per fidelity setting.
        held_out: the fidelity mode's settings ``(source, utilization)``; a source is a
            regime or a trace file.
        slo_ms: the latency SLO (``None``: the calibration's control-phase p99).
        regime: source of the verdict and closed-loop windows; ``utilization`` their load.
        windows / window_s: how many disjoint windows, and their length.
        draws: matched-random schedules per window.
        agent: the agent (a registry name) whose verdict is checked.
        time_scale: multiplies the env's ``step_seconds`` and ``merge_seconds`` and the
            sidecar's ``tail_s`` (1: the env's own clock; below 1 for smoke runs).
        fitted: a fitted sidecar to use instead of calibrating (from a calibration file).
        seed: seeds windows, schedules and phase orders.
    """

    modes: tuple[str, ...] = MODES
    calibration_source: str = "sync-heavy"
    calibration_utilization: float = 0.5
    duration_s: float = 30.0
    repeats: int = 3
    held_out: tuple[tuple[str, float], ...] = HELD_OUT
    slo_ms: float | None = None
    regime: str = "bursty"
    utilization: float = 0.3
    windows: int = 8
    window_s: float = 90.0
    draws: int = 2
    agent: str = "online-forecast"
    time_scale: float = 1.0
    fitted: SidecarParams | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        bad = [m for m in self.modes if m not in MODES]
        if bad or not self.modes:
            raise ValueError(f"ValidateConfig.modes: {bad or 'none'} not in {', '.join(MODES)}")
        for name in ("duration_s", "window_s", "time_scale", "calibration_utilization"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"ValidateConfig.{name} must be > 0, got {v!r}")
        for name, lo in (("repeats", 1), ("windows", 1), ("draws", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"ValidateConfig.{name} must be an int >= {lo}, got {v!r}")
        if self.slo_ms is not None and not (math.isfinite(self.slo_ms) and self.slo_ms > 0):
            raise ValueError(f"ValidateConfig.slo_ms must be > 0, got {self.slo_ms!r}")
        for source, u in self.held_out:
            if not (isinstance(u, (int, float)) and 0 < u < 10):
                raise ValueError(f"ValidateConfig.held_out: utilization of {source} is {u!r}")

    @property
    def sources(self) -> list[str]:
        """Every trace source the session replays (the engine is sized for all)."""
        out = [self.calibration_source]
        if "fidelity" in self.modes:
            out += [s for s, _ in self.held_out]
        if {"verdicts", "closed-loop"} & set(self.modes):
            out.append(self.regime)
        return list(dict.fromkeys(out))


def scaled_env(vcfg: ValidateConfig, sidecar: SidecarParams) -> tuple[EnvParams, SidecarParams]:
    """The env's parameters and the sidecar on the validation's clock (``time_scale``).

    The sidecar's ``pressure_gain`` is 0: a live replay has no outside pressure, and the
    live fit models the load itself with the queue (a gain on the serving pressure would
    count the load twice)."""
    base = EnvParams()
    s = vcfg.time_scale
    params = replace(base, step_seconds=base.step_seconds * s, merge_seconds=base.merge_seconds * s)
    return params, replace(sidecar, tail_s=sidecar.tail_s * s, pressure_gain=0.0)


def bare(trace: Trace) -> Trace:
    """The window as a live replay plays it: its requests, with zero network and checkpoint
    pressure (a trace without them would get a regime's pressure processes in the env)."""
    n = trace.num_pressure_samples
    return replace(trace, network=np.zeros(n), checkpoint=np.zeros(n))


def violation_pct(run: PhaseRun, slo_s: float) -> float:
    """Violation % of a live phase: requests over the SLO or failed, over all requests
    (the fidelity check's own count, :func:`~diloco_gym.live.fidelity.measured_metrics`)."""
    return fid.measured_metrics(sample_of(run), slo_s)["violation_pct"]


def sample_of(run: PhaseRun) -> fid.PhaseSample:
    """The fidelity module's sample of a live phase (planned merges as ``(start, end)``)."""
    a = phase_arrays(run)
    return fid.PhaseSample(
        offset_s=a["offset_s"],
        latency_s=np.where(a["ok"], a["latency_s"], np.nan),
        ok=a["ok"],
        prompt_tokens=a["prompt_tokens"],
        output_tokens=a["output_tokens"],
        merges_s=[(s, s + w) for s, w in run.planned],
        duration_s=run.duration_s,
    )


def calibrate_in_session(s: LiveSession, vcfg: ValidateConfig) -> tuple[SidecarParams, dict]:
    """The calibration setting's phases and the sidecar fit; returns the fitted sidecar
    (its SLO set) and the document's ``calibration`` block."""
    cfg = replace(s.cfg, repeats=vcfg.repeats, seed=vcfg.seed, control=True, link_shares=(1.0,))
    rate = s.rate_for(vcfg.calibration_utilization)
    win = s.window(vcfg.calibration_source, vcfg.duration_s, rate)
    plan = plan_merges(vcfg.duration_s, cfg)
    s.job.say(
        f"calibration: {vcfg.calibration_source} at {vcfg.calibration_utilization:g} of the "
        f"capacity ({win.trace.mean_rate_rps:.2f} req/s), {vcfg.repeats} sync/control pairs"
    )
    runs = [
        s.replay(win, name, plan if name == "sync" else (), k, repeats=vcfg.repeats)
        for name, k in phase_order(cfg)
    ]
    assert s.run.replayer is not None
    data = run_data(s.run.replayer.snapshot(), s.run)
    measured = measured_effect_sizes(data, cfg.pressure_norm_inflight, cfg.high_pressure)
    boot = bootstrap_intervals(
        data, cfg.pressure_norm_inflight, cfg.high_pressure, cfg.bootstrap_resamples, seed=cfg.seed
    )
    try:
        live_fit = fit_sidecar_live(
            data, measured, s.run.base, sync_ratio_interval=boot["p95_sync_ratio"]
        )
    except (ValueError, FloatingPointError) as exc:
        raise CalibrationError(f"the calibration's sidecar fit failed: {exc}") from None
    control_ms = 1000.0 * data.latency_s[data.mask("control")]
    slo_ms = vcfg.slo_ms or round(percentile(control_ms, 99.0), 1)
    if not (math.isfinite(slo_ms) and slo_ms > 0):
        raise CalibrationError("no control-phase request succeeded: no SLO to validate against")
    params = replace(live_fit.params, slo_ms=slo_ms)
    block = {
        "source": vcfg.calibration_source,
        "utilization": vcfg.calibration_utilization,
        "rate_rps": win.trace.mean_rate_rps,
        "duration_s": vcfg.duration_s,
        "repeats": vcfg.repeats,
        "merges": [list(m) for m in plan],
        "p95_sync_ratio": finite_float(measured.get("p95_sync_ratio")),
        "p95_sync_ratio_ci": interval(boot["p95_sync_ratio"]),
        "slo_ms": slo_ms,
        "slo_source": "--slo-ms" if vcfg.slo_ms else "the calibration's control-phase p99",
        "fitted_sidecar": asdict(params),
        "fit_notes": list(live_fit.notes),
    }
    # The calibration setting's own fidelity (in sample), beside the held-out ones.
    block["rows"] = fid.fidelity_rows(_samples(runs), params, params.slo_s, rng_seed=vcfg.seed)
    return params, block


def _samples(runs: list[PhaseRun]) -> dict[str, list[fid.PhaseSample]]:
    out: dict[str, list[fid.PhaseSample]] = {"control": [], "sync": []}
    for r in runs:
        out["sync" if r.planned else "control"].append(sample_of(r))
    return out


def run_fidelity(s: LiveSession, vcfg: ValidateConfig, params: SidecarParams) -> dict:
    """The held-out settings, each replayed ``repeats`` times without and with merges,
    against the fitted simulator's predictions; the document's ``fidelity`` block."""
    cfg = replace(s.cfg, repeats=vcfg.repeats, control=True, link_shares=(1.0,))
    settings, failures = [], []
    for i, (source, u) in enumerate(vcfg.held_out):
        name = f"{_short(source)} U={u:g}"
        win = s.window(source, vcfg.duration_s, s.rate_for(u), seed=vcfg.seed + 1 + i)
        plan = plan_merges(vcfg.duration_s, replace(cfg, seed=vcfg.seed + 1 + i))
        order = phase_order(replace(cfg, seed=vcfg.seed + 1 + i))
        s.job.say(
            f"fidelity {i + 1}/{len(vcfg.held_out)}: {name} ({win.trace.mean_rate_rps:.2f} "
            f"req/s, {win.trace.num_requests} requests, {len(plan)} merges per sync phase)"
        )
        runs = [
            s.replay(win, f"h{i}:{ph}", plan if ph == "sync" else (), k, repeats=vcfg.repeats)
            for ph, k in order
        ]
        rows = fid.fidelity_rows(_samples(runs), params, params.slo_s, rng_seed=vcfg.seed + i)
        settings.append(
            {
                "name": name,
                "source": str(source),
                "utilization": u,
                "rate_rps": win.trace.mean_rate_rps,
                "duration_s": vcfg.duration_s,
                "repeats": vcfg.repeats,
                "merges": [list(m) for m in plan],
                "rows": rows,
            }
        )
        failures += fid.failures(name, rows)
    return {"settings": settings, "failures": failures}


def _short(source: Any) -> str:
    text = str(source)
    return text.rsplit("/", 1)[-1]


def run_windows(
    s: LiveSession,
    vcfg: ValidateConfig,
    params: SidecarParams,
    make_agent: Callable[[str], Any],
) -> dict:
    """The verdict and closed-loop windows; the document's ``verdicts`` block (and its
    ``closed_loop`` part when that mode runs)."""
    env_params, sidecar = scaled_env(vcfg, params)
    rate = s.rate_for(vcfg.utilization)
    closed = "closed-loop" in vcfg.modes
    rng = np.random.default_rng([vcfg.seed, 17])
    rows = []
    for k in range(vcfg.windows):
        t0 = time.monotonic()
        win = s.window(vcfg.regime, vcfg.window_s, rate, start_s=k * vcfg.window_s)
        we = ver.window_episode(bare(win.trace), sidecar, env_params, seed=vcfg.seed + k)
        rows.append(_one_window(s, vcfg, k, win, we, make_agent, rng, closed))
        s.job.say(f"window {k + 1}/{vcfg.windows} done in {time.monotonic() - t0:.0f} s")
    return ver_block(vcfg, rows, closed)


def _one_window(
    s: LiveSession,
    vcfg: ValidateConfig,
    k: int,
    win: Any,
    we: Any,
    make_agent: Callable[[str], Any],
    rng: np.random.Generator,
    closed: bool,
) -> dict:
    """One window: the simulator's schedules, the live phases in a seeded order, the
    closed loop, and each schedule's simulated and live cost."""
    p = we.params
    agent_sched = ver.agent_schedule(we, make_agent(vcfg.agent))
    n = int(agent_sched.sum())
    randoms = ver.matched_random_schedules(we, n, vcfg.draws)
    plans: list[tuple[str, np.ndarray]] = [("agent", agent_sched)]
    plans += [(f"random-{j + 1}", r) for j, r in enumerate(randoms)]
    jobs: list[str] = (
        ["control"] + [name for name, _ in plans] + (["closed-loop"] if closed else [])
    )
    order = [jobs[i] for i in rng.permutation(len(jobs))]
    live: dict[str, PhaseRun] = {}
    loop = None
    for name in order:
        phase = f"w{k}:{name}"
        if name == "control":
            live[name] = s.replay(win, phase)
        elif name == "closed-loop":
            loop = replay_closed_loop(
                s,
                win,
                phase,
                make_agent(vcfg.agent),
                params=p,
                learners=we.env().learner_params,
                serving_capacity_rps=we.sidecar.serving_capacity_rps,
                decisions=we.n_decisions,
            )
            live[name] = loop.phase
        else:
            sched = dict(plans)[name]
            live[name] = s.replay(win, phase, ver.merge_windows_s(sched, p))
    slo = we.sidecar.slo_s
    base = violation_pct(live["control"], slo)
    schedules = []
    for name, sched in plans:
        kind = "agent" if name == "agent" else "random"
        schedules.append(_schedule_row(we, kind, sched, live[name], slo, base))
    extra_random: list[dict] = []
    if loop is not None:
        loop_sched = ver.schedule_from_starts(loop.starts_s, p, we.n_decisions)
        row = _schedule_row(we, "closed-loop", loop_sched, loop.phase, slo, base)
        # how late each decision read its telemetry, after its nominal time (s)
        late = loop.read_s - np.arange(loop.read_s.size) * p.decision_seconds
        row["decision_lateness_s"] = {"median": float(np.median(late)), "max": float(late.max())}
        schedules.append(row)
        m = int(loop_sched.sum())
        if m != n:  # its own matched random: same merge count as the closed loop
            for j, r in enumerate(ver.matched_random_schedules(we, m, vcfg.draws)):
                run = s.replay(win, f"w{k}:closed-random-{j + 1}", ver.merge_windows_s(r, p))
                extra_random.append(_schedule_row(we, "closed-random", r, run, slo, base))
    return {
        "window": k,
        "start_s": k * vcfg.window_s,
        "duration_s": vcfg.window_s,
        "requests": win.trace.num_requests,
        "decisions": we.n_decisions,
        "order": order,
        "control_violation_pct": base,
        "schedules": schedules + extra_random,
    }


def _schedule_row(
    we: Any, kind: str, sched: np.ndarray, run: PhaseRun, slo: float, base: float
) -> dict:
    sim = float(ver.predicted_excess(we, sched[None, :])[0])
    return {
        "kind": kind,
        "merges": int(np.asarray(sched).sum()),
        "decisions": [int(d) for d in np.flatnonzero(sched)],
        "sim_excess_pp": sim,
        "live_violation_pct": violation_pct(run, slo),
        "live_excess_pp": violation_pct(run, slo) - base,
        "recorded_merges_s": [[round(a, 3), round(b, 3)] for a, b in run.recorded],
    }


def ver_block(vcfg: ValidateConfig, rows: list[dict], closed: bool) -> dict:
    """The ``verdicts`` block: the windows, the verdict summary and the closed loop's."""

    def pick(kind: str, field: str) -> np.ndarray:
        return np.array([[r[field] for r in w["schedules"] if r["kind"] == kind] for w in rows])

    agent_live, agent_sim = (
        pick("agent", "live_excess_pp")[:, 0],
        pick("agent", "sim_excess_pp")[:, 0],
    )
    rand_live, rand_sim = pick("random", "live_excess_pp"), pick("random", "sim_excess_pp")
    block: dict[str, Any] = {
        "agent": vcfg.agent,
        "regime": vcfg.regime,
        "utilization": vcfg.utilization,
        "windows": rows,
        "summary": vstats.verdict_summary(
            agent_live, rand_live, agent_sim, rand_sim, seed=vcfg.seed
        ),
        "closed_loop": None,
    }
    if closed:
        loop_live = pick("closed-loop", "live_excess_pp")[:, 0]
        own = []
        for w, r_live in zip(rows, rand_live, strict=True):
            extra = [r["live_excess_pp"] for r in w["schedules"] if r["kind"] == "closed-random"]
            own.append(extra if extra else list(r_live))
        block["closed_loop"] = vstats.closed_loop_summary(
            loop_live, np.array(own, dtype=float), agent_live, seed=vcfg.seed
        )
    return block


def interval(bounds: Any) -> list[float | None] | None:
    """A bootstrap interval as JSON: ``None`` where the bootstrap gave none (fewer than two
    repeats, or too few requests in a class: a short or loaded run), else ``[lo, hi]``."""
    return None if bounds is None else [finite_float(v) for v in bounds]


def run_validation(
    endpoint: str | None,
    vcfg: ValidateConfig,
    config: Any,
    out: str,
    *,
    command: str = "",
    trace_format: str = "auto",
    progress: Callable[[str], None] | None = None,
    capacity_rps: float | None = None,
) -> dict:
    """Run the validation's modes in one live session and write the document, its
    Markdown page and figures (:func:`~diloco_gym.live.validate_doc.write_outputs`).

    Returns:
        The complete document.

    Raises:
        CalibrationError: the engine, a merge or a phase failed; what was measured so far
            is written beside ``out`` (``NAME.partial.json``), named by ``exc.path``.
        KeyboardInterrupt: likewise saved, then re-raised.
    """
    from diloco_gym.agents.registry import make_agent
    from diloco_gym.live.session import live_session
    from diloco_gym.live.validate_doc import write_outputs

    t0 = time.monotonic()
    doc: dict[str, Any] = {
        "format": "diloco-gym-validate",
        "version": 1,
        "complete": False,
        "error": None,
        "command": command,
        "modes": list(vcfg.modes),
        "config": _config_record(vcfg, config),
        "calibration": None,
        "fidelity": None,
        "verdicts": None,
        "timings_s": {},
    }
    kwargs: dict[str, Any] = {"capacity_rps": capacity_rps}
    if progress is not None:
        kwargs["progress"] = progress
    try:
        with live_session(
            endpoint, vcfg.sources, vcfg.duration_s, config, trace_format=trace_format, out=out,
            **kwargs,
        ) as s:  # fmt: skip
            doc.update(
                started_utc=s.run.started_utc,
                endpoint=s.run.endpoint,
                cluster=s.run.cluster,
                capacity=s.run.capacity,
            )
            _step(doc, "calibration", t0, lambda: _calibration(s, vcfg, doc))
            params = _params_of(doc)
            if "fidelity" in vcfg.modes:
                _step(doc, "fidelity", t0, lambda: run_fidelity(s, vcfg, params))
            if {"verdicts", "closed-loop"} & set(vcfg.modes):
                _step(doc, "verdicts", t0, lambda: run_windows(s, vcfg, params, make_agent))
    except BaseException as exc:
        doc["error"] = str(exc) or type(exc).__name__
        doc["elapsed_s"] = time.monotonic() - t0
        saved = write_outputs(doc, out)
        if isinstance(exc, (CalibrationError, KeyboardInterrupt)):
            exc.path = str(saved[0])  # type: ignore[union-attr]
        raise
    doc["complete"] = True
    doc["elapsed_s"] = time.monotonic() - t0
    write_outputs(doc, out)
    return doc


def _step(doc: dict, key: str, t0: float, fn: Callable[[], Any]) -> None:
    """Run one mode into ``doc[key]`` and record how long it took."""
    t = time.monotonic()
    result = fn()
    if key != "calibration":
        doc[key] = result
    doc["timings_s"][key] = time.monotonic() - t


def _calibration(s: LiveSession, vcfg: ValidateConfig, doc: dict) -> None:
    if vcfg.fitted is not None:
        slo = vcfg.slo_ms or vcfg.fitted.slo_ms
        params = replace(vcfg.fitted, slo_ms=slo)
        doc["calibration"] = {
            "source": "file",
            "slo_ms": slo,
            "slo_source": "--slo-ms" if vcfg.slo_ms else "the calibration file",
            "fitted_sidecar": asdict(params),
        }
        return
    _, doc["calibration"] = calibrate_in_session(s, vcfg)


def _params_of(doc: dict) -> SidecarParams:
    return SidecarParams(**doc["calibration"]["fitted_sidecar"])


def _config_record(vcfg: ValidateConfig, config: Any) -> dict:
    rec = asdict(vcfg)
    rec["fitted"] = None if vcfg.fitted is None else asdict(vcfg.fitted)
    if config is not None:
        merge = getattr(config, "merge", None)
        rec["merge"] = asdict(merge) if merge is not None else None
        for name in ("merge_seconds", "gap_seconds", "timeout_s", "engine", "engine_threads"):
            rec[name] = getattr(config, name, None)
    return rec
