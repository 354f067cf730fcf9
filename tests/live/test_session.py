"""A live session (:mod:`diloco_gym.live.session`): one endpoint, its merge workers and one
capacity, kept for many replays with merge plans of the caller's choosing."""

from __future__ import annotations

import time

import numpy as np
import pytest

from diloco_gym.live.errors import CalibrationError
from diloco_gym.live.replay import RequestRecord
from diloco_gym.live.session import LiveSession, PhaseRun, live_session, phase_arrays
from diloco_gym.live.state import RunState

from .helpers import fast_config


def _config():
    return fast_config(rate_rps=None, warmup_requests=0, merge_seconds=0.3, timeout_s=3.0)


def test_a_session_replays_windows_with_the_callers_merges(queue_server):
    url = queue_server(slots=4, service_s=0.01)
    lines: list[str] = []
    with live_session(
        url, ["ordinary", "bursty"], 3.0, _config(), capacity_rps=40.0, progress=lines.append
    ) as s:
        assert s.capacity_rps == 40.0
        assert s.rate_for(0.25) == pytest.approx(10.0)
        win = s.window("bursty", 3.0, s.rate_for(0.25), start_s=0.0)
        control = s.replay(win, "w0:control")
        merged = s.replay(win, "w0:agent", [(0.5, 0.3), (1.8, 0.3)])
    assert isinstance(merged, PhaseRun)
    assert len(control.records) == len(merged.records) == win.trace.num_requests > 0
    assert [r.index for r in merged.records] == list(range(win.trace.num_requests))
    assert merged.planned == [(0.5, 0.3), (1.8, 0.3)] and control.planned == []
    # Two merges ran, each recorded from its command to its last worker's report, in
    # order and inside the phase; a control phase records none.
    assert control.recorded == [] and len(merged.recorded) == 2
    (a0, b0), (a1, b1) = merged.recorded
    assert 0 < a0 < b0 <= a1 < b1
    # The two phases are on one clock: the second began after the first ended.
    assert merged.origin_s > control.origin_s + 3.0
    flagged = [r for r in merged.records if r.merge_active]
    for r in flagged:
        t = r.send_s - merged.origin_s
        assert any(a - 1e-9 <= t <= b + 1e-9 for a, b in merged.recorded)
    arrays = phase_arrays(merged)
    assert arrays["offset_s"].shape == arrays["latency_s"].shape == (len(merged.records),)
    assert arrays["ok"].all()
    assert any("capacity 40 req/s as given" in line for line in lines)


def test_the_engine_is_sized_for_every_source(queue_server, monkeypatch):
    from diloco_gym.live import session as session_mod

    seen = {}

    def connect(job, run, res, window, longest):
        seen["longest"] = longest
        raise CalibrationError("stop here")

    monkeypatch.setattr(session_mod, "connect_external", connect)
    cfg = _config()
    for sources in (["ordinary"], ["ordinary", "bursty"]):
        with pytest.raises(CalibrationError, match="stop here"):
            with live_session("http://127.0.0.1:9", sources, 3.0, cfg, capacity_rps=1.0):
                pass
        seen[tuple(sources)] = seen.pop("longest")
    one, both = seen[("ordinary",)], seen[("ordinary", "bursty")]
    assert both[0] >= one[0] and both[1] >= one[1]


def test_rates_need_a_capacity():
    run = RunState(t0=time.monotonic(), started_utc="now")
    s = LiveSession(job=None, run=run, res=None, url="", model="")  # type: ignore[arg-type]
    with pytest.raises(CalibrationError, match="no probed capacity"):
        s.rate_for(0.5)
    run.capacity = {"capacity_rps": float("nan")}
    assert s.capacity_rps is None


def test_bad_capacity_and_no_source_are_refused():
    with pytest.raises(ValueError, match="capacity_rps must be > 0"):
        with live_session(None, ["ordinary"], 3.0, _config(), capacity_rps=0.0):
            pass
    with pytest.raises(ValueError, match="at least one trace source"):
        with live_session(None, [], 3.0, _config()):
            pass


def test_phase_arrays_keep_failed_and_unsent_requests():
    recs = [
        RequestRecord(0, "p", 10.5, 3, 4, send_s=10.6, latency_s=0.2, status=200, error=""),
        RequestRecord(1, "p", 11.0, 3, 4, send_s=11.1, status=0, error="timed out"),
        RequestRecord(2, "p", 12.0, 3, 4),  # never sent: its scheduled time stands
    ]
    run = PhaseRun("p", 0, 10.0, 3.0, recs)
    a = phase_arrays(run)
    np.testing.assert_allclose(a["offset_s"], [0.6, 1.1, 2.0])
    assert a["ok"].tolist() == [True, False, False]
    assert np.isnan(a["latency_s"][1:]).all()
