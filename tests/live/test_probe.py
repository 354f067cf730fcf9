"""The warm-up and the capacity probe (:mod:`diloco_gym.live.probe`)."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest

from diloco_gym.live import probe as probe_mod
from diloco_gym.live.probe import ProbeConfig, probe_capacity, warm_up
from diloco_gym.live.replay import (
    Endpoint,
    RequestRecord,
)


@pytest.mark.slow
def test_probe_steps_lines_and_ramp(monkeypatch):
    """The probe's progress lines, step records and ramp (a failure retried once, then a
    halving of a first rate that never passed, two halvings at most) with a stub replayer
    whose steps pass or fail as scripted."""
    import numpy as np

    from diloco_gym.live.probe import ProbeConfig, probe_capacity
    from diloco_gym.live.replay import Endpoint, RequestRecord

    outcomes = iter(["fail", "fail", "unanswered", "unanswered", "pass", "fail", "fail"])
    drained: list[int] = []

    class Replayer:
        def __init__(self, *args: object) -> None:
            self.kind = next(outcomes)
            self.polls = 0

        @property
        def outstanding(self) -> int:
            self.polls += 1
            drained.append(self.polls)
            return 1 if self.polls < 2 else 0  # one poll with a request outstanding

        def start_phase(self, phase, trace, origin, prompt, output) -> None:
            self.n = trace.prompt_tokens.size

        def snapshot(self) -> list:
            if self.kind == "unanswered":  # sent, never answered
                return [RequestRecord(i, "probe", 0.0, 1, 1, send_s=0.0, status=0,
                                      error="in flight") for i in range(self.n)]  # fmt: skip
            lat = 0.01 if self.kind == "pass" else 0.1  # slow, but in time
            return [
                RequestRecord(
                    i, "probe", 0.0, 1, 1, send_s=0.0, latency_s=lat, status=200, error=""
                )
                for i in range(self.n)
            ]

        def close(self) -> None:
            pass

    monkeypatch.setattr(probe_mod, "OpenLoopReplayer", Replayer)
    lines: list[str] = []
    idle = {"idle_p95_s": 0.01, "idle_mean_s": 0.01}
    cfg = ProbeConfig(step_s=0.05, max_steps=8, growth=2.0, start_rps=80.0, grace_s=0.0)
    stops: list[int] = []
    res = probe_capacity(
        Endpoint.parse("http://127.0.0.1:9"),
        "m",
        np.array([1]),
        np.array([1]),
        idle,
        1.0,
        cfg,
        lines.append,
        stop=lambda: stops.append(1),
    )
    assert lines == [
        "probe step 1: 80.00 req/s offered, 4/4 answered in time, p95 0.10 s (limit 0.04 s): "
        "NOT sustainable",
        "probe step 2: 80.00 req/s offered, 4/4 answered in time, p95 0.10 s (limit 0.04 s): "
        "NOT sustainable",
        "probe step 3: 40.00 req/s offered, 0/2 answered in time, p95 n/a (limit 0.04 s): "
        "NOT sustainable",
        "probe step 4: 40.00 req/s offered, 0/2 answered in time, p95 n/a (limit 0.04 s): "
        "NOT sustainable",
        "probe step 5: 20.00 req/s offered, 1/1 answered in time, p95 0.01 s (limit 0.04 s): "
        "sustainable",
        "probe step 6: 40.00 req/s offered, 2/2 answered in time, p95 0.10 s (limit 0.04 s): "
        "NOT sustainable",
        "probe step 7: 40.00 req/s offered, 2/2 answered in time, p95 0.10 s (limit 0.04 s): "
        "NOT sustainable",
    ]
    assert res.capacity_rps == 20.0 and res.upper_rps == 40.0
    assert res.steps[2] == {
        "offered_rps": 40.0,
        "requests": 2,
        "sent": 2,
        "ok_in_time": 0,
        "throughput_rps": 0.0,
        "completed_fraction": 0.0,
        "p95_s": None,
        "p95_limit_s": 0.04,
        "sustainable": False,
    }
    assert res.steps[4]["throughput_rps"] == 20.0 and res.steps[4]["completed_fraction"] == 1.0
    assert drained.count(1) == 7 and stops  # every step drained, stop() polled


@pytest.mark.slow
def test_probe_finds_a_known_capacity(queue_server):
    """Four slots of 0.2 s: capacity 20 req/s. The ramp's capacity (its highest sustainable
    step) lies within two growth steps below and 20 % above it (a short step just above
    capacity builds only a short queue); the step above it is not sustainable. The service
    time is long next to the thread-scheduling jitter of a loaded 2-core host."""
    url = queue_server(slots=4, service_s=0.2)
    ep = Endpoint.parse(url)
    idle = warm_up(ep, "queue-model", (8, 4), (8, 4), 5.0, long_requests=1, idle_requests=3)
    assert 0.19 <= idle["idle_p95_s"] < 0.6
    cfg = ProbeConfig(step_s=2.0, growth=1.4, start_rps=6.0, max_steps=8, p95_factor=4.0)
    result = probe_capacity(ep, "queue-model", np.array([8]), np.array([4]), idle, 5.0, cfg)
    assert 20.0 / 1.4 / 1.4 <= result.capacity_rps <= 20.0 * 1.2, result.steps
    assert np.isfinite(result.upper_rps) and result.upper_rps > result.capacity_rps
    # The ramp ends with a confirmed failure (twice at the same rate), and every lower rate
    # passed (perhaps on its second try: a single failure can be a transient).
    last = result.steps[-1]
    assert last["sustainable"] is False
    at_last = [s for s in result.steps if s["offered_rps"] == pytest.approx(last["offered_rps"])]
    assert [s["sustainable"] for s in at_last] == [False, False]
    lower = {
        round(s["offered_rps"], 6)
        for s in result.steps
        if s["offered_rps"] < last["offered_rps"] - 1e-9
    }
    assert all(
        any(s["sustainable"] for s in result.steps if round(s["offered_rps"], 6) == r)
        for r in lower
    )


def test_warm_up_sends_concurrent_bursts_before_timing_idle_requests(queue_server):
    url = queue_server(slots=4, service_s=0.2)
    t0 = time.monotonic()
    out = warm_up(
        Endpoint.parse(url),
        "queue-model",
        (16, 8),
        (8, 4),
        5.0,
        long_requests=1,
        idle_requests=2,
        burst=4,
    )
    # 1 + 2 x 4 (concurrent: each burst takes one service time) + 2, one at a time
    assert len(out["longest_s"]) == 1 and len(out["burst_s"]) == 8 and len(out["idle_s"]) == 2
    assert time.monotonic() - t0 < 0.2 * (1 + 2 + 2) + 1.5  # not 11 sequential services
    assert out["idle_p95_s"] >= 0.19


def test_probe_upper_bound_ignores_an_early_transient_failure(monkeypatch):
    """A cold first step that fails, then a ramp that never fails: capacity is the last
    step and there is no upper bound (not the cold step's rate)."""

    outcomes = iter([False, True, True, True, False, False])

    class FakeReplayer:
        outstanding = 0

        def __init__(self, *args: object) -> None:
            self.ok = next(outcomes)

        def start_phase(self, phase, trace, origin, prompt, output) -> None:
            self.n = trace.prompt_tokens.size

        def snapshot(self) -> list:

            lat = 0.01 if self.ok else 99.0
            return [
                RequestRecord(
                    i, "probe", 0.0, 1, 1, send_s=0.0, latency_s=lat, status=200, error=""
                )
                for i in range(self.n)
            ]

        def close(self) -> None:
            pass

    monkeypatch.setattr(probe_mod, "OpenLoopReplayer", FakeReplayer)
    idle = {"idle_p95_s": 0.01, "idle_mean_s": 0.01}
    cfg = ProbeConfig(step_s=0.05, max_steps=3, growth=2.0, start_rps=100.0, grace_s=0.0)
    res = probe_capacity(
        Endpoint.parse("http://127.0.0.1:9"), "m", np.array([1]), np.array([1]), idle, 1.0, cfg
    )
    assert [s["sustainable"] for s in res.steps] == [False, True, True]
    # 100 fails, 100 again (a transient?) passes, then 200 passes
    assert [s["offered_rps"] for s in res.steps] == pytest.approx([100.0, 100.0, 200.0])
    assert res.capacity_rps == pytest.approx(200.0)
    assert np.isnan(res.upper_rps)
    # two failures in a row at a rate end the ramp there
    res = probe_capacity(
        Endpoint.parse("http://127.0.0.1:9"),
        "m",
        np.array([1]),
        np.array([1]),
        idle,
        1.0,
        replace(cfg, max_steps=5, start_rps=50.0),
    )
    assert [s["offered_rps"] for s in res.steps] == pytest.approx([50.0, 100.0, 100.0])
