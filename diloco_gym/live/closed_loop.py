"""A scheduler in the loop of a live replay: a :class:`~diloco_gym.deploy.Controller`
decides, every decision interval while a trace window plays against the engine, whether to
launch a real merge now.

The controller sees what a deployment would: the requests sent to the server since the
previous decision (the replayer's sends, each counted once, at the first decision that
sees it; the first decision's interval has none, as in the env), no network
or checkpoint telemetry (``None``, as the env without a pressure series), and the learner
surrogate's reports at the current gap (no learners train here; each learner runs at the
surrogate's median throughput). When it says merge, a real merge (the all-reduces and the
checkpoint of :mod:`~diloco_gym.live.merges`) starts at once in a thread while the loop goes
on to the next decision, as a trainer's outer step would; the corridor keeps merges from
overlapping (a merge is shorter than ``H_min``). Decision ``d`` falls at the window's offset
``d x decision_seconds``, the env's clock, so the closed loop's schedule maps back onto the
simulator's decisions exactly (:func:`~diloco_gym.live.verdicts.schedule_from_starts`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from diloco_gym.deploy import Controller, Telemetry
from diloco_gym.live.errors import CalibrationError
from diloco_gym.live.phases import (
    PhasePlan,
    begin_phase,
    end_phase,
    overload_limit,
    run_merge,
    wait_until,
)
from diloco_gym.live.session import LiveSession, PhaseRun
from diloco_gym.live.state import TraceWindow

__all__ = ["ClosedLoopRun", "replay_closed_loop"]


@dataclass(frozen=True)
class ClosedLoopRun:
    """A closed-loop phase: the replay; per decision whether the controller merged
    (``merged``), whether the corridor forced it (``forced``), the requests its telemetry
    carried (``requests``) and when, from the origin, the decision read them (``read_s``)."""

    phase: PhaseRun
    merged: np.ndarray
    forced: np.ndarray
    requests: np.ndarray
    read_s: np.ndarray

    @property
    def starts_s(self) -> list[float]:
        """The merges' decision times, from the window's origin."""
        return [start for start, _ in self.phase.planned]


def replay_closed_loop(
    session: LiveSession,
    window: TraceWindow,
    name: str,
    agent: Any,
    *,
    params: Any,
    learners: Any,
    serving_capacity_rps: float,
    decisions: int,
    repeat: int = 0,
) -> ClosedLoopRun:
    """Replay ``window`` as phase ``name`` while ``agent``, through a controller with the
    env's ``params`` and ``learners``, decides the merges live (``decisions`` decision
    intervals from the window's origin).

    Raises:
        CalibrationError: a merge failed (a worker died), the server died or the engine
            could not carry the load (the phase guards of
            :func:`~diloco_gym.live.phases.wait_until`).
    """
    run, cfg, say = session.run, session.cfg, session.job.say
    replayer = run.replayer
    assert replayer is not None  # started with the session
    thr = [float(learners.throughput_tokens_per_s)] * int(learners.num_learners)
    ctrl = Controller(
        agent,
        params,
        learners,
        serving_capacity_rps=serving_capacity_rps,
        decisions=decisions,
        learner_throughputs=thr,
    )
    duration = float(window.trace.duration_s)
    say(f"closed-loop phase {name}: {duration:g} s, {decisions} decisions, agent decides live")
    first = len(run.merges)
    run.overload_limit = overload_limit(run, cfg, window.trace.mean_rate_rps)
    origin = begin_phase(run, name, repeat, window.trace, window.prompt, window.output, duration)
    loop = _decide(session, PhasePlan(name, repeat), ctrl, origin, params, decisions)
    wait_until(
        run,
        cfg,
        session.res.server,
        until=origin + duration + 5.0,
        done=lambda: not replayer.sending,
    )
    end_phase(run, name, repeat, session.res.server, cfg)
    return ClosedLoopRun(
        session.collect(name, repeat, loop.planned, first),
        loop.merged,
        loop.forced,
        loop.requests,
        loop.read_s,
    )


@dataclass
class _Loop:
    """What the decision loop recorded (see :class:`ClosedLoopRun`)."""

    merged: np.ndarray
    forced: np.ndarray
    requests: np.ndarray
    read_s: np.ndarray
    planned: list[tuple[float, float]]


def _decide(
    session: LiveSession,
    plan: PhasePlan,
    ctrl: Controller,
    origin: float,
    params: Any,
    decisions: int,
) -> _Loop:
    """The decisions at ``origin + d x decision_seconds``, each merge started in a thread;
    returns once the last merge is done."""
    run, cfg, say = session.run, session.cfg, session.job.say
    replayer, cluster, name = run.replayer, session.res.cluster, plan.name
    assert replayer is not None and cluster is not None  # started with the session
    step_s = float(params.decision_seconds)
    length_s = float(params.merge_steps * params.step_seconds)
    loop = _Loop(
        np.zeros(decisions, dtype=np.int8),
        np.zeros(decisions, dtype=bool),
        np.zeros(decisions, dtype=np.int64),
        np.zeros(decisions),
        [],
    )
    seen = 0
    box: dict[str, BaseException] = {}
    worker: threading.Thread | None = None
    for d in range(decisions):
        wait_until(run, cfg, session.res.server, until=origin + d * step_s)
        if "error" in box:
            raise box["error"]
        # Every request sent so far, each counted once, at the first decision that sees
        # it: the requests since the last decision, as a deployment's counter reads them.
        total = sum(1 for r in replayer.snapshot() if r.phase == name and r.send_s == r.send_s)
        loop.read_s[d] = run.clock() - origin
        if d > 0:  # the first decision has no interval before it; its sends go to the next
            loop.requests[d], seen = total - seen, total
        decision = ctrl.step(Telemetry(requests=int(loop.requests[d])))
        if not decision.merge:
            continue
        if worker is not None and worker.is_alive():
            raise CalibrationError(
                f"closed loop {name}: the controller merged at decision {d} while the "
                f"previous merge still ran (merges longer than H_min)"
            )
        loop.merged[d], loop.forced[d] = 1, bool(decision.forced)
        loop.planned.append((d * step_s, length_s))
        args = (box, run, cluster, plan, len(loop.planned) - 1, origin, d * step_s, length_s)
        worker = threading.Thread(
            target=_merge_into, args=(*args, cfg, say), name=f"merge-{name}-{d}", daemon=True
        )
        worker.start()
    if worker is not None:
        worker.join()
    if "error" in box:
        raise box["error"]
    return loop


def _merge_into(box: dict, *args: Any) -> None:
    """:func:`~diloco_gym.live.phases.run_merge` in a thread; its error lands in ``box``."""
    try:
        run_merge(*args)
    except BaseException as exc:  # noqa: BLE001 - re-raised by the decision loop
        box["error"] = exc
