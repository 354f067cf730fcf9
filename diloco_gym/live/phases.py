"""The measured phases of a run and their guards.

A phase replays the run's trace window open loop (:class:`~diloco_gym.live.replay.
OpenLoopReplayer`) as planned by a :class:`PhasePlan`: a *sync* phase runs its planned
merges while the window is replayed, a *control* phase (the no-sync load match) runs
none. While a phase runs, :func:`wait_until` checks every 0.1 s that the server lives and
that the engine carries the load (:func:`check_overload`)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from diloco_gym.live.config import (
    CalibrationConfig,
)
from diloco_gym.live.engine import (
    EngineProcess,
)
from diloco_gym.live.errors import (
    CalibrationError,
)
from diloco_gym.live.merges import MergeCluster, MergeReport
from diloco_gym.live.plan import (
    level_share,
    phase_key,
)
from diloco_gym.live.state import RunState, TraceWindow
from diloco_gym.sim.traces import Trace

__all__ = [
    "PhasePlan",
    "phase_plans",
    "run_phase",
    "run_merge",
    "begin_phase",
    "end_phase",
    "wait_until",
    "overload_limit",
    "check_overload",
    "check_server",
]


@dataclass(frozen=True)
class PhasePlan:
    """One measured phase.

    Attributes:
        name: the label of its records (``"sync"``, ``"control"``, or ``"sync@U"`` for a
            sync phase whose merges use link share ``U`` < 1).
        repeat: which repetition of the phase (0 for the first).
        merges: the planned merge windows ``(start, length)``, seconds from the phase's
            origin; empty for a control phase (the no-sync load match).
        link_share: the share of the merge workers' unthrottled all-reduce rate the merges
            use (1: unthrottled; :meth:`~diloco_gym.live.merges.MergeCluster.merge`).
    """

    name: str
    repeat: int
    merges: tuple[tuple[float, float], ...] = ()
    link_share: float = 1.0

    def announcement(self, repeats: int, requests: int, duration_s: float) -> str:
        """The progress line that opens the phase."""
        if not self.merges:
            return (
                f"{self.name} phase {self.repeat + 1}/{repeats} (no merges): {duration_s:g} s, "
                f"{requests} requests"
            )
        share = "" if self.link_share == 1.0 else f" at link share {self.link_share:g}"
        what = "sync" if self.name.startswith("sync") else self.name
        return (
            f"{what} phase{share} {self.repeat + 1}/{repeats}: {duration_s:g} s, {requests} "
            f"requests, {len(self.merges)} merges"
        )


def phase_plans(run: RunState) -> list[PhasePlan]:
    """The plans of the run's phases, in its order (``run.order``): every sync phase runs
    the run's merge schedule (``run.plan``), at the link share its name carries."""
    plans = []
    for name, repeat in run.order:
        if name == "control":
            plans.append(PhasePlan(name, repeat))
        else:
            plans.append(PhasePlan(name, repeat, tuple(run.plan), level_share(name)))
    return plans


def run_phase(
    run: RunState,
    plan: PhasePlan,
    cluster: MergeCluster | None,
    server: Any,
    window: TraceWindow,
    duration_s: float,
    cfg: CalibrationConfig,
    say: Callable[[str], None],
) -> None:
    """Replay the window as phase ``plan`` while its planned merges run (none in a control
    phase), then wait for its outstanding requests."""
    replayer = run.replayer
    assert replayer is not None  # set before any phase starts
    say(plan.announcement(cfg.repeats, window.trace.num_requests, duration_s))
    origin = begin_phase(
        run, plan.name, plan.repeat, window.trace, window.prompt, window.output, duration_s
    )
    for j, (start, length) in enumerate(plan.merges):
        assert cluster is not None  # started before any phase
        wait_until(run, cfg, server, until=origin + start)
        run_merge(run, cluster, plan, j, origin, start, length, cfg, say)
    wait_until(run, cfg, server, until=origin + duration_s + 5.0, done=lambda: not replayer.sending)
    end_phase(run, plan.name, plan.repeat, server, cfg)


def run_merge(
    run: RunState,
    cluster: MergeCluster,
    plan: PhasePlan,
    j: int,
    origin: float,
    start: float,
    length: float,
    cfg: CalibrationConfig,
    say: Callable[[str], None],
) -> None:
    """Run merge ``j`` of the phase and record its window in ``run.merges``."""
    replayer = run.replayer
    assert replayer is not None
    k = len(run.merges)  # merge ids are unique over the run
    entry: dict = {
        "merge_id": k,
        "repeat": plan.repeat,
        "planned_start_s": origin + start,
        "planned_length_s": length,
    }
    if plan.link_share != 1.0:  # a full-share merge's entry is as in files before shares
        entry.update(phase=plan.name, link_share=plan.link_share)
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
        report = cluster.merge(length, link_share=plan.link_share)
    finally:
        entry["end_s"] = replayer.clear_merge()
        if killer is not None:
            killer.cancel()
        if report is not None:
            entry.update({key: v for key, v in asdict(report).items() if v is not None})
    say(
        f"merge {j + 1}{f'/{len(plan.merges)}' if plan.merges else ''}: "
        f"{entry['start_s'] - origin:5.1f}-"
        f"{entry['end_s'] - origin:5.1f} s, {report.allreduces} all-reduces, "
        f"checkpoint {report.checkpoint_s:.2f} s"
    )


def begin_phase(
    run: RunState,
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
    run.phases[phase_key(name, repeat)] = {
        "name": name,
        "repeat": repeat,
        "origin_s": origin,
        "duration_s": float(duration_s),
    }
    run.current = (name, repeat)
    run.replayer.start_phase(name, win, origin, prompt, output, repeat=repeat)
    return origin


def end_phase(run: RunState, name: str, repeat: int, server: Any, cfg: CalibrationConfig) -> None:
    """Wait for the phase's outstanding requests, record its end, check the server."""
    replayer = run.replayer
    assert replayer is not None  # set before any phase starts
    wait_until(
        run,
        cfg,
        server,
        until=run.clock() + cfg.timeout_s + 2.0,
        done=lambda: replayer.outstanding == 0,
    )
    run.phases[phase_key(name, repeat)]["end_s"] = run.clock()
    check_server(server)


def wait_until(
    run: RunState,
    cfg: CalibrationConfig,
    server: Any,
    until: float,
    done: Callable[[], bool] | None = None,
) -> None:
    """Wait until the run clock reaches ``until`` (or ``done()``), checking every 0.1 s that
    the server lives and the engine is not overloaded."""
    while run.clock() < until and not (done is not None and done()):
        check_server(server)
        check_overload(run, cfg)
        # at most 0.1 s, and no later than ``until``: a merge starts on time to the
        # scheduler's wake-up, not to the check's period
        time.sleep(min(0.1, max(0.0, until - run.clock())))
    check_overload(run, cfg)


def overload_limit(run: RunState, cfg: CalibrationConfig, rate_rps: float) -> int:
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


def check_overload(run: RunState, cfg: CalibrationConfig) -> None:
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


def check_server(server: Any) -> None:
    if server is not None and not server.is_alive():
        tail = server.log_tail() if isinstance(server, EngineProcess) else ""
        raise CalibrationError(
            f"the serving engine (pid {server.pid}) died" + (f": {tail}" if tail else "")
        )
