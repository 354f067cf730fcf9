"""The scheduler in the loop of a live replay (:mod:`diloco_gym.live.closed_loop`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from diloco_gym.agents.registry import make_agent
from diloco_gym.deploy import Controller
from diloco_gym.envs.params import EnvParams
from diloco_gym.live.closed_loop import replay_closed_loop
from diloco_gym.live.session import live_session
from diloco_gym.sim.learners import LearnerParams

from .helpers import fast_config

#: The env's clock 20x as fast: decisions every 56 ms, merges of 0.4 s, H_min 0.9 s.
FAST = replace(EnvParams(), step_seconds=0.007, merge_seconds=0.4)


def test_the_controller_decides_live_and_its_merges_run(queue_server, monkeypatch):
    url = queue_server(slots=4, service_s=0.01)
    seen: list[int] = []
    step = Controller.step

    def spy(self, telemetry):
        seen.append(telemetry.requests)
        return step(self, telemetry)

    monkeypatch.setattr(Controller, "step", spy)
    cfg = fast_config(rate_rps=None, warmup_requests=0, timeout_s=3.0)
    with live_session(url, ["bursty"], 4.0, cfg, capacity_rps=40.0, progress=None) as s:
        win = s.window("bursty", 4.0, 10.0, start_s=0.0)
        loop = replay_closed_loop(
            s,
            win,
            "w0:closed-loop",
            make_agent("fixed-256"),
            params=FAST,
            learners=LearnerParams(),
            serving_capacity_rps=20.0,
            decisions=50,
        )
    # fixed-256 merges every 256 steps = 32 decisions, whatever the traffic: one merge,
    # at decision 32, launched at its decision time and recorded as it ran.
    assert loop.merged.tolist() == [1 if d == 32 else 0 for d in range(50)]
    assert loop.starts_s == [32 * FAST.decision_seconds]
    assert loop.phase.planned == [(32 * FAST.decision_seconds, FAST.merge_steps * 0.007)]
    assert len(loop.phase.recorded) == 1
    assert loop.forced.sum() == 0
    # The telemetry of decision d is the sends since the decision before it, from the
    # phase's own records: causal (nothing sent after the decision read it) and complete
    # (every send before the previous read is in by now), each send counted once.
    assert len(seen) == 50 and seen[0] == 0 and seen == loop.requests.tolist()
    send = np.array([r.send_s for r in loop.phase.records]) - loop.phase.origin_s
    cum = np.cumsum(seen)
    for d in range(1, 50):
        assert cum[d] <= np.count_nonzero(send <= loop.read_s[d])
        assert cum[d] >= np.count_nonzero(send < loop.read_s[d - 1])
    assert np.all(np.diff(loop.read_s) > 0)
    assert cum[-1] > 0
