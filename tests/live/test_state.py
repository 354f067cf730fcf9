"""The state of one run (:mod:`diloco_gym.live.state`)."""

from __future__ import annotations

import time
from pathlib import Path

from diloco_gym.live.config import CalibrationConfig
from diloco_gym.live.state import Job, RunState


def test_the_run_clock_counts_from_the_start():
    run = RunState(t0=time.monotonic() - 5.0, started_utc="2026-01-01T00:00:00+00:00")
    assert 5.0 <= run.clock() < 6.0
    later = run.clock()
    assert run.clock() >= later  # monotonic
    assert (run.stage, run.error, run.merges, run.replayer) == ("setup", None, [], None)


def test_fresh_states_share_nothing():
    """Each run gets its own lists and dicts (a partial file never mixes two runs)."""
    a, b = RunState(t0=0.0, started_utc="a"), RunState(t0=0.0, started_utc="b")
    a.merges.append({"merge_id": 0})
    a.phases["sync"] = {}
    assert b.merges == [] and b.phases == {}


def test_a_job_without_an_endpoint_is_built_in():
    args = ("sync-heavy", 30.0, "auto", CalibrationConfig(), print, Path("c.json"), Path("p"))
    assert Job(None, *args).builtin and not Job("http://127.0.0.1:8000", *args).builtin
