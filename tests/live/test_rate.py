"""The replay rate of a run (:mod:`diloco_gym.live.rate`): from the probe, from ``--rate``,
or the defaults without a probe."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from diloco_gym.live import rate as rate_mod
from diloco_gym.live.calibrate import (
    CalibrationConfig,
)
from diloco_gym.live.errors import (
    CalibrationError,
)
from diloco_gym.live.probe import ProbeConfig, ProbeResult
from diloco_gym.live.rate import choose_rate
from diloco_gym.live.replay import (
    Endpoint,
)
from diloco_gym.live.state import RunState


@pytest.mark.parametrize(
    ("capacity", "upper", "rate_rps", "builtin", "rate", "source"),
    [
        (8.0, 12.0, None, True, 4.0, "target_utilization x probed capacity"),
        (8.0, float("nan"), 3.0, True, 3.0, "--rate"),
        (float("nan"), float("nan"), 3.0, False, 3.0, "--rate"),
        (float("nan"), float("nan"), None, True, None, None),  # the run stops
    ],
)
def test_choose_rate_from_the_probe(monkeypatch, capacity, upper, rate_rps, builtin, rate, source):
    """The replay rate: ``rate_rps`` when given, else ``target_utilization`` x the probed
    capacity; a probe that sustained nothing stops a run without ``rate_rps``."""

    from diloco_gym.live.replay import Endpoint

    steps = [{"offered_rps": 2.5, "sustainable": False}]
    seen: dict = {}

    def fake_probe(ep, model, prompt, output, idle, timeout_s, cfg, say, stop):
        seen.update(cfg=cfg, idle=idle)
        stop()  # the server check
        return ProbeResult(capacity, upper, 0.2, 0.1, steps, cfg)

    monkeypatch.setattr(rate_mod, "probe_capacity", fake_probe)
    cfg = CalibrationConfig(seed=9, rate_rps=rate_rps, probe=ProbeConfig(step_s=3.0))
    run = RunState(t0=0.0, started_utc="now")
    run.warmup = {"idle_p95_s": 0.2, "idle_mean_s": 0.1}
    lines: list[str] = []
    server = SimpleNamespace(is_alive=lambda: True, pid=1)
    args = (run, Endpoint.parse("http://127.0.0.1:9"), "m", cfg, builtin)
    args += (np.array([4]), np.array([2]), server, lines.append)
    if rate is None:
        with pytest.raises(CalibrationError) as info:
            choose_rate(*args)
        assert str(info.value) == (
            "capacity probe: the engine did not sustain even 2.50 req/s (p95 within 4 x its "
            "idle p95 of 0.20 s): use a smaller model (--engine-model-config), smaller "
            "requests, or --rate"
        )
        return
    assert choose_rate(*args) == rate == run.rate_rps == run.capacity["rate_rps"]
    assert run.capacity["rate_source"] == source and run.stage == "probe"
    assert seen["cfg"] == ProbeConfig(step_s=3.0, seed=9) and seen["idle"] is run.warmup
    assert lines[0] == (
        "capacity probe (merge workers idle): steps of 3 s, rate x1.5 per step, sustainable "
        "while p95 <= 4 x idle p95"
    )
    if math.isfinite(capacity):
        tail = "(12.00 req/s was not)" if math.isfinite(upper) else "(the ramp never saturated it)"
        assert lines[1:] == [f"capacity: 8.00 req/s sustainable {tail}"]
    else:
        assert lines[1:] == []


def test_choose_rate_without_a_probe():
    """No probe: ``rate_rps``, else 2 req/s built in, else the trace's own rate (None)."""

    ep = Endpoint.parse("http://127.0.0.1:9")
    for rate_rps, builtin, rate, source in [
        (5.0, False, 5.0, "--rate"),
        (None, True, 2.0, "built-in default (no probe)"),
        (None, False, None, "the trace's own rate (no probe)"),
    ]:
        run = RunState(t0=0.0, started_utc="now")
        cfg = CalibrationConfig(rate_rps=rate_rps, probe=None)
        assert choose_rate(run, ep, "m", cfg, builtin, None, None, None, print) == rate
        assert run.capacity == {
            "target_utilization": 0.5,
            "rate_source": source,
            "rate_rps": rate,
        }
