"""The measured phases and their guards (:mod:`diloco_gym.live.phases`): the overload
stop (a stalling engine, timeouts), the grace that lets a merge backlog drain, and the
limit."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from diloco_gym.live.calibrate import (
    CalibrationConfig,
    partial_path,
    run_calibration,
)
from diloco_gym.live.errors import (
    CalibrationError,
)
from diloco_gym.live.merges import MergeReport
from diloco_gym.live.state import RunState

from .helpers import (
    stub_config,
)

pytest.importorskip("torch")


@pytest.mark.slow
def test_overload_stop_on_a_stalling_engine(tmp_path, queue_server):
    """An engine that stops answering: in-flight requests pile up and the run stops within
    a few seconds (not after the 20 s window and every timeout) with a clear message and a
    partial file."""
    url = queue_server(slots=2, service_s=0.01, stall_after=4)  # warm-up passes, then stalls
    out = tmp_path / "o.json"
    began: list[float] = []

    def progress(line: str) -> None:
        if line.startswith("sync phase") and not began:
            began.append(time.monotonic())

    with pytest.raises(CalibrationError, match="overload: .* requests in flight") as info:
        run_calibration(
            url,
            "sync-heavy",
            20.0,
            out,
            progress=progress,
            config=stub_config(overload_inflight=6, timeout_s=30.0),
        )
    assert began and time.monotonic() - began[0] < 8.0  # 8 req/s: 6 in flight within ~1 s
    assert "--target-utilization" in str(info.value) or "--rate" in str(info.value)
    assert not out.exists()
    doc = json.loads(partial_path(out).read_text())
    assert doc["complete"] is False and doc["error"].startswith("overload")
    assert info.value.path == str(partial_path(out))


@pytest.mark.slow
def test_overload_stop_on_timeouts(tmp_path, queue_server):
    url = queue_server(slots=1, service_s=0.01, stall_after=4)
    out = tmp_path / "t.json"
    began: list[float] = []

    def progress(line: str) -> None:
        if line.startswith("sync phase") and not began:
            began.append(time.monotonic())

    with pytest.raises(CalibrationError, match="overload: .* timed out"):
        run_calibration(
            url,
            "sync-heavy",
            20.0,
            out,
            progress=progress,
            config=stub_config(overload_inflight=1000, timeout_s=0.5, rate_rps=4.0),
        )
    assert began and time.monotonic() - began[0] < 8.0
    assert json.loads(partial_path(out).read_text())["error"].startswith("overload")


def test_overload_grace_lets_a_merge_backlog_drain():
    """A backlog above the limit that drains within the grace (a merge stalled the engine)
    does not stop the run; one that stays above it for longer, or exceeds 4x the limit,
    does."""
    from diloco_gym.live.phases import check_overload

    class Fake:
        outstanding = 0

        def counts(self, *args: object) -> dict:
            return {"timeouts": 0, "done": 0}

    now = [0.0]
    run = RunState(t0=0.0, started_utc="")
    run.clock = lambda: now[0]
    run.replayer, run.current, run.overload_limit = Fake(), ("sync", 0), 10
    cfg = CalibrationConfig(merge_seconds=4.0)  # grace max(10, 8) = 10 s

    def at(t: float, outstanding: int) -> None:
        now[0] = t
        run.replayer.outstanding = outstanding
        check_overload(run, cfg)

    at(0.0, 20)
    at(8.0, 30)  # above the limit for 8 s: within the grace
    at(9.0, 5)  # drained: the clock restarts
    at(15.0, 20)
    at(24.0, 20)
    with pytest.raises(CalibrationError, match="above the limit 10 for 11 s"):
        at(26.0, 20)
    run.over_since = None
    with pytest.raises(CalibrationError, match="more than 4 x the limit 10"):
        at(30.0, 41)


def test_overload_limit_allows_a_merge_backlog():
    from diloco_gym.live.phases import overload_limit

    run = RunState(t0=0.0, started_utc="")
    cfg = CalibrationConfig(merge_seconds=4.0)
    assert overload_limit(run, cfg, 1.0) == 64  # no probe
    run.capacity = {
        "probe": {
            "steps": [{"sustainable": True, "p95_s": 0.2}, {"sustainable": False, "p95_s": None}]
        }
    }
    assert overload_limit(run, cfg, 1.0) == 16  # floor
    assert overload_limit(run, cfg, 5.0) == 40  # 2 x 5 req/s x 4 s of merge
    assert overload_limit(run, CalibrationConfig(merge_seconds=0.5), 50.0) == 50  # 4 x 50 x 0.2
    assert overload_limit(run, CalibrationConfig(overload_inflight=7), 50.0) == 7


# --------------------------------------------------------------------------- the plan


def test_phase_plans_follow_the_order_and_carry_the_merges():
    from diloco_gym.live.phases import PhasePlan, phase_plans

    run = RunState(t0=0.0, started_utc="now")
    run.plan = [(1.0, 2.0), (5.0, 2.0)]
    run.order = [("control", 0), ("sync", 0), ("sync@0.25", 0)]
    plans = phase_plans(run)
    assert plans == [
        PhasePlan("control", 0),
        PhasePlan("sync", 0, ((1.0, 2.0), (5.0, 2.0)), 1.0),
        PhasePlan("sync@0.25", 0, ((1.0, 2.0), (5.0, 2.0)), 0.25),
    ]
    assert plans[0].announcement(3, 40, 30.0) == (
        "control phase 1/3 (no merges): 30 s, 40 requests"
    )
    assert plans[1].announcement(3, 40, 30.0) == "sync phase 1/3: 30 s, 40 requests, 2 merges"
    assert plans[2].announcement(3, 40, 30.0) == (
        "sync phase at link share 0.25 1/3: 30 s, 40 requests, 2 merges"
    )


def test_one_phase_function_runs_a_sync_and_a_control_phase():
    """``run_phase`` with a stand-in replayer and cluster: the sync plan's merges run at its
    share and are recorded (a throttled one with its phase and share), the control plan runs
    none; both record the phase's origin and end."""
    from types import SimpleNamespace

    from diloco_gym.live.phases import PhasePlan, run_phase
    from diloco_gym.live.state import TraceWindow
    from diloco_gym.sim.traces import Trace

    calls: list = []

    class Replayer:
        sending, outstanding = False, 0
        state = SimpleNamespace(merge_id=-1)

        def start_phase(self, name, win, origin, prompt, output, repeat=0):
            calls.append(("phase", name, repeat))

        def set_merge(self, k):
            return run.clock()

        def clear_merge(self):
            return run.clock() + 0.5

        def counts(self, *a):
            return {"timeouts": 0, "done": 0}

    class Cluster:
        def merge(self, window_s, link_share=1.0):
            calls.append(("merge", window_s, link_share))
            return MergeReport(
                len(calls), allreduces=2, achieved_share=None if link_share == 1 else 0.3
            )

    run = RunState(t0=time.monotonic(), started_utc="now")
    run.replayer = Replayer()  # type: ignore[assignment]
    trace = Trace(np.array([0.0]), np.array([4]), np.array([2]), 1.0)
    win = TraceWindow(trace, np.array([4]), np.array([2]))
    cfg = CalibrationConfig(timeout_s=1.0, repeats=1)
    lines: list[str] = []
    run_phase(
        run,
        PhasePlan("sync@0.5", 0, ((0.0, 0.1),), 0.5),
        Cluster(),
        None,
        win,
        0.1,
        cfg,
        lines.append,
    )
    run_phase(run, PhasePlan("control", 0), None, None, win, 0.1, cfg, lines.append)
    assert calls == [("phase", "sync@0.5", 0), ("merge", 0.1, 0.5), ("phase", "control", 0)]
    (entry,) = run.merges
    assert (entry["phase"], entry["link_share"], entry["achieved_share"]) == ("sync@0.5", 0.5, 0.3)
    assert set(run.phases) == {"sync@0.5", "control"}
    assert all("end_s" in p for p in run.phases.values())
    assert lines[0] == "sync phase at link share 0.5 1/1: 0.1 s, 1 requests, 1 merges"
    assert lines[-1] == "control phase 1/1 (no merges): 0.1 s, 1 requests"
